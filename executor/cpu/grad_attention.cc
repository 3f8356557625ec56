// AttentionGrad(dO, Q, K, V, mask?) -> dQ, dK, dV, dMask?: the backward of the fused Attention kernel
// (attention.cc), with the same shapes, scale, causal/mask handling and dropout. Per batch matrix
// it recomputes the probabilities P (the forward saves nothing of size Sq x Sk), replays the
// forward's dropout keep mask, and runs
//   dV = D^T dO,  dD = dO V^T,  dP = dD * keep / (1 - ratio),  dS = P * (dP - rowsum(dP * P)),
//   dQ = scale dS K,  dK = scale dS^T Q,     with D = P * keep / (1 - ratio),
// five GEMMs through BLAS and the row work on the thread pool. Dropout replay: the node carries
// the forward node's `rng_key` (autodiff sets it), so MakeDropoutStream gives the forward's
// stream, and elements are indexed by the same flat position in (batch..., Sq, Sk). Operands whose
// batch dims were broadcast get their gradient summed back (ReduceToDims); grouped K and V (fewer
// heads than Q: grouped-query attention) sum their group's query heads as they go. dMask, for an additive
// mask that is a learned bias, is dS summed into the mask's shape in a fixed order (batch matrix,
// row, column), written straight into the output.

#include "executor/cpu/attention_util.h"
#include "executor/cpu/dropout.h"
#include "executor/cpu/grad_util.h"
#include "executor/cpu/workspace.h"
#include "frontend/ir/attention_views.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs AttentionGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dout = in[0];
  const ir::Tensor& q = in[1];
  const ir::Tensor& k = in[2];
  const ir::Tensor& v = in[3];
  for (int i = 0; i < 4; ++i) {
    if (in[i].dtype() != q.dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is " << ir::DTypeName(in[i].dtype())
                                << DimsToString(in[i].dims()) << ", expected " << ir::DTypeName(q.dtype());
    }
  }
  ASSIGN_OR_RETURN(const AttentionShape shape, GetAttentionShape(node, q, k, v));
  const int64_t sq = shape.sq, dh = shape.dh, sk = shape.sk, dv = shape.dv, nbatch = shape.nbatch;
  const std::vector<int64_t>& batch = shape.batch;
  const size_t br = batch.size();
  const double scale = shape.scale, ratio = shape.ratio;
  const bool causal = shape.causal;
  if (dout.dims() != shape.out_dims) {
    return INVALID_ARGUMENT() << Describe(node) << ": dO has shape " << DimsToString(dout.dims())
                              << ", expected the attention output's " << DimsToString(shape.out_dims);
  }
  const std::vector<int64_t>* const buffers[3] = {&q.dims(), &k.dims(), &v.dims()};
  RETURN_IF_ERROR(ir::CheckAttentionViewGradients(node, buffers, batch));
  const bool has_mask = HasInput(in, 4);
  std::vector<int64_t> full = batch;
  full.push_back(sq);
  full.push_back(sk);
  std::vector<int64_t> ms;
  bool bool_mask = false;
  if (has_mask) {
    const ir::Tensor& mask = in[4];
    bool_mask = mask.dtype() == ir::DType::kBool;
    if (!bool_mask && mask.dtype() != q.dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": additive mask has dtype " << ir::DTypeName(mask.dtype());
    }
    auto md = BroadcastDims(node, {mask.dims(), full});
    if (!md.ok() || *md != full) {
      return INVALID_ARGUMENT() << Describe(node) << ": mask of shape " << DimsToString(mask.dims())
                                << " does not broadcast to " << DimsToString(full);
    }
    ms = BroadcastStrides(mask.dims(), full.size());
  }
  if (WantsOutput(node, 3) && (!has_mask || bool_mask)) {
    return INVALID_ARGUMENT() << Describe(node) << ": dMask (output 3) needs an additive mask input";
  }
  const bool dropout = ctx.training && ratio > 0.0;
  const DropoutStream stream = MakeDropoutStream(node, ctx, ratio);
  ASSIGN_OR_RETURN(const int64_t counter_base, RandomCounterBase(node, ctx, nbatch * sq * sk));
  RETURN_IF_ERROR(CheckGemmSize(node, sq, sk, std::max(dh, dv)));
  RETURN_IF_ERROR(CheckGemmSize(node, sk, std::max(dh, dv), sq));
  auto wants = [&](size_t i) { return WantsOutput(node, i); };

  return DispatchDType(FloatTypes{}, node, "input 1", q.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    // K's and V's gradients have their operand's grouped head dim (the last batch dim over group).
    const int64_t group = shape.kv_group;
    auto with_batch = [&](int64_t a, int64_t b, int64_t heads_over = 1) {
      std::vector<int64_t> d = batch;
      if (heads_over > 1) d.back() /= heads_over;
      d.push_back(a);
      d.push_back(b);
      return d;
    };
    // dQ, dK, dV over the broadcast batch: the outputs themselves unless an input was broadcast
    // (then a temporary, summed back into the output by ReduceToDims below). Under views each is
    // written through its operand's view into its gradient slot's output (ir::CheckAttentionViewGradients).
    const std::vector<int64_t> full_dims[3] = {with_batch(sq, dh), with_batch(sk, dh, group),
                                               with_batch(sk, dv, group)};
    const MatrixLayout dense[3] = {DenseLayout(shape, sq, dh), DenseLayout(shape, sk, dh, group),
                                   DenseLayout(shape, sk, dv, group)};
    ir::Tensor fulls[3];
    const MatrixLayout* at[3] = {&dense[0], &dense[1], &dense[2]};
    for (int i = 0; i < 3; ++i) {
      const int slot = ir::AttentionGradSlot(node, i);
      if (!wants(slot)) continue;
      if (shape.views) {
        if (slot == i) {
          ASSIGN_OR_RETURN(fulls[i], AllocOutput(node, ctx, i, q.dtype(), in[i + 1].dims()));
        }
        fulls[i] = fulls[slot];
        at[i] = i == 0 ? &shape.q : i == 1 ? &shape.k : &shape.v;
      } else if (full_dims[i] == in[i + 1].dims()) {
        ASSIGN_OR_RETURN(fulls[i], AllocOutput(node, ctx, i, q.dtype(), full_dims[i]));
      } else {
        fulls[i] = ir::Tensor(q.dtype(), full_dims[i]);
      }
    }
    auto grad_at = [&](int i, int64_t t) { return fulls[i].mutable_data<T>() + MatrixOffset(shape, *at[i], t); };
    auto wants_grad = [&](int i) { return ir::AttentionGradWanted(node, i); };
    // Grouped K and V: the query heads of a group are consecutive batch matrices; the first writes
    // the group's dK and dV, the others add to them (a fixed order: deterministic).
    auto kv_beta = [&](int64_t t) { return group > 1 && t % batch.back() % group != 0 ? T(1) : T(0); };
    ir::Tensor dmask;
    if (wants(3)) {
      ASSIGN_OR_RETURN(dmask, AllocOutput(node, ctx, 3, q.dtype(), in[4].dims()));
      std::fill(dmask.mutable_data<T>(), dmask.mutable_data<T>() + dmask.num_elements(), T(0));
    }
    const T drop_scale = ratio >= 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - ratio));
    // Planned scratch (workspace.h): asked with the node's dropout, training or not.
    const AttentionWorkspace layout = AttentionWorkspace::Backward(sq, sk, sizeof(T), ratio > 0.0, wants_grad(2));
    ASSIGN_OR_RETURN(Workspace ws, Workspace::Get(node, ctx, layout.total));
    T* p = ws.at<T>(layout.probs);
    T* dp = ws.at<T>(layout.grad);
    uint8_t* keep = ws.at<uint8_t>(layout.keep);
    for (int64_t t = 0; t < nbatch; ++t) {
      int64_t rem = t, mi = 0;
      for (int64_t d = static_cast<int64_t>(br) - 1; d >= 0 && has_mask; --d) {
        mi += (rem % batch[d]) * ms[d];
        rem /= batch[d];
      }
      const T* qt = q.data<T>() + MatrixOffset(shape, shape.q, t);
      const T* kt = k.data<T>() + MatrixOffset(shape, shape.k, t);
      const T* vt = v.data<T>() + MatrixOffset(shape, shape.v, t);
      const T* dot = dout.data<T>() + MatrixOffset(shape, shape.o, t);
      const int64_t lq = shape.q.row, lk = shape.k.row, lv = shape.v.row, lo = shape.o.row;
      // P, recomputed exactly as the forward does.
      if (dh > 0) {
        Gemm<T>(false, true, sq, sk, dh, static_cast<T>(scale), qt, lq, kt, lk, T(0), p, sk);
      } else {
        std::fill(p, p + sq * sk, T(0));
      }
      const ScoreMask smask = has_mask ? ScoreMask{&in[4], bool_mask, mi, ms[br], ms[br + 1]} : ScoreMask{};
      ParallelFor(sq, std::max<int64_t>(1, 4096 / std::max<int64_t>(sk, 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          T* row = p + i * sk;
          if (!SoftmaxScoreRow(row, i, sk, causal, smask)) continue;
          if (dropout) {
            const int64_t base = counter_base + (t * sq + i) * sk;
            FillDropoutKeepMask(stream, base, base + sk, keep + i * sk);
          }
        }
      });
      // dD = dO V^T (into dp).
      Gemm<T>(false, true, sq, sk, dv, T(1), dot, lo, vt, lv, T(0), dp, sk);
      if (wants_grad(2)) {
        // dV = D^T dO: form D in place of dp's partner buffer only when dropout changes P.
        if (dropout) {
          T* dmat = ws.at<T>(layout.dropped);
          for (int64_t x = 0; x < sq * sk; ++x) dmat[x] = keep[x] ? p[x] * drop_scale : T(0);
          Gemm<T>(true, false, sk, dv, sq, T(1), dmat, sk, dot, lo, kv_beta(t), grad_at(2, t), at[2]->row);
        } else {
          Gemm<T>(true, false, sk, dv, sq, T(1), p, sk, dot, lo, kv_beta(t), grad_at(2, t), at[2]->row);
        }
      }
      // dS = P * (dP - rowsum(dP * P)), dP = dD * keep * drop_scale (in place in dp).
      ParallelFor(sq, std::max<int64_t>(1, 4096 / std::max<int64_t>(sk, 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          T* g = dp + i * sk;
          const T* pr = p + i * sk;
          if (dropout) {
            const uint8_t* kr = keep + i * sk;
            for (int64_t j = 0; j < sk; ++j) g[j] = kr[j] ? g[j] * drop_scale : T(0);
          }
          double s = 0;
          for (int64_t j = 0; j < sk; ++j) s += static_cast<double>(g[j]) * pr[j];
          for (int64_t j = 0; j < sk; ++j) g[j] = static_cast<T>(pr[j] * (g[j] - s));
        }
      });
      if (wants(3)) {
        // S = scale Q K^T + mask: the mask's gradient is dS itself, summed where the mask broadcasts.
        T* pm = dmask.mutable_data<T>();
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < sk; ++j) pm[mi + i * ms[br] + j * ms[br + 1]] += dp[i * sk + j];
      }
      if (wants_grad(0) && dh > 0) {
        Gemm<T>(false, false, sq, dh, sk, static_cast<T>(scale), dp, sk, kt, lk, T(0), grad_at(0, t), at[0]->row);
      }
      if (wants_grad(1) && dh > 0) {
        Gemm<T>(true, false, sk, dh, sq, static_cast<T>(scale), dp, sk, qt, lq, kv_beta(t), grad_at(1, t),
                at[1]->row);
      }
    }
    std::vector<ir::Tensor> outs(4);
    outs[3] = dmask;
    for (int i = 0; i < 3; ++i) {
      if (!wants(i)) continue;
      if (shape.views || full_dims[i] == in[i + 1].dims()) {
        outs[i] = fulls[i];
      } else {
        ASSIGN_OR_RETURN(outs[i], ReduceToDims(node, ctx, i, fulls[i], in[i + 1].dims()));
      }
    }
    return outs;
  });
}
REGISTER_CPU_KERNEL(kAttentionGrad, AttentionGradKernel);

}  // namespace
}  // namespace onnxpipe::cpu
