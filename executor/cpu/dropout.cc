// Dropout: identity in inference (mask all true); in training y = x * keep / (1 - ratio) with the
// keep mask from the node's Philox stream (dropout.h).
#include "executor/cpu/dropout.h"

#include <cmath>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {

uint64_t NodeRngKey(const ir::Node& node) {
  const std::string key = node.attrs.Get<std::string>("rng_key", node.name);
  return Fnv1a64(key.data(), key.size());
}

void FillDropoutKeepMask(const DropoutStream& stream, int64_t begin, int64_t end, uint8_t* keep) {
  ParallelFor(end - begin, 1 << 14, [&](int64_t b, int64_t e) {
    int64_t i = begin + b;
    const int64_t stop = begin + e;
    while (i < stop) {
      const Philox4x32 r = stream.Block(static_cast<uint64_t>(i) >> 2);
      for (int lane = static_cast<int>(i & 3); lane < 4 && i < stop; ++lane, ++i) {
        keep[i - begin] = r.v[lane] >= stream.threshold;
      }
    }
  });
}

namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs DropoutKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  const double ratio = node.attrs.Get<double>("ratio", 0.5);
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": ratio is " << ratio << ", expected [0, 1]";
  }
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const int64_t n = x.num_elements();
    ir::Tensor mask(ir::DType::kBool, x.dims());
    if (!ctx.training || ratio == 0.0) {
      std::fill_n(mask.mutable_data<uint8_t>(), n, uint8_t{1});
      return std::vector<ir::Tensor>{x, mask};
    }
    uint8_t* keep = mask.mutable_data<uint8_t>();
    FillDropoutKeepMask(MakeDropoutStream(node, ctx, ratio), 0, n, keep);
    const T scale = ratio >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - ratio));
    ir::Tensor y(x.dtype(), x.dims());
    const T* px = x.data<T>();
    T* py = y.mutable_data<T>();
    ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) py[i] = keep[i] ? px[i] * scale : T(0);
    });
    return std::vector<ir::Tensor>{y, mask};
  });
}
REGISTER_CPU_KERNEL(kDropout, DropoutKernel);

}  // namespace
}  // namespace onnxpipe::cpu
