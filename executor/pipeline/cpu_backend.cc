// The CPU StageBackend: kernels through cpu::CpuEvaluator (thread-safe: it keeps no state but its
// default context, and the driver always passes one); accumulation is acc[i] + x[i], the addition
// the unpartitioned graph's gradient Sums perform.
#include "executor/cpu/cpu_evaluator.h"
#include "executor/cpu/thread_pool.h"
#include "executor/cpu/workspace.h"
#include "executor/pipeline/backend.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

template <typename T>
void AddInto(T* acc, const T* x, int64_t n) {
  cpu::ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) acc[i] += x[i];
  });
}

class CpuBackend : public StageBackend {
 public:
  std::string name() const override { return "cpu"; }
  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const RandomContext& ctx,
                                              ir::OutputAllocator* outputs) const override {
    cpu::EvalContext c;
    c.training = ctx.training;
    c.seed = ctx.seed;
    c.offset = ctx.offset;
    c.row_offset = ctx.row_offset;
    c.rows = ctx.rows;
    c.outputs = outputs;
    return evaluator_.Evaluate(node, inputs, c);
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    return cpu::CpuWorkspaceBytes(g, node);
  }
  absl::Status AccumulateInPlace(ir::Tensor& acc, const ir::Tensor& x) const override {
    if (acc.dtype() != x.dtype() || acc.dims() != x.dims() || !acc.has_data() || !x.has_data()) {
      return INVALID_ARGUMENT() << "cannot accumulate " << ir::DTypeName(x.dtype()) << " " << x.DebugString(0)
                                << " into " << ir::DTypeName(acc.dtype()) << " " << acc.DebugString(0);
    }
    const int64_t n = acc.num_elements();
    if (acc.dtype() == ir::DType::kF32) {
      AddInto(acc.mutable_data<float>(), x.data<float>(), n);
    } else if (acc.dtype() == ir::DType::kF64) {
      AddInto(acc.mutable_data<double>(), x.data<double>(), n);
    } else {
      return UNIMPLEMENTED() << "gradient accumulation in " << ir::DTypeName(acc.dtype());
    }
    return absl::OkStatus();
  }
  bool AllFinite(const ir::Tensor& t) const override { return runtime::AllFinite(t); }

 private:
  cpu::CpuEvaluator evaluator_;
};

}  // namespace

std::shared_ptr<const StageBackend> MakeCpuBackend() { return std::make_shared<CpuBackend>(); }

}  // namespace onnxpipe::pipeline
