// Dropout: identity in inference (mask all true); in training y = x * keep / (1 - ratio) with the
// keep mask from the node's Philox stream (dropout.h).
#include "executor/cpu/dropout.h"

#include <cmath>

#include "executor/cpu/kernel_util.h"
#include "frontend/ir/shape.h"

namespace onnxpipe::cpu {

uint64_t NodeRngKey(const ir::Node& node) {
  const std::string key = node.attrs.Get<std::string>("rng_key", node.name);
  return Fnv1a64(key.data(), key.size());
}

absl::StatusOr<int64_t> RandomCounterBase(const ir::Node& node, const EvalContext& ctx, int64_t numel) {
  if (ctx.rows <= 0 || ctx.row_offset == 0) return int64_t{0};
  if (numel % ctx.rows != 0) {
    return INVALID_ARGUMENT() << Describe(node) << ": its random stream is indexed by batch row, but " << numel
                              << " elements do not split into the micro-batch's " << ctx.rows
                              << " rows (the batch must be the outermost dim)";
  }
  return ctx.row_offset * (numel / ctx.rows);
}

void FillDropoutKeepMask(const DropoutStream& stream, int64_t begin, int64_t end, uint8_t* keep) {
  ParallelFor(end - begin, 1 << 14, [&](int64_t b, int64_t e) {
    int64_t i = begin + b;
    const int64_t stop = begin + e;
    while (i < stop) {
      const uint32_t bits = stream.Kept8(stream.Block(static_cast<uint64_t>(i) >> 3));
      for (int k = static_cast<int>(i & 7); k < DropoutStream::kPerBlock && i < stop; ++k, ++i) {
        keep[i - begin] = (bits >> k) & 1u;
      }
    }
  });
}

absl::StatusOr<FusedDropout> DropoutOf(const ir::Node& node, const EvalContext& ctx, int64_t numel) {
  const bool own = node.op == ir::OpKind::kDropout || node.op == ir::OpKind::kDropoutGrad;
  const char* attr = own ? "ratio" : "dropout";
  const double ratio = node.attrs.Get<double>(attr, own ? 0.5 : 0.0);
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << attr << " is " << ratio << ", expected a ratio in [0, 1]";
  }
  FusedDropout d;
  if (!ctx.training || ratio == 0.0) return d;
  d.active = true;
  d.stream = MakeDropoutStream(node, ctx, ratio);
  ASSIGN_OR_RETURN(d.base, RandomCounterBase(node, ctx, numel));
  d.scale = ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - ratio);
  return d;
}

absl::StatusOr<ir::Tensor> AllocKeepBits(const ir::Node& node, const EvalContext& ctx, int output,
                                         const std::vector<int64_t>& dims) {
  const std::optional<std::vector<int64_t>> bits = ir::KeepBitsDims(dims);
  if (!bits) {
    return INVALID_ARGUMENT() << Describe(node) << ": keep bits (output " << output << ") need a last dim that is a "
                              << "multiple of 8, the data is " << DimsToString(dims);
  }
  return AllocOutput(node, ctx, output, ir::DType::kU8, *bits);
}

absl::Status CheckKeepBits(const ir::Node& node, const ir::Tensor& bits, const std::vector<int64_t>& dims) {
  const std::optional<std::vector<int64_t>> want = ir::KeepBitsDims(dims);
  if (!want || bits.dtype() != ir::DType::kU8 || bits.dims() != *want) {
    return INVALID_ARGUMENT() << Describe(node) << ": keep bits " << ir::DTypeName(bits.dtype())
                              << DimsToString(bits.dims()) << " are not u8 bits of data " << DimsToString(dims)
                              << " (its last dim a multiple of 8, divided by 8)";
  }
  return absl::OkStatus();
}

void PackKeepBits(const FusedDropout& d, int64_t n, uint8_t* bits) {
  constexpr int64_t kBytes = 1 << 11;
  ParallelFor(n / 8, kBytes, [&](int64_t b, int64_t e) {
    std::array<uint8_t, 8 * kBytes> keep;
    for (int64_t lo = b; lo < e; lo += kBytes) {
      const int64_t hi = std::min(e, lo + kBytes);
      if (d.active) FillDropoutKeepMask(d.stream, d.base + 8 * lo, d.base + 8 * hi, keep.data());
      for (int64_t j = lo; j < hi; ++j) {
        uint32_t byte = 0;
        for (int k = 0; k < 8; ++k) byte |= static_cast<uint32_t>(!d.active || keep[8 * (j - lo) + k] != 0) << k;
        bits[j] = static_cast<uint8_t>(byte);
      }
    }
  });
}

namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs DropoutKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(const FusedDropout drop, DropoutOf(node, ctx, x.num_elements()));
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    // The mask is an output only when the node has one.
    ir::Tensor mask;
    if (WantsOutput(node, 1)) {
      ASSIGN_OR_RETURN(mask, AllocOutput(node, ctx, 1, ir::DType::kBool, x.dims()));
    }
    if (!drop.active) {
      if (mask.defined()) std::fill_n(mask.mutable_data<uint8_t>(), x.num_elements(), uint8_t{1});
      ASSIGN_OR_RETURN(ir::Tensor y, ViewOutput(node, ctx, 0, x, x.dims()));
      return std::vector<ir::Tensor>{y, mask};
    }
    const T scale = static_cast<T>(drop.scale);
    ASSIGN_OR_RETURN(ir::Tensor y, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
    const T* px = x.data<T>();
    T* py = y.mutable_data<T>();
    uint8_t* pm = mask.defined() ? mask.mutable_data<uint8_t>() : nullptr;
    ForEachKept(drop, x.num_elements(), [&](int64_t i, bool keep) {
      py[i] = keep ? px[i] * scale : T(0);
      if (pm != nullptr) pm[i] = keep;
    });
    return std::vector<ir::Tensor>{y, mask};
  });
}
REGISTER_CPU_KERNEL(kDropout, DropoutKernel);

}  // namespace
}  // namespace onnxpipe::cpu
