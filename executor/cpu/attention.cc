// Fused Attention: O = dropout(softmax(scale * Q K^T + mask [causal])) V per batch matrix.
//
// Shapes: Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), batch dims broadcast among them; the
// mask broadcasts to (..., Sq, Sk). Causal masking is top-left aligned (key j is visible from
// query i iff j <= i), as PyTorch's scaled_dot_product_attention(is_causal=True). A bool mask marks
// the keys that take part (true = attend). A row whose keys are all masked yields zeros (not NaN).
// `scale` defaults to 1/sqrt(Dh). Dropout on the probabilities uses the node's Philox stream
// (dropout.h) indexed by the flat position in (..., Sq, Sk), active only while training.
//
// Per batch matrix: one GEMM for the scores into a (Sq, Sk) scratch, the row softmax on the pool,
// one GEMM for the output.

#include "executor/cpu/attention_util.h"
#include "executor/cpu/dropout.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/workspace.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs AttentionKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& q = in[0];
  const ir::Tensor& k = in[1];
  const ir::Tensor& v = in[2];
  for (int i = 0; i < 3; ++i) {
    if (in[i].dtype() != q.dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has dtype " << ir::DTypeName(in[i].dtype())
                                << ", expected " << ir::DTypeName(q.dtype());
    }
  }
  ASSIGN_OR_RETURN(const AttentionShape shape, GetAttentionShape(node, q, k, v));
  const int64_t sq = shape.sq, dh = shape.dh, sk = shape.sk, dv = shape.dv, nbatch = shape.nbatch;
  const std::vector<int64_t>& batch = shape.batch;
  const size_t br = batch.size();
  const double scale = shape.scale, ratio = shape.ratio;
  const bool causal = shape.causal;
  const std::string mask_kind = node.attrs.Get<std::string>("mask_kind", "additive");
  const bool has_mask = HasInput(in, 3);
  std::vector<int64_t> full = batch;
  full.push_back(sq);
  full.push_back(sk);
  std::vector<int64_t> ms;  // mask strides over `full`
  bool bool_mask = false;
  if (has_mask) {
    const ir::Tensor& mask = in[3];
    if (mask_kind != "additive" && mask_kind != "bool") {
      return INVALID_ARGUMENT() << Describe(node) << ": mask_kind is '" << mask_kind
                                << "', expected 'additive' or 'bool'";
    }
    bool_mask = mask.dtype() == ir::DType::kBool;
    if (mask_kind == "bool" && !bool_mask) {
      return INVALID_ARGUMENT() << Describe(node) << ": mask_kind 'bool' needs a bool mask, got "
                                << ir::DTypeName(mask.dtype());
    }
    if (!bool_mask && mask.dtype() != q.dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": additive mask has dtype " << ir::DTypeName(mask.dtype())
                                << ", expected " << ir::DTypeName(q.dtype());
    }
    auto md = BroadcastDims(node, {mask.dims(), full});
    if (!md.ok() || *md != full) {
      return INVALID_ARGUMENT() << Describe(node) << ": mask of shape " << DimsToString(mask.dims())
                                << " does not broadcast to " << DimsToString(full);
    }
    ms = BroadcastStrides(mask.dims(), full.size());
  }
  const bool dropout = ctx.training && ratio > 0.0;
  const DropoutStream stream = MakeDropoutStream(node, ctx, ratio);
  ASSIGN_OR_RETURN(const int64_t counter_base, RandomCounterBase(node, ctx, nbatch * sq * sk));
  RETURN_IF_ERROR(CheckGemmSize(node, sq, sk, dh));
  RETURN_IF_ERROR(CheckGemmSize(node, sq, dv, sk));

  return DispatchDType(FloatTypes{}, node, "input 0", q.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, q.dtype(), shape.out_dims));
    ir::Tensor stats;  // (batch..., Sq) f32, when the node has the output
    if (WantsOutput(node, 1)) {
      std::vector<int64_t> dims = batch;
      dims.push_back(sq);
      ASSIGN_OR_RETURN(stats, AllocOutput(node, ctx, 1, ir::DType::kF32, dims));
    }
    if (out.num_elements() == 0) return std::vector<ir::Tensor>{out, stats};
    const T drop_scale = ratio >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - ratio));
    // The layout asks for the keep mask whenever the node has dropout, training or not, so the
    // workspace used is the planned one (workspace.h).
    const AttentionWorkspace layout = AttentionWorkspace::Forward(sq, sk, sizeof(T), ratio > 0.0);
    ASSIGN_OR_RETURN(Workspace ws, Workspace::Get(node, ctx, layout.total));
    T* probs = ws.at<T>(layout.probs);
    uint8_t* keep_all = ws.at<uint8_t>(layout.keep);
    for (int64_t t = 0; t < nbatch; ++t) {
      int64_t rem = t, mi = 0;
      for (int64_t d = static_cast<int64_t>(br) - 1; d >= 0 && has_mask; --d) {
        mi += (rem % batch[d]) * ms[d];
        rem /= batch[d];
      }
      T* s = probs;
      if (dh > 0) {
        Gemm<T>(false, true, sq, sk, dh, static_cast<T>(scale), q.data<T>() + MatrixOffset(shape, shape.q, t),
                shape.q.row, k.data<T>() + MatrixOffset(shape, shape.k, t), shape.k.row, T(0), s, sk);
      } else {
        std::fill(probs, probs + sq * sk, T(0));
      }
      const ScoreMask smask = has_mask ? ScoreMask{&in[3], bool_mask, mi, ms[br], ms[br + 1]} : ScoreMask{};
      ParallelFor(sq, std::max<int64_t>(1, 4096 / std::max<int64_t>(sk, 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          T* row = s + i * sk;
          float* lse = stats.defined() ? stats.mutable_data<float>() + t * sq + i : nullptr;
          if (!SoftmaxScoreRow(row, i, sk, causal, smask, lse)) continue;
          if (dropout) {
            const int64_t base = counter_base + (t * sq + i) * sk;
            uint8_t* keep = keep_all + i * sk;
            FillDropoutKeepMask(stream, base, base + sk, keep);
            for (int64_t j = 0; j < sk; ++j) row[j] = keep[j] ? row[j] * drop_scale : T(0);
          }
        }
      });
      Gemm<T>(false, false, sq, dv, sk, T(1), s, sk, v.data<T>() + MatrixOffset(shape, shape.v, t), shape.v.row, T(0),
              out.mutable_data<T>() + MatrixOffset(shape, shape.o, t), shape.o.row);
    }
    return std::vector<ir::Tensor>{out, stats};
  });
}
REGISTER_CPU_KERNEL(kAttention, AttentionKernel);

}  // namespace
}  // namespace onnxpipe::cpu
