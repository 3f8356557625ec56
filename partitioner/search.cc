// Phase 3: the exact search over contiguous stage assignments (see partitioner.h for the
// objective), its verification against the memory planner, --stages auto, and the diagnosis of
// plans that cannot fit.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "frontend/ir/status.h"
#include "partitioner/partitioner.h"

namespace onnxpipe::partitioner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// With one micro-batch (no pipelining) splits within this fraction of the fastest count as ties.
constexpr double kSequentialSlack = 0.02;

// Prefix sums over units: Range(i, j) = sum of units [i, j).
template <typename T>
struct Prefix {
  std::vector<T> s;
  explicit Prefix(const std::vector<T>& v) : s(v.size() + 1, T{}) {
    for (size_t i = 0; i < v.size(); ++i) s[i + 1] = s[i] + v[i];
  }
  T Range(int32_t i, int32_t j) const { return s[j] - s[i]; }
};

// One recompute move of auto: unit `unit` from choice `from` to `to`, keeping `bytes` fewer
// per micro-batch for `seconds` more recompute.
struct Move {
  int32_t unit;
  UnitRecompute from, to;
  int64_t bytes;
  double seconds;
  double efficiency;
  int order;
};

// The planner's numbers for one stage range and recompute choice (independent of the stage's
// index: only the in-flight count multiplies `saved`).
struct ExactStage {
  // total - activations with one micro-batch in flight, and with more (the layout then gives each
  // in-flight micro-batch its own saved slot, which changes the transient part; microbatch_layout.h)
  int64_t fixed = 0, fixed_split = 0;
  int64_t saved = 0;
  double forward_s = 0, backward_s = 0, recompute_s = 0, optimizer_s = 0;
  int64_t Total(int64_t in_flight) const { return (in_flight > 1 ? fixed_split : fixed) + in_flight * saved; }
};

struct DpResult {
  bool feasible = false;
  double sum = 0;  // stage costs plus transfers
  double max = 0;  // largest stage cost
  std::vector<std::pair<int32_t, int32_t>> ranges;
};

class Searcher {
 public:
  Searcher(const PartitionContext& ctx, const PartitionOptions& o, int32_t K, RecomputePolicy policy,
           SearchStats* stats)
      : ctx_(ctx), a_(ctx.analysis()), t_(ctx.units()), o_(o), K_(K), U_(a_.num_units()),
        policy_(policy), stats_(stats), F_(t_.forward_s), B_(t_.backward_s),
        P_(Persistent()), Rfull_(t_.full_recompute_s),
        R_{Prefix<double>(t_.recompute_s[0]), Prefix<double>(t_.recompute_s[1]), Prefix<double>(t_.recompute_s[2])},
        S_{Prefix<int64_t>(t_.saved[0]), Prefix<int64_t>(t_.saved[1]), Prefix<int64_t>(t_.saved[2])},
        Remat_(t_.rematerialised[2]) {
    const DeviceProfile& d = ctx.cluster().device;
    capacity_ = (o.memory_bytes > 0 ? o.memory_bytes : d.memory_bytes) - d.reserved_bytes;
    if (policy_ == RecomputePolicy::kAuto) BuildMoves();
  }

  int64_t capacity() const { return capacity_; }

  // The best assignment that fits by the planner's numbers, or nullopt.
  absl::StatusOr<std::optional<StageAssignment>> Run();

  // Simulated step of an assignment by the planner's numbers; nullopt when a stage does not fit
  // (or cannot by the lower bounds). Fills the per-unit choice for auto.
  absl::StatusOr<std::optional<double>> Simulate(const std::vector<std::pair<int32_t, int32_t>>& ranges,
                                                 StageAssignment* as);
  // The same from the unit table alone (no planner): a quick filter for Refine.
  std::optional<double> SimulateEstimate(const std::vector<std::pair<int32_t, int32_t>>& ranges) const;
  // Moves single cuts by one unit while the simulated step improves (the objective is exact for
  // the analytic step; 1F1B with uneven stages can still gain a little in the simulation).
  absl::Status Refine(StageAssignment* as, double* step);

  // Lower-bound feasibility only (no planner): false means K stages cannot fit.
  bool MayFit() {
    BuildCosts();
    return Dp(kInf).feasible;
  }

  // The split minimising the largest stage memory (by the lower bounds) and its stages' memory by
  // the planner; for messages about plans that do not fit.
  absl::StatusOr<int64_t> SmallestPeakMemory();

  double Comm(int32_t i) const { return i > 0 ? t_.send_forward_s[i] + t_.send_backward_s[i] : 0.0; }

 private:
  std::vector<int64_t> Persistent() const {
    std::vector<int64_t> v(U_);
    for (int32_t u = 0; u < U_; ++u) {
      v[u] = t_.parameters[u] + t_.gradients[u] + t_.optimizer_state[u] + t_.constants[u];
    }
    return v;
  }
  int64_t InFlight(int32_t k) const { return InFlightMicrobatches(o_.schedule, K_, k, o_.microbatches); }
  int64_t Boundary(int32_t i, int32_t j) const {
    return t_.in_forward[i] + t_.out_backward[i] + t_.out_forward[j] + t_.in_backward[j];
  }
  void BuildMoves();
  // Lower bound of the stage's memory and its cost in seconds per micro-batch (kInf: cannot fit).
  double SegmentCost(int32_t i, int32_t j, int32_t k, std::vector<UnitRecompute>* choice,
                     int64_t* memory_out = nullptr) const;
  void BuildCosts();
  DpResult Dp(double bound);
  std::string ChoiceKey(int32_t i, int32_t j, const std::vector<UnitRecompute>& choice) const;
  absl::StatusOr<const ExactStage*> Exact(int32_t i, int32_t j, const std::vector<UnitRecompute>& choice);
  std::vector<UnitRecompute> ChoiceFor(int32_t i, int32_t j, int32_t k) const {
    std::vector<UnitRecompute> c;
    SegmentCost(i, j, k, &c);
    return c;
  }

  const PartitionContext& ctx_;
  const GraphAnalysis& a_;
  const UnitTable& t_;
  const PartitionOptions& o_;
  const int32_t K_, U_;
  const RecomputePolicy policy_;
  SearchStats* stats_;
  Prefix<double> F_, B_;
  Prefix<int64_t> P_;
  Prefix<double> Rfull_;
  Prefix<double> R_[3];
  Prefix<int64_t> S_[3];
  Prefix<int64_t> Remat_;
  int64_t capacity_ = 0;
  std::vector<Move> moves_;
  std::vector<double> cost_;  // [k][i][j]
  std::map<std::string, ExactStage> exact_;
  std::map<std::pair<int32_t, int32_t>, int64_t> margin_;  // auto: planner minus estimate seen
  size_t Index(int32_t k, int32_t i, int32_t j) const {
    return (static_cast<size_t>(k) * (U_ + 1) + i) * (U_ + 1) + j;
  }
};

void Searcher::BuildMoves() {
  // Per unit the lower convex hull of (recompute seconds, kept bytes) over none, selective,
  // unit; moves along it in decreasing bytes-per-second, so the greedy applies a unit's moves in
  // order and the cheapest recompute per byte saved first.
  int order = 0;
  for (int32_t u = 0; u < U_; ++u) {
    struct Opt {
      UnitRecompute c;
      double s;
      int64_t bytes;
    };
    std::vector<Opt> opts = {{UnitRecompute::kNone, 0.0, t_.saved[0][u]},
                             {UnitRecompute::kSelective, t_.recompute_s[1][u], t_.saved[1][u]},
                             {UnitRecompute::kUnit, t_.recompute_s[2][u], t_.saved[2][u]}};
    Opt cur = opts[0];
    while (true) {
      double best_eff = -1;
      int best = -1;
      for (int c = static_cast<int>(cur.c) + 1; c < 3; ++c) {
        const int64_t db = cur.bytes - opts[c].bytes;
        const double ds = opts[c].s - cur.s;
        if (db <= 0) continue;
        const double eff = ds <= 0 ? kInf : static_cast<double>(db) / ds;
        if (eff > best_eff || (eff == best_eff && c > best)) {
          best_eff = eff;
          best = c;
        }
      }
      if (best < 0) break;
      moves_.push_back({u, cur.c, opts[best].c, cur.bytes - opts[best].bytes,
                        std::max(0.0, opts[best].s - cur.s), best_eff, order++});
      cur = opts[best];
    }
  }
  std::stable_sort(moves_.begin(), moves_.end(), [](const Move& x, const Move& y) {
    if (x.efficiency != y.efficiency) return x.efficiency > y.efficiency;
    return x.order < y.order;
  });
}

double Searcher::SegmentCost(int32_t i, int32_t j, int32_t k, std::vector<UnitRecompute>* choice,
                             int64_t* memory_out) const {
  const int64_t n = InFlight(k);
  const int64_t base = P_.Range(i, j) + Boundary(i, j) + t_.in_backward[j];
  const double fb = F_.Range(i, j) + B_.Range(i, j);
  auto fits = [&](int64_t mem) {
    if (memory_out) *memory_out = mem;
    return mem <= capacity_;
  };
  auto fixed_choice = [&](UnitRecompute c) {
    if (choice) choice->assign(j - i, c);
  };
  if (policy_ != RecomputePolicy::kAuto) {
    UnitRecompute c = UnitRecompute::kNone;
    if (policy_ == RecomputePolicy::kSelective) c = UnitRecompute::kSelective;
    if (policy_ == RecomputePolicy::kFull) c = UnitRecompute::kStage;
    fixed_choice(c);
    std::vector<UnitRecompute> key_choice(j - i, c);
    if (auto it = exact_.find(ChoiceKey(i, j, key_choice)); it != exact_.end()) {
      const ExactStage& e = it->second;
      return fits(e.Total(n)) ? e.forward_s + e.backward_s + e.recompute_s : kInf;
    }
    switch (policy_) {
      case RecomputePolicy::kNone:
        return fits(base + n * S_[0].Range(i, j)) ? fb : kInf;
      case RecomputePolicy::kSelective:
        return fits(base + n * S_[1].Range(i, j) + t_.rematerialised[1][j - 1]) ? fb + R_[1].Range(i, j) : kInf;
      default:
        return fits(base + n * t_.in_forward[i] + Remat_.Range(i, j)) ? fb + Rfull_.Range(i, j) : kInf;
    }
  }
  // auto
  int64_t margin = 0;
  if (auto it = margin_.find({i, j}); it != margin_.end()) margin = it->second;
  const int64_t start = base + margin + n * S_[0].Range(i, j);
  if (fits(start)) {
    fixed_choice(UnitRecompute::kNone);
    return fb;
  }
  // Cheapest per-unit recompute that fits, else the whole stage.
  const int64_t most = base + margin + n * S_[2].Range(i, j);
  if (!fits(most)) {
    if (fits(base + margin + n * t_.in_forward[i] + Remat_.Range(i, j))) {
      fixed_choice(UnitRecompute::kStage);
      return fb + Rfull_.Range(i, j);
    }
    return kInf;
  }
  std::vector<UnitRecompute> cur(j - i, UnitRecompute::kNone);
  int64_t kept = S_[0].Range(i, j), remat_max = 0;
  double rec = 0;
  for (const Move& m : moves_) {
    if (m.unit < i || m.unit >= j || cur[m.unit - i] != m.from) continue;
    cur[m.unit - i] = m.to;
    kept -= m.bytes;
    rec += m.seconds;
    remat_max = std::max(remat_max, t_.rematerialised[static_cast<int>(m.to)][m.unit]);
    if (fits(base + margin + n * kept + remat_max)) {
      if (choice) *choice = cur;
      return fb + rec;
    }
  }
  if (choice) *choice = cur;
  return kInf;  // (unreachable: `most` fits)
}

void Searcher::BuildCosts() {
  if (!cost_.empty()) return;
  cost_.assign(static_cast<size_t>(K_) * (U_ + 1) * (U_ + 1), kInf);
  for (int32_t k = 0; k < K_; ++k) {
    for (int32_t i = k; i <= U_ - (K_ - k); ++i) {
      for (int32_t j = i + 1; j <= U_ - (K_ - 1 - k); ++j) {
        cost_[Index(k, i, j)] = SegmentCost(i, j, k, nullptr);
      }
    }
  }
}

DpResult Searcher::Dp(double bound) {
  ++stats_->dp_runs;
  std::vector<double> best((K_ + 1) * (U_ + 1), kInf), worst((K_ + 1) * (U_ + 1), 0);
  std::vector<int32_t> from((K_ + 1) * (U_ + 1), -1);
  auto at = [&](int32_t k, int32_t j) { return static_cast<size_t>(k) * (U_ + 1) + j; };
  best[at(0, 0)] = 0;
  for (int32_t k = 1; k <= K_; ++k) {
    for (int32_t j = k; j <= U_ - (K_ - k); ++j) {
      double b = kInf, w = 0;
      int32_t arg = -1;
      for (int32_t i = k - 1; i < j; ++i) {
        const double prev = best[at(k - 1, i)];
        if (prev == kInf) continue;
        const double c = cost_[Index(k - 1, i, j)];
        if (c > bound) continue;
        const double v = prev + c + Comm(i);
        // Ties: the smaller bottleneck.
        const double wv = std::max(worst[at(k - 1, i)], c);
        if (v < b - 1e-15 || (std::fabs(v - b) <= 1e-15 && wv < w)) {
          b = v;
          w = wv;
          arg = i;
        }
      }
      best[at(k, j)] = b;
      worst[at(k, j)] = w;
      from[at(k, j)] = arg;
    }
  }
  DpResult r;
  if (best[at(K_, U_)] == kInf) return r;
  r.feasible = true;
  r.sum = best[at(K_, U_)];
  r.max = worst[at(K_, U_)];
  int32_t j = U_;
  for (int32_t k = K_; k >= 1; --k) {
    const int32_t i = from[at(k, j)];
    r.ranges.push_back({i, j});
    j = i;
  }
  std::reverse(r.ranges.begin(), r.ranges.end());
  return r;
}

std::string Searcher::ChoiceKey(int32_t i, int32_t j, const std::vector<UnitRecompute>& choice) const {
  std::string key = std::to_string(i) + ":" + std::to_string(j) + ":";
  for (UnitRecompute c : choice) key += static_cast<char>('0' + static_cast<int>(c));
  return key;
}

absl::StatusOr<const ExactStage*> Searcher::Exact(int32_t i, int32_t j,
                                                  const std::vector<UnitRecompute>& choice) {
  const std::string key = ChoiceKey(i, j, choice);
  if (auto it = exact_.find(key); it != exact_.end()) return &it->second;
  const bool stage_full = !choice.empty() && choice[0] == UnitRecompute::kStage;
  const std::vector<bool> rec = RecomputeSet(a_, i, j, stage_full, choice);
  // The stage's program within a split into (at most) three: before it, it, after it.
  const int32_t p0 = a_.unit_begin[i], p1 = a_.unit_begin[j];
  std::vector<int32_t> bounds = {0};
  if (p0 > 0) bounds.push_back(p0);
  bounds.push_back(p1);
  if (p1 < a_.num_positions()) bounds.push_back(a_.num_positions());
  const std::vector<StageNodes> placement = PlaceStages(a_, bounds, rec);
  const int32_t k = p0 > 0 ? 1 : 0;
  ASSIGN_OR_RETURN(const StageProgram sp, BuildStageProgram(a_, placement, k));
  ASSIGN_OR_RETURN(StageMemory m, PlanStageMemory(a_, sp, /*in_flight=*/1, o_.microbatches, ctx_.alignment(), o_.workspace));
  ++stats_->stages_planned;
  ExactStage e;
  e.saved = m.saved;
  e.fixed = e.fixed_split = m.total - m.activations;
  if (o_.microbatches > 1) {
    ASSIGN_OR_RETURN(StageMemory m2, PlanStageMemory(a_, sp, /*in_flight=*/2, o_.microbatches, ctx_.alignment(), o_.workspace));
    RET_CHECK(m2.saved == m.saved) << "the saved bytes depend on the in-flight count";
    e.fixed_split = m2.total - m2.activations;
  }
  const std::vector<double>& sec = ctx_.node_seconds();
  for (ir::NodeId id : placement[k].forward) e.forward_s += sec[id];
  for (ir::NodeId id : placement[k].backward) e.backward_s += sec[id];
  for (ir::NodeId id : placement[k].post) e.optimizer_s += sec[id];
  for (const RecomputeRegion& r : sp.regions)
    for (ir::NodeId id : r.nodes) e.recompute_s += sec[id];
  return &exact_.emplace(key, e).first->second;
}

absl::StatusOr<std::optional<StageAssignment>> Searcher::Run() {
  std::optional<StageAssignment> best_fit;
  double best_fit_step = kInf;
  for (int round = 0; round < o_.max_verify_rounds; ++round) {
    ++stats_->verify_rounds;
    cost_.clear();
    BuildCosts();
    const DpResult unbounded = Dp(kInf);
    if (!unbounded.feasible) return best_fit;
    // Candidates: the Pareto front of (sum, bottleneck) up to where no better T can remain.
    const double m1 = static_cast<double>(o_.microbatches - 1);
    std::vector<DpResult> candidates = {unbounded};
    double best_obj = unbounded.sum + m1 * unbounded.max;
    std::vector<double> values;
    for (double c : cost_)
      if (c != kInf) values.push_back(c);
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());
    // The smallest bottleneck for which `accept` holds (it is monotone in the bound).
    auto smallest = [&](const std::function<bool(const DpResult&)>& accept) {
      size_t lo = 0, hi = values.size() - 1;  // values[hi] >= unbounded.max: DP(values[hi]) = unbounded
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (accept(Dp(values[mid]))) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return lo;
    };
    if (o_.microbatches == 1) {
      // No pipelining: the splits differ only in their transfers, a fraction of a percent; take
      // the most balanced one within kSequentialSlack of the fastest (memory and work spread).
      const size_t idx = smallest([&](const DpResult& r) {
        return r.feasible && r.sum <= unbounded.sum * (1 + kSequentialSlack);
      });
      DpResult r = Dp(values[idx]);
      if (r.ranges != unbounded.ranges) candidates.insert(candidates.begin(), r);
    } else {
      const size_t lo = smallest([](const DpResult& r) { return r.feasible; });
      for (size_t idx = lo; idx < values.size(); ++idx) {
        const double bound = values[idx];
        if (m1 * bound + unbounded.sum >= best_obj * (1 - 1e-12)) break;
        ++stats_->bottlenecks_tried;
        DpResult r = Dp(bound);
        if (!r.feasible) continue;
        const double obj = r.sum + m1 * r.max;
        bool seen = false;
        for (const DpResult& c : candidates) seen |= c.ranges == r.ranges;
        if (!seen) candidates.push_back(r);
        best_obj = std::min(best_obj, obj);
      }
    }
    stats_->pareto_candidates += static_cast<int64_t>(candidates.size());

    // Verify every candidate with the planner; learn from the stages that do not fit.
    bool all_fit = true;
    std::optional<StageAssignment> round_best;
    double round_best_step = kInf, round_best_obj = kInf, round_best_max = kInf;
    for (const DpResult& c : candidates) {
      StageAssignment as;
      as.ranges = c.ranges;
      if (policy_ == RecomputePolicy::kAuto) as.unit_choice.assign(U_, UnitRecompute::kNone);
      std::vector<StageTiming> timing;
      bool fits = true;
      double sum_p = 0, max_p = 0, comm = 0;
      for (int32_t k = 0; k < K_; ++k) {
        const auto [i, j] = c.ranges[k];
        std::vector<UnitRecompute> choice;
        int64_t estimate = 0;
        SegmentCost(i, j, k, &choice, &estimate);
        if (policy_ == RecomputePolicy::kAuto) std::copy(choice.begin(), choice.end(), as.unit_choice.begin() + i);
        ASSIGN_OR_RETURN(const ExactStage* e, Exact(i, j, choice));
        const int64_t total = e->Total(InFlight(k));
        if (total > capacity_) {
          fits = false;
          if (policy_ == RecomputePolicy::kAuto) {
            int64_t& m = margin_[{i, j}];
            m = std::max(m, m + (total - estimate) + 1);
          }
        }
        timing.push_back({e->forward_s, e->backward_s + e->recompute_s, e->optimizer_s,
                          k + 1 < K_ ? t_.send_forward_s[j] : 0.0, k > 0 ? t_.send_backward_s[i] : 0.0});
        const double p = e->forward_s + e->backward_s + e->recompute_s;
        sum_p += p;
        max_p = std::max(max_p, p);
        comm += Comm(i);
      }
      if (!fits) {
        all_fit = false;
        continue;
      }
      const double step = SimulateSchedule(o_.schedule, timing, o_.microbatches).step_s;
      const double obj = sum_p + m1 * max_p + comm;
      stats_->best_objective_ms = std::min(stats_->best_objective_ms == 0 ? kInf : stats_->best_objective_ms,
                                           obj * 1e3);
      // Ties (within a part in a million, e.g. splits that differ only in transfer time): the
      // smaller bottleneck first, so that time and memory are spread.
      const double tie = o_.microbatches == 1 ? kSequentialSlack : 1e-6;
      const bool better = step < round_best_step * (1 - tie) ||
                          (step <= round_best_step * (1 + tie) &&
                           (max_p < round_best_max * (1 - 1e-12) ||
                            (max_p <= round_best_max * (1 + 1e-12) && obj < round_best_obj)));
      if (better) {
        round_best_max = max_p;
        round_best_step = step;
        round_best_obj = obj;
        round_best = as;
      }
    }
    if (round_best && round_best_step < best_fit_step) {
      best_fit = round_best;
      best_fit_step = round_best_step;
    }
    if (all_fit) break;
  }
  // (if verification did not settle: the best plan that fits among those seen)
  if (best_fit) RETURN_IF_ERROR(Refine(&*best_fit, &best_fit_step));
  return best_fit;
}

absl::StatusOr<std::optional<double>> Searcher::Simulate(const std::vector<std::pair<int32_t, int32_t>>& ranges,
                                                         StageAssignment* as) {
  as->ranges = ranges;
  as->unit_choice.assign(policy_ == RecomputePolicy::kAuto ? U_ : 0, UnitRecompute::kNone);
  std::vector<StageTiming> timing;
  for (int32_t k = 0; k < K_; ++k) {
    const auto [i, j] = ranges[k];
    std::vector<UnitRecompute> choice;
    if (SegmentCost(i, j, k, &choice) == kInf) return std::optional<double>();
    if (policy_ == RecomputePolicy::kAuto) std::copy(choice.begin(), choice.end(), as->unit_choice.begin() + i);
    ASSIGN_OR_RETURN(const ExactStage* e, Exact(i, j, choice));
    if (e->Total(InFlight(k)) > capacity_) return std::optional<double>();
    timing.push_back({e->forward_s, e->backward_s + e->recompute_s, e->optimizer_s,
                      k + 1 < K_ ? t_.send_forward_s[j] : 0.0, k > 0 ? t_.send_backward_s[i] : 0.0});
  }
  return std::optional<double>(SimulateSchedule(o_.schedule, timing, o_.microbatches).step_s);
}

std::optional<double> Searcher::SimulateEstimate(const std::vector<std::pair<int32_t, int32_t>>& ranges) const {
  std::vector<StageTiming> timing;
  for (int32_t k = 0; k < K_; ++k) {
    const auto [i, j] = ranges[k];
    const double p = SegmentCost(i, j, k, nullptr);
    if (p == kInf) return std::nullopt;
    const double f = F_.Range(i, j);
    double o = 0;
    for (int32_t u = i; u < j; ++u) o += t_.optimizer_s[u];
    timing.push_back({f, p - f, o, k + 1 < K_ ? t_.send_forward_s[j] : 0.0, k > 0 ? t_.send_backward_s[i] : 0.0});
  }
  return SimulateSchedule(o_.schedule, timing, o_.microbatches).step_s;
}

absl::Status Searcher::Refine(StageAssignment* as, double* step) {
  // Coordinate descent: each cut in turn takes its best position between its neighbours. Gains
  // below the tie tolerance do not count (they would undo the balancing of ties).
  const double min_gain = o_.microbatches == 1 ? kSequentialSlack : 1e-6;
  for (int sweep = 0; sweep < 4 * K_; ++sweep) {
    bool improved = false;
    for (int32_t c = 1; c < K_; ++c) {
      const int32_t lo = as->ranges[c - 1].first + 1, hi = as->ranges[c].second - 1;
      for (int32_t cut = lo; cut <= hi; ++cut) {
        if (cut == as->ranges[c].first) continue;
        std::vector<std::pair<int32_t, int32_t>> r = as->ranges;
        r[c - 1].second = cut;
        r[c].first = cut;
        // The planner only for moves the unit table already finds better.
        const std::optional<double> quick = SimulateEstimate(r);
        if (!quick || *quick >= *step * (1 - min_gain)) continue;
        StageAssignment next;
        ASSIGN_OR_RETURN(std::optional<double> s, Simulate(r, &next));
        if (s && *s < *step * (1 - min_gain)) {
          *as = std::move(next);
          *step = *s;
          improved = true;
          ++stats_->refinements;
        }
      }
    }
    if (!improved) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Searcher::SmallestPeakMemory() {
  // Bottleneck DP on the lower bounds of memory with the policy's most aggressive recompute.
  std::vector<int64_t> lb(static_cast<size_t>(K_) * (U_ + 1) * (U_ + 1), std::numeric_limits<int64_t>::max());
  const int64_t saved_capacity = capacity_;
  capacity_ = std::numeric_limits<int64_t>::max();
  for (int32_t k = 0; k < K_; ++k)
    for (int32_t i = k; i <= U_ - (K_ - k); ++i)
      for (int32_t j = i + 1; j <= U_ - (K_ - 1 - k); ++j) {
        int64_t mem = 0;
        if (policy_ == RecomputePolicy::kAuto) {  // its most frugal choice: recompute the whole stage
          mem =
              P_.Range(i, j) + Boundary(i, j) + t_.in_backward[j] + InFlight(k) * t_.in_forward[i] + Remat_.Range(i, j);
        } else {
          SegmentCost(i, j, k, nullptr, &mem);
        }
        lb[Index(k, i, j)] = mem;
      }
  capacity_ = saved_capacity;
  std::vector<int64_t> best((K_ + 1) * (U_ + 1), std::numeric_limits<int64_t>::max());
  std::vector<int32_t> from((K_ + 1) * (U_ + 1), -1);
  auto at = [&](int32_t k, int32_t j) { return static_cast<size_t>(k) * (U_ + 1) + j; };
  best[at(0, 0)] = 0;
  for (int32_t k = 1; k <= K_; ++k)
    for (int32_t j = k; j <= U_ - (K_ - k); ++j)
      for (int32_t i = k - 1; i < j; ++i) {
        if (best[at(k - 1, i)] == std::numeric_limits<int64_t>::max()) continue;
        const int64_t v = std::max(best[at(k - 1, i)], lb[Index(k - 1, i, j)]);
        if (v < best[at(k, j)]) {
          best[at(k, j)] = v;
          from[at(k, j)] = i;
        }
      }
  int64_t peak = 0;
  int32_t j = U_;
  for (int32_t k = K_; k >= 1; --k) {
    const int32_t i = from[at(k, j)];
    RET_CHECK(i >= 0);
    std::vector<UnitRecompute> choice;
    if (policy_ == RecomputePolicy::kAuto) {
      choice.assign(j - i, UnitRecompute::kStage);
    } else {
      SegmentCost(i, j, k - 1, &choice);
    }
    ASSIGN_OR_RETURN(const ExactStage* e, Exact(i, j, choice));
    peak = std::max(peak, e->Total(InFlight(k - 1)));
    j = i;
  }
  return peak;
}

std::string StagesHint(const PartitionContext& ctx, const PartitionOptions& o, int32_t from_k) {
  const int32_t U = ctx.analysis().num_units();
  const int32_t last = static_cast<int32_t>(std::min<int64_t>(U, std::max<int64_t>(o.max_stages, from_k)));
  for (int32_t k = from_k; k <= last; ++k) {
    SearchStats stats;
    Searcher s(ctx, o, k, o.recompute, &stats);
    if (!s.MayFit()) continue;
    absl::StatusOr<std::optional<StageAssignment>> r = s.Run();
    if (r.ok() && r->has_value()) return std::to_string(k) + " stages (--stages " + std::to_string(k) + ")";
  }
  return "";
}

absl::Status NoFit(const PartitionContext& ctx, const PartitionOptions& o, int32_t K) {
  const DeviceProfile& d = ctx.cluster().device;
  const int64_t memory = o.memory_bytes > 0 ? o.memory_bytes : d.memory_bytes;
  SearchStats stats;
  Searcher s(ctx, o, K, o.recompute, &stats);
  ASSIGN_OR_RETURN(int64_t peak, s.SmallestPeakMemory());
  std::ostringstream msg;
  msg << "the model does not fit: with " << K << (K == 1 ? " stage" : " stages") << ", "
      << o.batch / std::max<int64_t>(1, o.data_parallel) << " samples"
      << (o.data_parallel > 1 ? " per replica (--data-parallel " + std::to_string(o.data_parallel) + ")" : "") << " in "
      << o.microbatches << " micro-batches (" << ScheduleName(o.schedule) << ", recompute "
      << RecomputePolicyName(o.recompute) << "), the most loaded stage needs " << FormatBytes(peak) << " but " << d.name
      << " offers " << FormatBytes(memory - d.reserved_bytes) << " (" << FormatBytes(memory) << " minus "
      << FormatBytes(d.reserved_bytes) << " reserved)";
  msg << ". It would fit on devices with " << FormatBytes(peak + d.reserved_bytes)
      << " (--device-memory " << (peak + d.reserved_bytes + (int64_t{1} << 30) - 1) / (int64_t{1} << 30) << "GiB)";
  const std::string more = StagesHint(ctx, o, K + 1);
  if (!more.empty()) {
    msg << ", or with " << more;
  } else if (K < ctx.analysis().num_units()) {
    msg << "; no stage count up to " << std::min<int64_t>(ctx.analysis().num_units(), std::max<int64_t>(o.max_stages, K + 1))
        << " fits this device";
  }
  if (o.recompute == RecomputePolicy::kNone || o.recompute == RecomputePolicy::kSelective) {
    PartitionOptions full = o;
    full.recompute = RecomputePolicy::kAuto;
    SearchStats st;
    Searcher sf(ctx, full, K, RecomputePolicy::kAuto, &st);
    if (sf.MayFit()) {
      absl::StatusOr<std::optional<StageAssignment>> r = sf.Run();
      if (r.ok() && r->has_value()) msg << ", or with --recompute auto";
    }
  }
  return absl::ResourceExhaustedError(msg.str());
}

}  // namespace

absl::StatusOr<PartitionPlan> Partition(const PartitionContext& ctx, const PartitionOptions& o) {
  RETURN_IF_ERROR(ValidateOptions(ctx, o));
  const auto start = std::chrono::steady_clock::now();
  const GraphAnalysis& a = ctx.analysis();
  SearchStats stats;
  stats.positions = a.num_positions();
  stats.cut_candidates = static_cast<int32_t>(a.cut_candidates.size());
  stats.units = a.num_units();
  auto finish = [&](PartitionPlan plan) {
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    plan.search = stats;
    return plan;
  };

  // Phase 3 for one stage count; phases 4-6 for its winner.
  auto search = [&](int32_t K) -> absl::StatusOr<std::optional<PartitionPlan>> {
    stats.stages_tried.push_back(K);
    Searcher s(ctx, o, K, o.recompute, &stats);
    ASSIGN_OR_RETURN(std::optional<StageAssignment> as, s.Run());
    if (!as) return std::optional<PartitionPlan>();
    bool fits = false;
    PartitionOptions po = o;
    ASSIGN_OR_RETURN(PartitionPlan plan, PlanAssignment(ctx, po, *as, &fits));
    RET_CHECK(fits) << "the verified plan does not fit when re-planned";
    return std::optional<PartitionPlan>(std::move(plan));
  };

  if (o.num_stages > 0) {
    const int32_t K = static_cast<int32_t>(o.num_stages);
    ASSIGN_OR_RETURN(std::optional<PartitionPlan> plan, search(K));
    if (!plan) return NoFit(ctx, o, K);
    return finish(std::move(*plan));
  }
  // --stages auto.
  const int32_t last = static_cast<int32_t>(std::min<int64_t>(a.num_units(), o.max_stages));
  std::optional<PartitionPlan> best;
  for (int32_t K = 1; K <= last; ++K) {
    {
      SearchStats quick;
      Searcher probe(ctx, o, K, o.recompute, &quick);
      if (!probe.MayFit()) continue;
    }
    ASSIGN_OR_RETURN(std::optional<PartitionPlan> plan, search(K));
    if (!plan) continue;
    if (o.objective == Objective::kFewestStages) return finish(std::move(*plan));
    if (!best || plan->step_ms < best->step_ms * (1 - 1e-9)) best = std::move(plan);
  }
  if (best) return finish(std::move(*best));
  const DeviceProfile& d = ctx.cluster().device;
  SearchStats st;
  Searcher s(ctx, o, last, o.recompute, &st);
  ASSIGN_OR_RETURN(int64_t peak, s.SmallestPeakMemory());
  return absl::ResourceExhaustedError(
      "the model does not fit on any number of stages up to " + std::to_string(last) + " of " + d.name +
      " (" + FormatBytes((o.memory_bytes > 0 ? o.memory_bytes : d.memory_bytes) - d.reserved_bytes) +
      " usable each): with " + std::to_string(last) + " stages the most loaded one still needs " +
      FormatBytes(peak) + "; try --recompute auto or full, more micro-batches, or a larger device");
}

}  // namespace onnxpipe::partitioner
