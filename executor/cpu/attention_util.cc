#include "executor/cpu/attention_util.h"

#include "frontend/ir/attention_views.h"

namespace onnxpipe::cpu {
namespace {

// The layout of a view (rank >= 2) whose batch dims broadcast to `batch`.
MatrixLayout LayoutOf(const ir::StridedView& v, size_t batch_rank) {
  MatrixLayout m;
  m.offset = v.offset;
  const size_t r = v.dims.size();
  m.row = v.strides[r - 2];
  m.batch_strides.assign(batch_rank, 0);
  for (size_t d = 0; d + 2 < r; ++d)
    if (v.dims[d] != 1) m.batch_strides[batch_rank - (r - 2) + d] = v.strides[d];
  return m;
}

}  // namespace

absl::StatusOr<AttentionShape> GetAttentionShape(const ir::Node& node, const ir::Tensor& q, const ir::Tensor& k,
                                                 const ir::Tensor& v) {
  AttentionShape a;
  ir::StridedView views[3];
  const ir::Tensor* buffers[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(views[i], ir::AttentionOperandView(node, i, buffers[i]->dims()));
    if (views[i].dims.size() < 2) {
      return INVALID_ARGUMENT() << Describe(node) << ": operand " << i << " must have rank >= 2, got "
                                << DimsToString(views[i].dims);
    }
  }
  const std::vector<int64_t>&qd = views[0].dims, &kd = views[1].dims, &vd = views[2].dims;
  a.views = ir::HasAttentionViews(node);
  a.sq = qd[qd.size() - 2], a.dh = qd.back();
  a.sk = kd[kd.size() - 2], a.dv = vd.back();
  if (kd.back() != a.dh || vd[vd.size() - 2] != a.sk) {
    return INVALID_ARGUMENT() << Describe(node) << ": expected Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), got "
                              << DimsToString(qd) << ", " << DimsToString(kd) << ", " << DimsToString(vd);
  }
  auto batch_of = [](const std::vector<int64_t>& d) { return std::vector<int64_t>(d.begin(), d.end() - 2); };
  a.kv_group = ir::AttentionKvGroup(qd, kd, vd);
  ASSIGN_OR_RETURN(a.batch, BroadcastDims(node, {batch_of(qd), ir::UngroupedBatch(batch_of(kd), a.kv_group),
                                                 ir::UngroupedBatch(batch_of(vd), a.kv_group)}));
  const size_t br = a.batch.size();
  for (int64_t d : a.batch) a.nbatch *= d;
  MatrixLayout* layouts[3] = {&a.q, &a.k, &a.v};
  for (int i = 0; i < 3; ++i) *layouts[i] = LayoutOf(views[i], br);
  a.k.head_group = a.v.head_group = a.kv_group;
  std::vector<int64_t> o_dims = a.batch;
  o_dims.push_back(a.sq);
  o_dims.push_back(a.dv);
  a.out_dims = ir::AttentionOutputDims(node, o_dims);
  ASSIGN_OR_RETURN(const ir::StridedView o, ir::AttentionOutputView(node, a.out_dims));
  if (o.dims != o_dims) {
    return INVALID_ARGUMENT() << Describe(node) << ": o_view has dims " << DimsToString(o.dims)
                              << ", expected the attention output's " << DimsToString(o_dims);
  }
  a.o = LayoutOf(o, br);
  a.scale = node.attrs.Get<double>("scale", a.dh > 0 ? 1.0 / std::sqrt(static_cast<double>(a.dh)) : 1.0);
  a.causal = node.attrs.Get<int64_t>("causal", 0) != 0;
  a.ratio = node.attrs.Get<double>("dropout", 0.0);
  if (!(a.ratio >= 0.0 && a.ratio <= 1.0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": dropout is " << a.ratio << ", expected [0, 1]";
  }
  return a;
}

MatrixLayout DenseLayout(const AttentionShape& a, int64_t rows, int64_t cols, int64_t group) {
  MatrixLayout m;
  m.row = cols;
  m.head_group = group;
  m.batch_strides.assign(a.batch.size(), 0);
  int64_t stride = rows * cols;
  for (size_t d = a.batch.size(); d-- > 0;) {
    m.batch_strides[d] = stride;
    stride *= d + 1 == a.batch.size() ? a.batch[d] / group : a.batch[d];
  }
  return m;
}

int64_t MatrixOffset(const AttentionShape& a, const MatrixLayout& m, int64_t t) {
  int64_t at = m.offset;
  for (size_t d = a.batch.size(); d-- > 0;) {
    const int64_t idx = t % a.batch[d];
    at += (d + 1 == a.batch.size() ? idx / m.head_group : idx) * m.batch_strides[d];
    t /= a.batch[d];
  }
  return at;
}

}  // namespace onnxpipe::cpu
