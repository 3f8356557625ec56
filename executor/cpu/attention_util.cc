#include "executor/cpu/attention_util.h"

namespace onnxpipe::cpu {

absl::StatusOr<AttentionShape> GetAttentionShape(const ir::Node& node, const ir::Tensor& q, const ir::Tensor& k,
                                                 const ir::Tensor& v) {
  AttentionShape a;
  a.sq = q.dims()[q.rank() - 2], a.dh = q.dims()[q.rank() - 1];
  a.sk = k.dims()[k.rank() - 2], a.dv = v.dims()[v.rank() - 1];
  if (k.dims()[k.rank() - 1] != a.dh || v.dims()[v.rank() - 2] != a.sk) {
    return INVALID_ARGUMENT() << Describe(node) << ": expected Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), got "
                              << DimsToString(q.dims()) << ", " << DimsToString(k.dims()) << ", "
                              << DimsToString(v.dims());
  }
  auto batch_of = [](const ir::Tensor& t) { return std::vector<int64_t>(t.dims().begin(), t.dims().end() - 2); };
  ASSIGN_OR_RETURN(a.batch, BroadcastDims(node, {batch_of(q), batch_of(k), batch_of(v)}));
  const size_t br = a.batch.size();
  for (int64_t d : a.batch) a.nbatch *= d;
  a.qs = BroadcastStrides(batch_of(q), br), a.ks = BroadcastStrides(batch_of(k), br);
  a.vs = BroadcastStrides(batch_of(v), br);
  a.scale = node.attrs.Get<double>("scale", a.dh > 0 ? 1.0 / std::sqrt(static_cast<double>(a.dh)) : 1.0);
  a.causal = node.attrs.Get<int64_t>("causal", 0) != 0;
  a.ratio = node.attrs.Get<double>("dropout", 0.0);
  if (!(a.ratio >= 0.0 && a.ratio <= 1.0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": dropout is " << a.ratio << ", expected [0, 1]";
  }
  return a;
}

}  // namespace onnxpipe::cpu
