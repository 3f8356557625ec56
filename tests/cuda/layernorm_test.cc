// LayerNorm / RMSNorm kernels against the CPU backend's LayerNorm and LayerNormGrad (same IR
// semantics), RMSNorm against a double-precision reference and finite differences; fp32 within
// 1e-5 relative (to the tensor's scale), bf16 by normalised error.
#include "executor/cuda/layernorm.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "tests/cuda/cuda_test_util.h"

namespace onnxpipe::cuda {
namespace {

using testing::AllClose;
using testing::CpuEval;
using testing::DeviceBuffer;
using testing::Download;
using testing::F32;
using testing::Floats;
using testing::NormalisedError;
using testing::Representable;
using testing::Uniform;
using testing::Upload;

constexpr float kEps = 1e-5f;

struct Shape {
  int64_t rows, d;
};
// d = 1024 and 4096; d not a multiple of 32 or of the vector width; one row and many; several rows
// per backward block with a partial last block (5000 x 1024). The backward's warp-per-row path
// (d <= 256) with groups of 8 (d = 24, 33, 64), 16 (128) and 32 (200, 256) lanes, idle lanes, and
// blocks whose rows fill some of their groups, end in a partial group, or need several steps.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {{1, 1024}, {64, 1024},  {37, 4096},  {300, 33},
                                            {5, 4095}, {129, 1000}, {2050, 64},  {5000, 1024},
                                            {700, 24}, {1537, 200}, {3001, 256}, {20000, 128}};
  return shapes;
}

template <typename T>
void ExpectMatch(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    EXPECT_LT(NormalisedError(got, want), 1e-2) << what;
  } else {
    EXPECT_TRUE(AllClose(got, want, 1e-5)) << what;
  }
}

std::string Name(const Shape& s) { return "(" + std::to_string(s.rows) + ", " + std::to_string(s.d) + ")"; }

// Host inputs of one problem, already representable in T.
template <typename T>
struct Problem {
  Problem(Shape s, uint32_t seed)
      : shape(s),
        x(Representable<T>(Uniform(s.rows * s.d, seed, -3.f, 3.f))),
        residual(Representable<T>(Uniform(s.rows * s.d, seed + 1))),
        gamma(Representable<T>(Uniform(s.d, seed + 2, 0.5f, 1.5f))),
        beta(Representable<T>(Uniform(s.d, seed + 3, -1.f, 1.f))),
        dy(Representable<T>(Uniform(s.rows * s.d, seed + 4, -1.f, 1.f))) {}
  Shape shape;
  std::vector<float> x, residual, gamma, beta, dy;
};

struct Forward {
  std::vector<float> y, mean, rstd, sum;
};

// Runs the forward on the GPU; with `residual` normalises x + residual and returns the sum too.
template <typename T>
Forward RunForward(NormKind kind, const Problem<T>& p, bool with_beta, bool with_residual) {
  const int64_t n = p.shape.rows * p.shape.d;
  DeviceBuffer<T> x(n), r(with_residual ? n : 0), sum(with_residual ? n : 0), y(n), gamma(p.shape.d),
      beta(with_beta ? p.shape.d : 0);
  DeviceBuffer<float> mean(kind == NormKind::kLayerNorm ? p.shape.rows : 0), rstd(p.shape.rows);
  Upload(p.x, x);
  Upload(p.gamma, gamma);
  if (with_beta) Upload(p.beta, beta);
  if (with_residual) Upload(p.residual, r);
  NormForwardArgs<T> a;
  a.kind = kind;
  a.rows = p.shape.rows;
  a.d = p.shape.d;
  a.epsilon = kEps;
  a.x = x.get();
  a.residual = r.get();
  a.sum = sum.get();
  a.gamma = gamma.get();
  a.beta = beta.get();
  a.y = y.get();
  a.mean = mean.get();
  a.rstd = rstd.get();
  const absl::Status st = NormForward(a, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  Forward f;
  f.y = Download(y);
  f.rstd = Download(rstd);
  if (kind == NormKind::kLayerNorm) f.mean = Download(mean);
  if (with_residual) f.sum = Download(sum);
  return f;
}

struct Backward {
  std::vector<float> dx, dgamma, dbeta;
};

// `v` after `offset` zeros.
std::vector<float> Padded(const std::vector<float>& v, int64_t offset) {
  std::vector<float> out(offset, 0.f);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

// Runs the backward on the GPU for input `x` (the normalised values), with the given saved
// statistics (or none: recomputed) and an optional residual gradient added to dx. Every T pointer
// is `offset` elements past the start of its allocation (1: not 16-byte aligned).
// With `sums`: also dx's column sums (dx_sums), or with `dropout` dx_dropped's (into `dropped`).
template <typename T>
Backward RunBackward(NormKind kind, const Problem<T>& p, const std::vector<float>& x_host,
                     const std::optional<Forward>& saved, const std::vector<float>* dresidual, int64_t offset = 0,
                     std::vector<float>* sums = nullptr, const DropoutParams* dropout = nullptr,
                     std::vector<float>* dropped = nullptr) {
  const int64_t n = p.shape.rows * p.shape.d;
  const bool layer = kind == NormKind::kLayerNorm;
  DeviceBuffer<T> dy(offset + n), x(offset + n), gamma(offset + p.shape.d), dx(offset + n),
      dres(dresidual ? offset + n : 0);
  DeviceBuffer<float> mean(saved && layer ? p.shape.rows : 0), rstd(saved ? p.shape.rows : 0);
  DeviceBuffer<float> dgamma(p.shape.d), dbeta(layer ? p.shape.d : 0);
  DeviceBuffer<float> ws((NormBackwardWorkspaceBytes(p.shape.rows, p.shape.d) + 3) / 4);
  Upload(Padded(p.dy, offset), dy);
  Upload(Padded(x_host, offset), x);
  Upload(Padded(p.gamma, offset), gamma);
  if (dresidual) Upload(Padded(*dresidual, offset), dres);
  if (saved) {
    if (layer) {
      EXPECT_EQ(cudaMemcpy(mean.get(), saved->mean.data(), p.shape.rows * 4, cudaMemcpyHostToDevice), 0);
    }
    EXPECT_EQ(cudaMemcpy(rstd.get(), saved->rstd.data(), p.shape.rows * 4, cudaMemcpyHostToDevice), 0);
  }
  NormBackwardArgs<T> a;
  a.kind = kind;
  a.rows = p.shape.rows;
  a.d = p.shape.d;
  a.epsilon = kEps;
  a.dy = dy.get() + offset;
  a.x = x.get() + offset;
  a.gamma = gamma.get() + offset;
  a.mean = mean.get();
  a.rstd = rstd.get();
  a.dresidual = dresidual ? dres.get() + offset : nullptr;
  a.dx = dx.get() + offset;
  a.dgamma = dgamma.get();
  a.dbeta = dbeta.get();
  a.workspace = ws.get();
  DeviceBuffer<float> sums_dev(sums != nullptr ? p.shape.d : 0);
  DeviceBuffer<T> dx_dropped(dropout != nullptr ? offset + n : 0);
  a.dx_sums = sums_dev.get();
  if (dropout != nullptr) a.dropout = dropout, a.dx_dropped = dx_dropped.get() + offset, a.sums_of_dropped = true;
  const absl::Status st = NormBackward(a, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (sums != nullptr) *sums = Download(sums_dev);
  if (dropped != nullptr) {
    *dropped = Download(dx_dropped);
    dropped->erase(dropped->begin(), dropped->begin() + offset);
  }
  Backward b;
  b.dx = Download(dx);
  b.dx.erase(b.dx.begin(), b.dx.begin() + offset);
  b.dgamma = Download(dgamma);
  if (layer) b.dbeta = Download(dbeta);
  return b;
}

ir::Attrs LayerNormAttrs() {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  attrs.Set("epsilon", static_cast<double>(kEps));
  return attrs;
}

template <typename T>
class NormCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(NormCudaTest, ElementTypes);

TYPED_TEST(NormCudaTest, LayerNormForwardMatchesCpu) {
  using T = TypeParam;
  uint32_t seed = 10;
  for (const Shape& s : Shapes()) {
    for (bool with_beta : {true, false}) {
      Problem<T> p(s, seed += 10);
      const Forward got = RunForward<T>(NormKind::kLayerNorm, p, with_beta, /*with_residual=*/false);
      std::vector<ir::Tensor> in = {F32({s.rows, s.d}, p.x), F32({s.d}, p.gamma)};
      if (with_beta) in.push_back(F32({s.d}, p.beta));
      const auto want = CpuEval(ir::OpKind::kLayerNorm, in, 3, LayerNormAttrs());
      const std::string what = Name(s) + (with_beta ? " with beta" : " without beta");
      ExpectMatch<T>(got.y, Floats(want[0]), "y " + what);
      EXPECT_TRUE(AllClose(got.mean, Floats(want[1]), 1e-5)) << "mean " << what;
      EXPECT_TRUE(AllClose(got.rstd, Floats(want[2]), 1e-5)) << "rstd " << what;
    }
  }
}

TYPED_TEST(NormCudaTest, ResidualAddIsFused) {
  using T = TypeParam;
  for (const NormKind kind : {NormKind::kLayerNorm, NormKind::kRmsNorm}) {
    const bool layer = kind == NormKind::kLayerNorm;
    for (const Shape& s : {Shape{64, 1024}, Shape{300, 33}, Shape{5, 4095}}) {
      const std::string what = (layer ? "LayerNorm " : "RMSNorm ") + Name(s);
      Problem<T> p(s, 7);
      const Forward got = RunForward<T>(kind, p, /*with_beta=*/layer, /*with_residual=*/true);
      std::vector<float> sum(p.x.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = p.x[i] + p.residual[i];
      sum = Representable<T>(sum);
      EXPECT_EQ(got.sum, sum) << "the sum is x + residual rounded once to the element type " << what;
      std::vector<ir::Tensor> in = {F32({s.rows, s.d}, sum), F32({s.d}, p.gamma)};
      if (layer) in.push_back(F32({s.d}, p.beta));
      const auto want =
          CpuEval(layer ? ir::OpKind::kLayerNorm : ir::OpKind::kRMSNorm, in, layer ? 3 : 2, LayerNormAttrs());
      ExpectMatch<T>(got.y, Floats(want[0]), "y of the sum " + what);
      EXPECT_TRUE(AllClose(got.rstd, Floats(want[layer ? 2 : 1]), 1e-5)) << what;
    }
  }
}

TYPED_TEST(NormCudaTest, ResidualAddInPlace) {
  using T = TypeParam;
  const Shape s{16, 256};
  Problem<T> p(s, 8);
  const int64_t n = s.rows * s.d;
  DeviceBuffer<T> stream(n), r(n), y(n), gamma(s.d);
  Upload(p.x, stream);
  Upload(p.residual, r);
  Upload(p.gamma, gamma);
  NormForwardArgs<T> a;
  a.rows = s.rows;
  a.d = s.d;
  a.x = stream.get();
  a.residual = r.get();
  a.sum = stream.get();  // the residual stream updated in place
  a.gamma = gamma.get();
  a.y = y.get();
  ASSERT_TRUE(NormForward(a, nullptr).ok());
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = p.x[i] + p.residual[i];
  EXPECT_EQ(Download(stream), Representable<T>(sum));
  const auto want = CpuEval(ir::OpKind::kLayerNorm, {F32({s.rows, s.d}, Representable<T>(sum)), F32({s.d}, p.gamma)}, 1,
                            LayerNormAttrs());
  ExpectMatch<T>(Download(y), Floats(want[0]), "in-place residual");
}

TYPED_TEST(NormCudaTest, LayerNormBackwardMatchesCpu) {
  using T = TypeParam;
  uint32_t seed = 100;
  for (const Shape& s : Shapes()) {
    Problem<T> p(s, seed += 10);
    const ir::Tensor x = F32({s.rows, s.d}, p.x), gamma = F32({s.d}, p.gamma), dy = F32({s.rows, s.d}, p.dy);
    const auto fwd = CpuEval(ir::OpKind::kLayerNorm, {x, gamma}, 3, LayerNormAttrs());
    const auto want = CpuEval(ir::OpKind::kLayerNormGrad, {dy, x, gamma, fwd[1], fwd[2]}, 3, LayerNormAttrs());
    const auto recomputed = CpuEval(ir::OpKind::kLayerNormGrad, {dy, x, gamma}, 3, LayerNormAttrs());
    const Forward saved = RunForward<T>(NormKind::kLayerNorm, p, /*with_beta=*/false, /*with_residual=*/false);
    for (bool use_saved : {true, false}) {
      const Backward got = RunBackward<T>(NormKind::kLayerNorm, p, p.x,
                                          use_saved ? std::optional<Forward>(saved) : std::nullopt, nullptr);
      const auto& w = use_saved ? want : recomputed;
      const std::string what = Name(s) + (use_saved ? " saved statistics" : " recomputed statistics");
      ExpectMatch<T>(got.dx, Floats(w[0]), "dx " + what);
      // Parameter gradients are fp32 sums whatever T is.
      EXPECT_TRUE(AllClose(got.dgamma, Floats(w[1]), 1e-5)) << "dgamma " << what;
      EXPECT_TRUE(AllClose(got.dbeta, Floats(w[2]), 1e-5)) << "dbeta " << what;
    }
    // The residual stream's gradient is added to dx.
    const std::vector<float> dres = Representable<T>(Uniform(s.rows * s.d, seed + 5, -1.f, 1.f));
    const Backward got = RunBackward<T>(NormKind::kLayerNorm, p, p.x, saved, &dres);
    std::vector<float> dx = Floats(want[0]);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += dres[i];
    ExpectMatch<T>(got.dx, dx, "dx + dresidual " + Name(s));
  }
}

// The sums over rows of a (rows, d) tensor in double; ColumnSumsMatch: `got` within fp32 accumulation
// of them (relative to the sum of magnitudes).
std::vector<double> ColumnSums(const std::vector<float>& v, Shape s) {
  std::vector<double> out(s.d, 0.0);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t c = 0; c < s.d; ++c) out[c] += v[r * s.d + c];
  return out;
}
::testing::AssertionResult ColumnSumsMatch(const std::vector<float>& got, const std::vector<float>& v, Shape s) {
  const std::vector<double> want = ColumnSums(v, s);
  std::vector<float> mag(v.size());
  for (size_t i = 0; i < v.size(); ++i) mag[i] = std::abs(v[i]);
  const std::vector<double> scale = ColumnSums(mag, s);
  if (static_cast<int64_t>(got.size()) != s.d) return ::testing::AssertionFailure() << got.size() << " sums";
  for (int64_t c = 0; c < s.d; ++c) {
    if (std::abs(got[c] - want[c]) > 1e-6 * scale[c] + 1e-30) {
      return ::testing::AssertionFailure() << "column " << c << ": " << got[c] << " against " << want[c];
    }
  }
  return ::testing::AssertionSuccess();
}

// dx_sums (LayerNormGrad's dXSums, dXDroppedSums): dx and the parameter gradients as without them, the
// sums those of dx (or of dx_dropped) as stored, on the block and warp-per-row paths, aligned or not.
TYPED_TEST(NormCudaTest, BackwardSumsItsOutputsColumns) {
  using T = TypeParam;
  uint32_t seed = 700;
  for (const Shape& s : Shapes()) {
    Problem<T> p(s, seed += 10);
    const std::vector<float> dres = Representable<T>(Uniform(s.rows * s.d, seed + 5, -1.f, 1.f));
    for (int64_t offset : {0, 1}) {
      const std::string what = Name(s) + (offset ? " unaligned" : "");
      const Backward want = RunBackward<T>(NormKind::kLayerNorm, p, p.x, std::nullopt, &dres, offset);
      std::vector<float> sums;
      const Backward got = RunBackward<T>(NormKind::kLayerNorm, p, p.x, std::nullopt, &dres, offset, &sums);
      EXPECT_EQ(got.dx, want.dx) << what;
      EXPECT_EQ(got.dgamma, want.dgamma) << what;
      EXPECT_EQ(got.dbeta, want.dbeta) << what;
      EXPECT_TRUE(ColumnSumsMatch(sums, got.dx, s)) << "dx " << what;
      DropoutParams drop;
      drop.ratio = 0.1, drop.seed = 3, drop.node_key = 9;
      std::vector<float> dropped;
      RunBackward<T>(NormKind::kLayerNorm, p, p.x, std::nullopt, &dres, offset, &sums, &drop, &dropped);
      EXPECT_TRUE(ColumnSumsMatch(sums, dropped, s)) << "dx_dropped " << what;
    }
  }
}

// RMSNorm in double, straight from the definition (the CPU backend has no RMSNorm op).
struct RmsReference {
  std::vector<double> y, rstd, dx, dgamma;
};
RmsReference RmsNormDouble(Shape s, const std::vector<float>& x, const std::vector<float>& gamma,
                           const std::vector<float>& dy) {
  RmsReference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.rstd.resize(s.rows);
  r.dgamma.assign(s.d, 0.0);
  for (int64_t i = 0; i < s.rows; ++i) {
    const int64_t b = i * s.d;
    double sq = 0, gx = 0;
    for (int64_t j = 0; j < s.d; ++j) sq += static_cast<double>(x[b + j]) * x[b + j];
    const double rs = 1.0 / std::sqrt(sq / s.d + kEps);
    r.rstd[i] = rs;
    for (int64_t j = 0; j < s.d; ++j) {
      r.y[b + j] = x[b + j] * rs * gamma[j];
      gx += static_cast<double>(dy[b + j]) * gamma[j] * x[b + j] * rs;
      r.dgamma[j] += static_cast<double>(dy[b + j]) * x[b + j] * rs;
    }
    for (int64_t j = 0; j < s.d; ++j) {
      r.dx[b + j] = rs * (static_cast<double>(dy[b + j]) * gamma[j] - x[b + j] * rs * gx / s.d);
    }
  }
  return r;
}
std::vector<float> ToFloats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

TYPED_TEST(NormCudaTest, RmsNormMatchesDoubleReference) {
  using T = TypeParam;
  uint32_t seed = 300;
  for (const Shape& s : Shapes()) {
    Problem<T> p(s, seed += 10);
    const RmsReference want = RmsNormDouble(s, p.x, p.gamma, p.dy);
    const Forward fwd = RunForward<T>(NormKind::kRmsNorm, p, /*with_beta=*/false, /*with_residual=*/false);
    ExpectMatch<T>(fwd.y, ToFloats(want.y), "RMSNorm y " + Name(s));
    EXPECT_TRUE(AllClose(fwd.rstd, ToFloats(want.rstd), 1e-5)) << Name(s);
    for (bool use_saved : {true, false}) {
      const Backward got =
          RunBackward<T>(NormKind::kRmsNorm, p, p.x, use_saved ? std::optional<Forward>(fwd) : std::nullopt, nullptr);
      ExpectMatch<T>(got.dx, ToFloats(want.dx), "RMSNorm dx " + Name(s));
      EXPECT_TRUE(AllClose(got.dgamma, ToFloats(want.dgamma), 1e-5)) << "RMSNorm dgamma " << Name(s);
    }
    const std::vector<float> dres = Representable<T>(Uniform(s.rows * s.d, seed + 5, -1.f, 1.f));
    const Backward got = RunBackward<T>(NormKind::kRmsNorm, p, p.x, fwd, &dres);
    std::vector<float> dx = ToFloats(want.dx);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += dres[i];
    ExpectMatch<T>(got.dx, dx, "RMSNorm dx + dresidual " + Name(s));
  }
}

TYPED_TEST(NormCudaTest, BackwardIsBitwiseReproducible) {
  using T = TypeParam;
  for (const Shape& s : {Shape{5000, 1024}, Shape{20000, 128}}) {  // block and warp-per-row paths
    Problem<T> p(s, 400);
    const Backward a = RunBackward<T>(NormKind::kLayerNorm, p, p.x, std::nullopt, nullptr);
    const Backward b = RunBackward<T>(NormKind::kLayerNorm, p, p.x, std::nullopt, nullptr);
    EXPECT_EQ(a.dx, b.dx) << Name(s);
    EXPECT_EQ(a.dgamma, b.dgamma) << Name(s);
    EXPECT_EQ(a.dbeta, b.dbeta) << Name(s);
  }
}

// Pointers that are not 16-byte aligned take the plans with one element per access (other chunk
// counts, block sizes and rows per step); the results match the aligned run's.
TYPED_TEST(NormCudaTest, BackwardWithUnalignedPointersMatchesAligned) {
  using T = TypeParam;
  uint32_t seed = 600;
  for (const Shape& s : {Shape{300, 1024}, Shape{1537, 200}, Shape{20000, 64}}) {
    Problem<T> p(s, seed += 10);
    const std::vector<float> dres = Representable<T>(Uniform(s.rows * s.d, seed + 5, -1.f, 1.f));
    for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRmsNorm}) {
      const Backward want = RunBackward<T>(kind, p, p.x, std::nullopt, &dres);
      const Backward got = RunBackward<T>(kind, p, p.x, std::nullopt, &dres, /*offset=*/1);
      const std::string what = Name(s) + (kind == NormKind::kLayerNorm ? " LayerNorm" : " RMSNorm");
      ExpectMatch<T>(got.dx, want.dx, "dx " + what);
      EXPECT_TRUE(AllClose(got.dgamma, want.dgamma, 1e-5)) << "dgamma " << what;
      EXPECT_TRUE(AllClose(got.dbeta, want.dbeta, 1e-5)) << "dbeta " << what;
    }
  }
}

// The analytic RMSNorm gradient of the kernel against central differences of the double forward
// for L = sum(dy * y), at a sample of x and gamma entries.
TEST(RmsNormCudaTest, BackwardMatchesFiniteDifferences) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Shape s{6, 77};
  Problem<float> p(s, 500);
  const Backward got = RunBackward<float>(NormKind::kRmsNorm, p, p.x, std::nullopt, nullptr);
  auto row_loss = [&](int64_t row, const std::vector<double>& xr, const std::vector<double>& g) {
    double sq = 0;
    for (double v : xr) sq += v * v;
    const double rs = 1.0 / std::sqrt(sq / s.d + kEps);
    double l = 0;
    for (int64_t j = 0; j < s.d; ++j) l += p.dy[row * s.d + j] * xr[j] * rs * g[j];
    return l;
  };
  std::vector<double> gamma(p.gamma.begin(), p.gamma.end());
  const double h = 1e-4;
  for (int64_t row = 0; row < s.rows; ++row) {
    for (int64_t j = row; j < s.d; j += 13) {
      std::vector<double> xr(p.x.begin() + row * s.d, p.x.begin() + (row + 1) * s.d);
      xr[j] += h;
      const double up = row_loss(row, xr, gamma);
      xr[j] -= 2 * h;
      const double down = row_loss(row, xr, gamma);
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(got.dx[row * s.d + j], fd, 1e-4 * (1 + std::abs(fd))) << "dx[" << row << ", " << j << "]";
    }
  }
  for (int64_t j = 0; j < s.d; j += 7) {
    auto total = [&](double gj) {
      std::vector<double> g = gamma;
      g[j] = gj;
      double l = 0;
      for (int64_t row = 0; row < s.rows; ++row) {
        l += row_loss(row, std::vector<double>(p.x.begin() + row * s.d, p.x.begin() + (row + 1) * s.d), g);
      }
      return l;
    };
    const double fd = (total(gamma[j] + h) - total(gamma[j] - h)) / (2 * h);
    EXPECT_NEAR(got.dgamma[j], fd, 1e-4 * (1 + std::abs(fd))) << "dgamma[" << j << "]";
  }
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(NormArgumentsTest, BadArgumentsAreRejectedWithAMessage) {
  float buf[4] = {};
  NormForwardArgs<float> f;
  f.rows = 1;
  f.d = 4;
  f.x = f.gamma = buf;
  f.y = buf;
  auto expect_error = [](const absl::Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st;
  };
  NormForwardArgs<float> bad = f;
  bad.d = 0;
  expect_error(NormForward(bad, nullptr), "d is 0");
  bad.d = kNormMaxD + 1;
  expect_error(NormForward(bad, nullptr), "d <= ");
  bad = f;
  bad.rows = -1;
  expect_error(NormForward(bad, nullptr), "rows is -1");
  bad = f;
  bad.x = nullptr;
  expect_error(NormForward(bad, nullptr), "got null");
  bad = f;
  bad.sum = buf;  // without a residual (a residual without sum is fine: S is not stored)
  expect_error(NormForward(bad, nullptr), "need a residual");
  bad = f;
  bad.kind = NormKind::kRmsNorm;
  bad.beta = buf;
  expect_error(NormForward(bad, nullptr), "RMSNorm");
  bad = f;
  bad.epsilon = -1.f;
  expect_error(NormForward(bad, nullptr), "epsilon");

  NormBackwardArgs<float> b;
  b.rows = 1;
  b.d = 4;
  b.dy = b.x = b.gamma = buf;
  b.dx = buf;
  NormBackwardArgs<float> badb = b;
  badb.dgamma = buf;  // no workspace
  expect_error(NormBackward(badb, nullptr), "workspace");
  badb = b;
  badb.mean = buf;  // without rstd
  expect_error(NormBackward(badb, nullptr), "mean and rstd");
  badb = b;
  badb.kind = NormKind::kRmsNorm;
  badb.dbeta = buf;
  badb.workspace = buf;
  expect_error(NormBackward(badb, nullptr), "RMSNorm");
  badb = b;
  badb.dx = nullptr;
  expect_error(NormBackward(badb, nullptr), "got null");
}

}  // namespace
}  // namespace onnxpipe::cuda
