#include "frontend/passes/tie_transposed_initializers.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {
namespace {

using ir::Tensor;
using ir::ValueId;

// Whether b is exactly a transposed (element bytes compared, so -0.0 and NaN payloads count).
bool IsTransposeOf(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.dims()[0], cols = a.dims()[1];
  const size_t size = ir::DTypeSize(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.raw());
  const auto* pb = static_cast<const unsigned char*>(b.raw());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (std::memcmp(pa + (r * cols + c) * size, pb + (c * rows + r) * size, size) != 0) return false;
    }
  }
  return true;
}

bool HasTwoDistinctValues(const Tensor& t) {
  const size_t size = ir::DTypeSize(t.dtype());
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (int64_t i = 1; i < t.num_elements(); ++i) {
    if (std::memcmp(p, p + i * size, size) != 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> TieTransposedInitializers::Run(ir::Graph* g) {
  ties_.clear();
  const std::vector<std::vector<ir::NodeId>> uses = g->ComputeUses();
  // Candidates by (dtype, sorted dims): a pair can only match within one bucket.
  std::map<std::pair<int, std::pair<int64_t, int64_t>>, std::vector<ValueId>> buckets;
  for (ValueId v = 0; v < g->num_values(); ++v) {
    const ir::Value& val = g->value(v);
    if (!val.is_initializer || !val.constant || !val.constant->has_data() || !ir::IsFloat(val.dtype) ||
        val.producer != ir::kNoNode || val.param_state == ir::ParamState::kFrozen || val.constant->rank() != 2 ||
        uses[v].empty() || g->IsGraphOutput(v))
      continue;
    const std::vector<int64_t>& d = val.constant->dims();
    if (!HasTwoDistinctValues(*val.constant)) continue;
    buckets[{static_cast<int>(val.dtype), {std::min(d[0], d[1]), std::max(d[0], d[1])}}].push_back(v);
  }
  bool changed = false;
  for (auto& [key, vals] : buckets) {
    std::vector<bool> tied(vals.size(), false);
    for (size_t i = 0; i < vals.size(); ++i) {
      if (tied[i]) continue;
      for (size_t j = i + 1; j < vals.size(); ++j) {
        if (tied[j]) continue;
        const Tensor& a = *g->value(vals[i]).constant;
        const Tensor& b = *g->value(vals[j]).constant;
        if (a.dims()[0] != b.dims()[1] || a.dims()[1] != b.dims()[0] || !IsTransposeOf(a, b)) continue;
        ir::Value& bv = g->value(vals[j]);
        const std::string b_name = bv.name;
        const ValueId t = g->AddValue(g->UniqueName(b_name + "/tied"), bv.dtype,
                                      ir::FromInts(b.dims()));
        g->ReplaceAllUses(vals[j], t);
        ir::Attrs attrs;
        attrs.Set("perm", std::vector<int64_t>{1, 0});
        g->AddNode(ir::OpKind::kTranspose, b_name + "/TiedTranspose", {vals[i]}, {t}, std::move(attrs));
        g->value(vals[j]).is_initializer = false;  // no longer a parameter of its own
        ties_.push_back(absl::StrCat(b_name, " = ", g->value(vals[i]).name, "^T"));
        tied[j] = true;
        changed = true;
      }
    }
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
