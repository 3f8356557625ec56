// The CPU StageBackend: kernels through cpu::CpuEvaluator (thread-safe: it keeps no state but its
// default context, and the driver always passes one), accumulation through the Sum kernel so that
// the addition is the same one the unpartitioned graph's gradient Sums perform.
#include "executor/cpu/cpu_evaluator.h"
#include "executor/pipeline/backend.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

class CpuBackend : public StageBackend {
 public:
  CpuBackend() {
    sum_.op = ir::OpKind::kSum;
    sum_.name = "pipeline/accumulate";
    sum_.inputs = {0, 1};
    sum_.outputs = {2};
  }
  std::string name() const override { return "cpu"; }
  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const RandomContext& ctx) const override {
    cpu::EvalContext c;
    c.training = ctx.training;
    c.seed = ctx.seed;
    c.offset = ctx.offset;
    return evaluator_.Evaluate(node, inputs, c);
  }
  absl::StatusOr<ir::Tensor> Accumulate(const ir::Tensor& acc, const ir::Tensor& x) const override {
    if (acc.dtype() != x.dtype() || acc.dims() != x.dims()) {
      return INVALID_ARGUMENT() << "cannot accumulate " << ir::DTypeName(x.dtype()) << " " << x.DebugString(0)
                                << " into " << ir::DTypeName(acc.dtype()) << " " << acc.DebugString(0);
    }
    ASSIGN_OR_RETURN(std::vector<ir::Tensor> out, evaluator_.Evaluate(sum_, {acc, x}, cpu::EvalContext{}));
    return out.at(0);
  }
  bool AllFinite(const ir::Tensor& t) const override { return runtime::AllFinite(t); }

 private:
  cpu::CpuEvaluator evaluator_;
  ir::Node sum_;
};

}  // namespace

std::shared_ptr<const StageBackend> MakeCpuBackend() { return std::make_shared<CpuBackend>(); }

}  // namespace onnxpipe::pipeline
