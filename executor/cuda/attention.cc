// AttentionGraphs: cuDNN SDPA forward/backward graphs built with the cuDNN frontend, cached per
// config. Only this file sees cuDNN and its frontend.
//
// Workspace layout (one caller buffer), each part 256-byte aligned: [cuDNN's workspace | with key
// padding: seq_len_q (B) int32, seq_len_kv (B) int32 | with a bias whose Sk is not a multiple of 8:
// the bias copied with rows padded to 8 elements, the 16-byte row alignment cuDNN's kernels load
// with]. cuDNN's padding mode wants query lengths too; they are all Sq (every query row is real).
// Everything is written on the stream each call, so a call is graph-capturable.
#include "executor/cuda/attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {

namespace fe = cudnn_frontend;

namespace {

// Tensor ids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias, kSeqQ, kSeqKV, kSeed, kOffset };

constexpr int64_t kAlign = 256;

std::vector<int64_t> Contiguous(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

bool UsesLengths(AttentionMask m) { return m == AttentionMask::kKeyLengths || m == AttentionMask::kKeyMask; }

absl::Status FrontendStatus(fe::error_t err, const char* what, const AttentionConfig& c) {
  if (err.is_good()) return absl::OkStatus();
  const std::string msg = absl::StrCat("cuDNN SDPA ", what, " for ", c.ToString(), ": ", err.get_message());
  switch (err.get_code()) {
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CudnnStatus(cudnnStatus_t s, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ", cudnnGetErrorString(s)));
}

}  // namespace

absl::StatusOr<AttentionConfig> AttentionConfig::Resolved() const {
  AttentionConfig c = *this;
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.value_dim == 0) c.value_dim = c.head_dim;
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("Attention: ", name, " is ", v, ", expected > 0"));
  };
  for (auto [name, v] : {std::pair<const char*, int64_t>{"batch", c.batch},
                         {"heads", c.heads},
                         {"kv_heads", c.kv_heads},
                         {"seq_q", c.seq_q},
                         {"seq_kv", c.seq_kv},
                         {"head_dim", c.head_dim},
                         {"value_dim", c.value_dim}}) {
    RETURN_IF_ERROR(positive(name, v));
  }
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: kv_heads ", c.kv_heads, " does not divide heads ", c.heads));
  }
  if (c.dtype != ir::DType::kBF16 && c.dtype != ir::DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: dtype ", std::string(ir::DTypeName(c.dtype)),
                                                   " is not supported by cuDNN SDPA; expected bf16 or f16 "
                                                   "(cast fp32 inputs to bf16)"));
  }
  for (auto [name, d] : {std::pair<const char*, int64_t>{"head_dim", c.head_dim}, {"value_dim", c.value_dim}}) {
    if (d % 8 != 0 || d > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("Attention: ", name, " is ", d, ", expected a multiple of 8 no larger than 256"));
    }
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: dropout is ", c.dropout, ", expected [0, 1)"));
  }
  if (!c.scale) c.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (!std::isfinite(*c.scale)) return absl::InvalidArgumentError("Attention: scale is not finite");
  if (c.mask == AttentionMask::kBias) {
    if (c.bias_rows == 0) c.bias_rows = c.seq_q;
    if (c.bias_rows == 1 && c.seq_q > 1) {
      // Measured on cuDNN 9.19: the forward broadcasts such a bias right, the backward's gradients
      // are wrong (normalised error ~1), with contiguous strides.
      return absl::UnimplementedError(
          "Attention: a bias broadcast over the queries (bias_rows 1) is not supported by cuDNN SDPA's "
          "backward; expand it to (..., Sq, Sk) or pass a key-padding mask as key lengths");
    }
    if ((c.bias_batch != 1 && c.bias_batch != c.batch) || (c.bias_heads != 1 && c.bias_heads != c.heads) ||
        (c.bias_rows != 1 && c.bias_rows != c.seq_q)) {
      return absl::InvalidArgumentError(absl::StrCat("Attention: bias dims (", c.bias_batch, ", ", c.bias_heads, ", ",
                                                     c.bias_rows, ", Sk), expected (1 or ", c.batch, ", 1 or ", c.heads,
                                                     ", 1 or ", c.seq_q, ", Sk)"));
    }
  } else {
    c.bias_batch = c.bias_heads = c.bias_rows = 1;
  }
  if (c.seq_kv > INT32_MAX) return absl::InvalidArgumentError("Attention: seq_kv exceeds int32");
  for (const std::vector<int64_t>* st : {&c.q_strides, &c.k_strides, &c.v_strides, &c.o_strides}) {
    if (!st->empty() && (st->size() != 4 || st->back() != 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Attention: strides (", absl::StrJoin(*st, ", "), "), expected 4 with the last 1"));
    }
  }
  return c;
}

std::string AttentionConfig::ToString() const {
  static constexpr const char* kMaskNames[] = {"none", "key_lengths", "key_mask", "bias"};
  std::string s =
      absl::StrCat("B", batch, " H", heads, "/", kv_heads, " Sq", seq_q, " Sk", seq_kv, " Dh", head_dim, " Dv",
                   value_dim, " ", std::string(ir::DTypeName(dtype)), " scale ", scale ? *scale : 0.0,
                   causal ? " causal" : "", " mask ", kMaskNames[static_cast<int>(mask)]);
  if (mask == AttentionMask::kBias) absl::StrAppend(&s, " (", bias_batch, ",", bias_heads, ",", bias_rows, ",Sk)");
  if (dropout > 0) absl::StrAppend(&s, " dropout ", dropout);
  const std::vector<int64_t>* strides[4] = {&q_strides, &k_strides, &v_strides, &o_strides};
  static constexpr const char* kOperands[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i)
    if (!strides[i]->empty()) absl::StrAppend(&s, " ", kOperands[i], "_strides ", absl::StrJoin(*strides[i], ","));
  return s;
}

namespace {

// Byte offsets into the workspace; -1 = absent.
struct WorkspaceLayout {
  int64_t cudnn_bytes = 0;
  int64_t seq_q = -1, seq_kv = -1;
  int64_t bias = -1;
  int64_t bias_row = 0;  // elements between bias rows (Sk, or Sk rounded up to 8)
  int64_t total = 0;

  WorkspaceLayout(const AttentionConfig& c, int64_t cudnn) : cudnn_bytes(cudnn), total(ir::AlignUp(cudnn, kAlign)) {
    if (UsesLengths(c.mask)) {
      seq_q = total;
      seq_kv = seq_q + ir::AlignUp(4 * c.batch, kAlign);
      total = seq_kv + ir::AlignUp(4 * c.batch, kAlign);
    }
    bias_row = (c.seq_kv + 7) / 8 * 8;
    if (c.mask == AttentionMask::kBias && bias_row != c.seq_kv) {
      bias = total;
      total += ir::AlignUp(c.bias_batch * c.bias_heads * c.bias_rows * bias_row * 2, kAlign);
    } else {
      bias_row = c.seq_kv;
    }
  }
};

}  // namespace

struct AttentionGraphs::Built {
  AttentionConfig config;
  std::shared_ptr<fe::graph::Graph> graph;
  WorkspaceLayout layout;
};

namespace {

// The graph parts forward and backward share: Q, K, V, and the mask, scale and dropout options.
struct CommonTensors {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, bias, seq_q, seq_kv, seed, offset;
};

// A tensor of `dims`, contiguous but for the last dim's rows, `row` elements apart (0 = dense).
// `strides` (non-empty) override the layout.
std::shared_ptr<fe::graph::Tensor_attributes> MakeTensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                         std::vector<int64_t> dims,
                                                         fe::DataType_t type = fe::DataType_t::NOT_SET,
                                                         int64_t row = 0, const std::vector<int64_t>& strides = {}) {
  std::vector<int64_t> padded = dims;
  if (row != 0) padded.back() = row;
  auto attrs = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
      strides.empty() ? Contiguous(padded) : strides);
  if (type != fe::DataType_t::NOT_SET) attrs.set_data_type(type);
  return g.tensor(attrs);
}

CommonTensors AddInputs(fe::graph::Graph& g, const AttentionConfig& c, const WorkspaceLayout& layout) {
  const fe::DataType_t io = c.dtype == ir::DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  g.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  CommonTensors t;
  const fe::DataType_t unset = fe::DataType_t::NOT_SET;
  t.q = MakeTensor(g, "Q", kQ, {c.batch, c.heads, c.seq_q, c.head_dim}, unset, 0, c.q_strides);
  t.k = MakeTensor(g, "K", kK, {c.batch, c.kv_heads, c.seq_kv, c.head_dim}, unset, 0, c.k_strides);
  t.v = MakeTensor(g, "V", kV, {c.batch, c.kv_heads, c.seq_kv, c.value_dim}, unset, 0, c.v_strides);
  if (c.mask == AttentionMask::kBias) {
    t.bias = MakeTensor(g, "bias", kBias, {c.bias_batch, c.bias_heads, c.bias_rows, c.seq_kv}, io, layout.bias_row);
  }
  if (layout.seq_q >= 0) {
    t.seq_q = MakeTensor(g, "seq_len_q", kSeqQ, {c.batch, 1, 1, 1}, fe::DataType_t::INT32);
    t.seq_kv = MakeTensor(g, "seq_len_kv", kSeqKV, {c.batch, 1, 1, 1}, fe::DataType_t::INT32);
  }
  if (c.dropout > 0) {
    t.seed = MakeTensor(g, "seed", kSeed, {1, 1, 1, 1}, fe::DataType_t::INT64);
    t.offset = MakeTensor(g, "offset", kOffset, {1, 1, 1, 1}, fe::DataType_t::INT64);
  }
  return t;
}

// Applies scale, causal, mask and dropout to SDPA_attributes or SDPA_backward_attributes.
template <typename Options>
void SetOptions(Options& o, const AttentionConfig& c, const CommonTensors& t) {
  o.set_attn_scale(static_cast<float>(*c.scale));
  if (c.causal) o.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (t.bias) o.set_bias(t.bias);
  if (t.seq_q) o.set_padding_mask(true).set_seq_len_q(t.seq_q).set_seq_len_kv(t.seq_kv);
  if (t.seed) o.set_dropout(static_cast<float>(c.dropout), t.seed, t.offset);
}

std::shared_ptr<fe::graph::Graph> ForwardGraph(const AttentionConfig& c, const WorkspaceLayout& layout) {
  auto g = std::make_shared<fe::graph::Graph>();
  const CommonTensors t = AddInputs(*g, c, layout);
  auto options = fe::graph::SDPA_attributes().set_name("attention_forward").set_generate_stats(true);
  SetOptions(options, c, t);
  auto [o, stats] = g->sdpa(t.q, t.k, t.v, options);
  const std::vector<int64_t> o_dims = {c.batch, c.heads, c.seq_q, c.value_dim};
  o->set_output(true).set_uid(kO).set_dim(o_dims).set_stride(c.o_strides.empty() ? Contiguous(o_dims) : c.o_strides);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> BackwardGraph(const AttentionConfig& c, const WorkspaceLayout& layout) {
  auto g = std::make_shared<fe::graph::Graph>();
  const CommonTensors t = AddInputs(*g, c, layout);
  const fe::DataType_t unset = fe::DataType_t::NOT_SET;
  auto o = MakeTensor(*g, "O", kO, {c.batch, c.heads, c.seq_q, c.value_dim}, unset, 0, c.o_strides);
  auto d_o = MakeTensor(*g, "dO", kDO, {c.batch, c.heads, c.seq_q, c.value_dim}, unset, 0, c.o_strides);
  auto stats = MakeTensor(*g, "stats", kStats, {c.batch, c.heads, c.seq_q, 1}, fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
  SetOptions(options, c, t);
  auto [dq, dk, dv] = g->sdpa_backward(t.q, t.k, t.v, o, d_o, stats, options);
  const std::vector<int64_t> dq_dims = {c.batch, c.heads, c.seq_q, c.head_dim};
  const std::vector<int64_t> dk_dims = {c.batch, c.kv_heads, c.seq_kv, c.head_dim};
  const std::vector<int64_t> dv_dims = {c.batch, c.kv_heads, c.seq_kv, c.value_dim};
  auto strides_of = [](const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
    return strides.empty() ? Contiguous(dims) : strides;
  };
  dq->set_output(true).set_uid(kDQ).set_dim(dq_dims).set_stride(strides_of(dq_dims, c.q_strides));
  dk->set_output(true).set_uid(kDK).set_dim(dk_dims).set_stride(strides_of(dk_dims, c.k_strides));
  dv->set_output(true).set_uid(kDV).set_dim(dv_dims).set_stride(strides_of(dv_dims, c.v_strides));
  return g;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionGraphs>> AttentionGraphs::Create() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("Attention: no CUDA device for cuDNN");
  cudnnHandle_t handle = nullptr;
  RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&handle), "cudnnCreate"));
  std::unique_ptr<AttentionGraphs> graphs(new AttentionGraphs());
  graphs->handle_ = handle;
  return graphs;
}

AttentionGraphs::~AttentionGraphs() {
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

absl::StatusOr<AttentionGraphs::Built*> AttentionGraphs::Get(bool backward, const AttentionConfig& config) {
  ASSIGN_OR_RETURN(const AttentionConfig c, config.Resolved());
  const std::string key = absl::StrCat(backward ? "bwd " : "fwd ", c.ToString());
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second.get();

  // The layout's cuDNN part is only known once built; the rest does not depend on it.
  const WorkspaceLayout shape_only(c, /*cudnn=*/0);
  std::shared_ptr<fe::graph::Graph> graph = backward ? BackwardGraph(c, shape_only) : ForwardGraph(c, shape_only);
  const char* what = backward ? "backward" : "forward";
  auto handle = static_cast<cudnnHandle_t>(handle_);
  RETURN_IF_ERROR(FrontendStatus(graph->build(handle, {fe::HeurMode_t::A}), what, c));
  int64_t cudnn_bytes = 0;
  RETURN_IF_ERROR(FrontendStatus(graph->get_workspace_size(cudnn_bytes), what, c));
  auto built = std::make_unique<Built>(Built{c, std::move(graph), WorkspaceLayout(c, cudnn_bytes)});
  return (graphs_[key] = std::move(built)).get();
}

absl::StatusOr<int64_t> AttentionGraphs::ForwardWorkspaceBytes(const AttentionConfig& config) {
  ASSIGN_OR_RETURN(const Built* b, Get(/*backward=*/false, config));
  return b->layout.total;
}

absl::StatusOr<int64_t> AttentionGraphs::BackwardWorkspaceBytes(const AttentionConfig& config) {
  ASSIGN_OR_RETURN(const Built* b, Get(/*backward=*/true, config));
  return b->layout.total;
}

namespace {

// Checks the mask, dropout and workspace arguments, writes the workspace's lengths and padded bias,
// and adds the mask/dropout tensors to `pack`. Returns the seq_len_kv pointer (null without key
// padding).
absl::StatusOr<const int32_t*> PrepareCommon(const AttentionConfig& c, const WorkspaceLayout& layout, const void* mask,
                                             const int64_t* seed, const int64_t* offset, char* workspace,
                                             int64_t workspace_bytes, cudaStream_t stream,
                                             std::unordered_map<int64_t, void*>& pack) {
  if (workspace_bytes < layout.total || (layout.total > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: workspace of ", workspace_bytes, " bytes",
                                                   workspace == nullptr ? " (null)" : "", ", expected ", layout.total,
                                                   " bytes for ", c.ToString()));
  }
  if (c.mask != AttentionMask::kNone && mask == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: no mask pointer for ", c.ToString()));
  }
  if (c.dropout > 0 && (seed == nullptr || offset == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: dropout ", c.dropout, " needs device seed and offset pointers"));
  }
  if (c.dropout > 0) {
    pack[kSeed] = const_cast<int64_t*>(seed);
    pack[kOffset] = const_cast<int64_t*>(offset);
  }
  if (c.mask == AttentionMask::kBias) {
    void* bias = const_cast<void*>(mask);
    if (layout.bias >= 0) {
      bias = workspace + layout.bias;
      const int64_t rows = c.bias_batch * c.bias_heads * c.bias_rows;
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bias, 0, rows * layout.bias_row * 2, stream));
      CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(bias, layout.bias_row * 2, mask, c.seq_kv * 2, c.seq_kv * 2, rows,
                                             cudaMemcpyDeviceToDevice, stream));
    }
    pack[kBias] = bias;
  }
  if (layout.seq_q < 0) return nullptr;
  auto* seq_q = reinterpret_cast<int32_t*>(workspace + layout.seq_q);
  CUDA_RETURN_IF_ERROR(LaunchFillLengths(seq_q, c.batch, static_cast<int32_t>(c.seq_q), stream));
  const int32_t* kv_lengths = static_cast<const int32_t*>(mask);
  if (c.mask == AttentionMask::kKeyMask) {
    auto* seq_kv = reinterpret_cast<int32_t*>(workspace + layout.seq_kv);
    CUDA_RETURN_IF_ERROR(LaunchKeyMaskToLengths(static_cast<const bool*>(mask), seq_kv, c.batch, c.seq_kv, stream));
    kv_lengths = seq_kv;
  }
  pack[kSeqQ] = seq_q;
  pack[kSeqKV] = const_cast<int32_t*>(kv_lengths);
  return kv_lengths;
}

absl::Status CheckPointers(std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (auto [name, p] : pointers) {
    if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat("Attention: ", name, " is null"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionGraphs::Forward(const AttentionConfig& config, const AttentionForwardArgs& a, void* workspace,
                                      int64_t workspace_bytes, cudaStream_t stream) {
  ASSIGN_OR_RETURN(const Built* built, Get(/*backward=*/false, config));
  const Built& b = *built;
  RETURN_IF_ERROR(CheckPointers({{"q", a.q}, {"k", a.k}, {"v", a.v}, {"o", a.o}, {"stats", a.stats}}));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)},
                                             {kK, const_cast<void*>(a.k)},
                                             {kV, const_cast<void*>(a.v)},
                                             {kO, a.o},
                                             {kStats, a.stats}};
  auto* ws = static_cast<char*>(workspace);
  RETURN_IF_ERROR(
      PrepareCommon(b.config, b.layout, a.mask, a.dropout_seed, a.dropout_offset, ws, workspace_bytes, stream, pack)
          .status());
  auto handle = static_cast<cudnnHandle_t>(handle_);
  RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(handle, stream), "cudnnSetStream"));
  return FrontendStatus(b.graph->execute(handle, pack, ws), "forward execution", b.config);
}

absl::Status AttentionGraphs::Backward(const AttentionConfig& config, const AttentionBackwardArgs& a, void* workspace,
                                       int64_t workspace_bytes, cudaStream_t stream) {
  ASSIGN_OR_RETURN(const Built* built, Get(/*backward=*/true, config));
  const Built& b = *built;
  RETURN_IF_ERROR(CheckPointers({{"q", a.q},
                                 {"k", a.k},
                                 {"v", a.v},
                                 {"o", a.o},
                                 {"stats", a.stats},
                                 {"d_o", a.d_o},
                                 {"dq", a.dq},
                                 {"dk", a.dk},
                                 {"dv", a.dv}}));
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)},
                                             {kK, const_cast<void*>(a.k)},
                                             {kV, const_cast<void*>(a.v)},
                                             {kO, const_cast<void*>(a.o)},
                                             {kDO, const_cast<void*>(a.d_o)},
                                             {kStats, const_cast<float*>(a.stats)},
                                             {kDQ, a.dq},
                                             {kDK, a.dk},
                                             {kDV, a.dv}};
  auto* ws = static_cast<char*>(workspace);
  ASSIGN_OR_RETURN(const int32_t* kv_lengths, PrepareCommon(b.config, b.layout, a.mask, a.dropout_seed,
                                                            a.dropout_offset, ws, workspace_bytes, stream, pack));
  auto handle = static_cast<cudnnHandle_t>(handle_);
  RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(handle, stream), "cudnnSetStream"));
  RETURN_IF_ERROR(FrontendStatus(b.graph->execute(handle, pack, ws), "backward execution", b.config));
  if (kv_lengths == nullptr) return absl::OkStatus();
  // Padded keys get no gradient, as on the CPU; cuDNN need not write those rows.
  const AttentionConfig& c = b.config;
  CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(a.dk, kv_lengths, c.batch, c.kv_heads, c.seq_kv, c.head_dim, 2, stream));
  CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(a.dv, kv_lengths, c.batch, c.kv_heads, c.seq_kv, c.value_dim, 2, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
