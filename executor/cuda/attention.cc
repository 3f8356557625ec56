// AttentionGraphs: cuDNN SDPA forward/backward graphs built with the cuDNN frontend, cached per
// config. Only this file sees cuDNN and its frontend.
//
// Workspace layout (one caller buffer): [cuDNN's workspace | seq_len_q (B) int32 | seq_len_kv (B)
// int32], each part 256-byte aligned. cuDNN's padding mode wants query lengths too; they are all Sq
// (every query row is real), written by a small kernel each call so the call is graph-capturable.
#include "executor/cuda/attention.h"

#include <cmath>
#include <utility>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"

namespace onnxpipe::cuda {

namespace fe = cudnn_frontend;

namespace {

// Tensor ids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kBias, kSeqQ, kSeqKV, kSeed, kOffset };

constexpr int64_t kAlign = 256;
int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

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
  for (auto [name, v] : {std::pair<const char*, int64_t>{"batch", c.batch}, {"heads", c.heads},
                         {"kv_heads", c.kv_heads}, {"seq_q", c.seq_q}, {"seq_kv", c.seq_kv},
                         {"head_dim", c.head_dim}, {"value_dim", c.value_dim}}) {
    if (absl::Status s = positive(name, v); !s.ok()) return s;
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
    if ((c.bias_batch != 1 && c.bias_batch != c.batch) || (c.bias_heads != 1 && c.bias_heads != c.heads)) {
      return absl::InvalidArgumentError(absl::StrCat("Attention: bias dims (", c.bias_batch, ", ", c.bias_heads,
                                                     ", Sq, Sk) expected (1 or ", c.batch, ", 1 or ", c.heads,
                                                     ", Sq, Sk)"));
    }
  } else {
    c.bias_batch = c.bias_heads = 1;
  }
  if (c.seq_kv > INT32_MAX) return absl::InvalidArgumentError("Attention: seq_kv exceeds int32");
  return c;
}

std::string AttentionConfig::ToString() const {
  static constexpr const char* kMaskNames[] = {"none", "key_lengths", "key_mask", "bias"};
  std::string s = absl::StrCat("B", batch, " H", heads, "/", kv_heads, " Sq", seq_q, " Sk", seq_kv, " Dh", head_dim,
                               " Dv", value_dim, " ", std::string(ir::DTypeName(dtype)), " scale ", scale ? *scale : 0.0,
                               causal ? " causal" : "", " mask ", kMaskNames[static_cast<int>(mask)]);
  if (mask == AttentionMask::kBias) absl::StrAppend(&s, " (", bias_batch, ",", bias_heads, ",Sq,Sk)");
  if (dropout > 0) absl::StrAppend(&s, " dropout ", dropout);
  return s;
}

struct AttentionGraphs::Built {
  AttentionConfig config;
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t cudnn_bytes = 0;     // cuDNN's part of the workspace
  int64_t lengths_offset = 0;  // seq_len_q at this offset, seq_len_kv one aligned block further
  int64_t total_bytes = 0;
};

namespace {

// The graph parts forward and backward share: Q, K, V, and the mask, scale and dropout options.
struct CommonTensors {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, bias, seq_q, seq_kv, seed, offset;
};

std::shared_ptr<fe::graph::Tensor_attributes> MakeTensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                         std::vector<int64_t> dims,
                                                         fe::DataType_t type = fe::DataType_t::NOT_SET) {
  auto attrs = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(Contiguous(dims));
  if (type != fe::DataType_t::NOT_SET) attrs.set_data_type(type);
  return g.tensor(attrs);
}

CommonTensors AddInputs(fe::graph::Graph& g, const AttentionConfig& c) {
  const fe::DataType_t io = c.dtype == ir::DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  g.set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  CommonTensors t;
  t.q = MakeTensor(g, "Q", kQ, {c.batch, c.heads, c.seq_q, c.head_dim});
  t.k = MakeTensor(g, "K", kK, {c.batch, c.kv_heads, c.seq_kv, c.head_dim});
  t.v = MakeTensor(g, "V", kV, {c.batch, c.kv_heads, c.seq_kv, c.value_dim});
  if (c.mask == AttentionMask::kBias) {
    t.bias = MakeTensor(g, "bias", kBias, {c.bias_batch, c.bias_heads, c.seq_q, c.seq_kv}, io);
  }
  if (UsesLengths(c.mask)) {
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

std::shared_ptr<fe::graph::Graph> ForwardGraph(const AttentionConfig& c) {
  auto g = std::make_shared<fe::graph::Graph>();
  const CommonTensors t = AddInputs(*g, c);
  auto options = fe::graph::SDPA_attributes().set_name("attention_forward").set_generate_stats(true);
  SetOptions(options, c, t);
  auto [o, stats] = g->sdpa(t.q, t.k, t.v, options);
  const std::vector<int64_t> o_dims = {c.batch, c.heads, c.seq_q, c.value_dim};
  o->set_output(true).set_uid(kO).set_dim(o_dims).set_stride(Contiguous(o_dims));
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> BackwardGraph(const AttentionConfig& c) {
  auto g = std::make_shared<fe::graph::Graph>();
  const CommonTensors t = AddInputs(*g, c);
  auto o = MakeTensor(*g, "O", kO, {c.batch, c.heads, c.seq_q, c.value_dim});
  auto d_o = MakeTensor(*g, "dO", kDO, {c.batch, c.heads, c.seq_q, c.value_dim});
  auto stats = MakeTensor(*g, "stats", kStats, {c.batch, c.heads, c.seq_q, 1}, fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
  SetOptions(options, c, t);
  auto [dq, dk, dv] = g->sdpa_backward(t.q, t.k, t.v, o, d_o, stats, options);
  const std::vector<int64_t> dq_dims = {c.batch, c.heads, c.seq_q, c.head_dim};
  const std::vector<int64_t> dk_dims = {c.batch, c.kv_heads, c.seq_kv, c.head_dim};
  const std::vector<int64_t> dv_dims = {c.batch, c.kv_heads, c.seq_kv, c.value_dim};
  dq->set_output(true).set_uid(kDQ).set_dim(dq_dims).set_stride(Contiguous(dq_dims));
  dk->set_output(true).set_uid(kDK).set_dim(dk_dims).set_stride(Contiguous(dk_dims));
  dv->set_output(true).set_uid(kDV).set_dim(dv_dims).set_stride(Contiguous(dv_dims));
  return g;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionGraphs>> AttentionGraphs::Create() {
  if (DeviceCount() == 0) return absl::FailedPreconditionError("Attention: no CUDA device for cuDNN");
  cudnnHandle_t handle = nullptr;
  if (absl::Status s = CudnnStatus(cudnnCreate(&handle), "cudnnCreate"); !s.ok()) return s;
  std::unique_ptr<AttentionGraphs> graphs(new AttentionGraphs());
  graphs->handle_ = handle;
  return graphs;
}

AttentionGraphs::~AttentionGraphs() {
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

absl::StatusOr<AttentionGraphs::Built*> AttentionGraphs::Get(bool backward, const AttentionConfig& config) {
  absl::StatusOr<AttentionConfig> resolved = config.Resolved();
  if (!resolved.ok()) return resolved.status();
  const AttentionConfig& c = *resolved;
  const std::string key = absl::StrCat(backward ? "bwd " : "fwd ", c.ToString());
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second.get();

  auto built = std::make_unique<Built>();
  built->config = c;
  built->graph = backward ? BackwardGraph(c) : ForwardGraph(c);
  const char* what = backward ? "backward" : "forward";
  auto handle = static_cast<cudnnHandle_t>(handle_);
  if (absl::Status s = FrontendStatus(built->graph->build(handle, {fe::HeurMode_t::A}), what, c); !s.ok()) return s;
  if (absl::Status s = FrontendStatus(built->graph->get_workspace_size(built->cudnn_bytes), what, c); !s.ok()) {
    return s;
  }
  built->lengths_offset = AlignUp(built->cudnn_bytes);
  built->total_bytes = built->lengths_offset + (UsesLengths(c.mask) ? 2 * AlignUp(4 * c.batch) : 0);
  return (graphs_[key] = std::move(built)).get();
}

absl::StatusOr<int64_t> AttentionGraphs::ForwardWorkspaceBytes(const AttentionConfig& config) {
  absl::StatusOr<Built*> b = Get(/*backward=*/false, config);
  if (!b.ok()) return b.status();
  return (*b)->total_bytes;
}

absl::StatusOr<int64_t> AttentionGraphs::BackwardWorkspaceBytes(const AttentionConfig& config) {
  absl::StatusOr<Built*> b = Get(/*backward=*/true, config);
  if (!b.ok()) return b.status();
  return (*b)->total_bytes;
}

namespace {

// Checks the pointers and workspace, writes the lengths and adds the mask/dropout tensors to `pack`.
// Returns the seq_len_kv pointer (null without key padding).
absl::StatusOr<const int32_t*> PrepareCommon(const AttentionConfig& c, const void* mask, const int64_t* seed,
                                             const int64_t* offset, char* workspace, int64_t workspace_bytes,
                                             int64_t need_bytes, int64_t lengths_offset, cudaStream_t stream,
                                             std::unordered_map<int64_t, void*>& pack) {
  if (workspace_bytes < need_bytes || (need_bytes > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: workspace of ", workspace_bytes, " bytes",
                                                   workspace == nullptr ? " (null)" : "", ", expected ", need_bytes,
                                                   " bytes for ", c.ToString()));
  }
  if (c.mask != AttentionMask::kNone && mask == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: no mask pointer for ", c.ToString()));
  }
  if (c.dropout > 0 && (seed == nullptr || offset == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: dropout ", c.dropout, " needs device seed and offset pointers"));
  }
  if (c.mask == AttentionMask::kBias) pack[kBias] = const_cast<void*>(mask);
  if (c.dropout > 0) {
    pack[kSeed] = const_cast<int64_t*>(seed);
    pack[kOffset] = const_cast<int64_t*>(offset);
  }
  if (!UsesLengths(c.mask)) return nullptr;
  auto* seq_q = reinterpret_cast<int32_t*>(workspace + lengths_offset);
  auto* seq_kv = reinterpret_cast<int32_t*>(workspace + lengths_offset + AlignUp(4 * c.batch));
  CUDA_RETURN_IF_ERROR(LaunchFillLengths(seq_q, c.batch, static_cast<int32_t>(c.seq_q), stream));
  const int32_t* kv_lengths = static_cast<const int32_t*>(mask);
  if (c.mask == AttentionMask::kKeyMask) {
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
  absl::StatusOr<Built*> built = Get(/*backward=*/false, config);
  if (!built.ok()) return built.status();
  const Built& b = **built;
  if (absl::Status s = CheckPointers({{"q", a.q}, {"k", a.k}, {"v", a.v}, {"o", a.o}, {"stats", a.stats}}); !s.ok()) {
    return s;
  }
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)}, {kK, const_cast<void*>(a.k)},
                                             {kV, const_cast<void*>(a.v)}, {kO, a.o}, {kStats, a.stats}};
  auto* ws = static_cast<char*>(workspace);
  absl::StatusOr<const int32_t*> lengths = PrepareCommon(b.config, a.mask, a.dropout_seed, a.dropout_offset, ws,
                                                         workspace_bytes, b.total_bytes, b.lengths_offset, stream, pack);
  if (!lengths.ok()) return lengths.status();
  auto handle = static_cast<cudnnHandle_t>(handle_);
  if (absl::Status s = CudnnStatus(cudnnSetStream(handle, stream), "cudnnSetStream"); !s.ok()) return s;
  return FrontendStatus(b.graph->execute(handle, pack, ws), "forward execution", b.config);
}

absl::Status AttentionGraphs::Backward(const AttentionConfig& config, const AttentionBackwardArgs& a, void* workspace,
                                       int64_t workspace_bytes, cudaStream_t stream) {
  absl::StatusOr<Built*> built = Get(/*backward=*/true, config);
  if (!built.ok()) return built.status();
  const Built& b = **built;
  if (absl::Status s = CheckPointers({{"q", a.q}, {"k", a.k}, {"v", a.v}, {"o", a.o}, {"stats", a.stats},
                                      {"d_o", a.d_o}, {"dq", a.dq}, {"dk", a.dk}, {"dv", a.dv}});
      !s.ok()) {
    return s;
  }
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(a.q)},          {kK, const_cast<void*>(a.k)},    {kV, const_cast<void*>(a.v)},
      {kO, const_cast<void*>(a.o)},          {kDO, const_cast<void*>(a.d_o)}, {kStats, const_cast<float*>(a.stats)},
      {kDQ, a.dq}, {kDK, a.dk}, {kDV, a.dv}};
  auto* ws = static_cast<char*>(workspace);
  absl::StatusOr<const int32_t*> lengths = PrepareCommon(b.config, a.mask, a.dropout_seed, a.dropout_offset, ws,
                                                         workspace_bytes, b.total_bytes, b.lengths_offset, stream, pack);
  if (!lengths.ok()) return lengths.status();
  auto handle = static_cast<cudnnHandle_t>(handle_);
  if (absl::Status s = CudnnStatus(cudnnSetStream(handle, stream), "cudnnSetStream"); !s.ok()) return s;
  if (absl::Status s = FrontendStatus(b.graph->execute(handle, pack, ws), "backward execution", b.config); !s.ok()) {
    return s;
  }
  if (*lengths == nullptr) return absl::OkStatus();
  // Padded keys get no gradient, as on the CPU; cuDNN need not write those rows.
  const AttentionConfig& c = b.config;
  CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(a.dk, *lengths, c.batch, c.kv_heads, c.seq_kv, c.head_dim, 2, stream));
  CUDA_RETURN_IF_ERROR(LaunchZeroPaddedRows(a.dv, *lengths, c.batch, c.kv_heads, c.seq_kv, c.value_dim, 2, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
