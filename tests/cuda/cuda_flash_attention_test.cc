// The fused fp32 attention of the CUDA backend (attention_kernels.cc over flash_attention.h)
// against the CPU backend's Attention and AttentionGrad kernels on the same inputs and ExecContext:
// O, dQ, dK, dV within a normalised error of 1e-5 (max |gpu - cpu| over max |cpu|, no NaN) over
// Sq != Sk, head dims 8 to 128 (Dv != Dh, sizes off the 64-wide tiles, dims off the 4-wide vectors),
// broadcast batch operands, additive and bool masks of several broadcast shapes with fully masked
// rows, causal with and without a mask, dropout (the CPU's keep mask, also at a micro-batch row
// offset), inference, and gradients not asked for. Every case runs unplanned (temporary scratch)
// and planned (a workspace of exactly what CudaBackend::WorkspaceBytes reported) and must not fall
// back to the host. fp64 through the kernel API against the CPU's fp64 to 1e-12. bf16 (the
// tensor-core kernels) against the CPU's fp32 on the bf16 values to a normalised 1e-2, and its
// dropout's zeros element for element. Nodes with views (a packed QKV buffer read and O written
// through strides, AttentionGrad's one packed gradient) in fp32 and bf16. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/flash_attention.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/status.h"
#include "frontend/ir/strided_view.h"
#include "gmock/gmock.h"
#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"
#include "tests/cuda/planned_outputs.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Rand;
using ir::DType;
using ir::Tensor;

// max |got - want| <= tol * max |want|, no NaN where want has none.
::testing::AssertionResult Close(const Tensor& got, const Tensor& want, double tol) {
  if (got.dims() != want.dims()) return ::testing::AssertionFailure() << "dims differ";
  double max_err = 0, max_ref = 0;
  int64_t worst = -1;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (std::isnan(g) && !std::isnan(w)) return ::testing::AssertionFailure() << "NaN at element " << i;
    const double err = std::abs(g - w);
    if (err > max_err) {
      max_err = err;
      worst = i;
    }
    max_ref = std::max(max_ref, std::abs(w));
  }
  if (max_err <= tol * max_ref || max_err == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |gpu - cpu| " << max_err << " at element " << worst << " (gpu "
                                       << got.GetAsDouble(worst) << ", cpu " << want.GetAsDouble(worst)
                                       << "), max |cpu| " << max_ref << ", normalised " << max_err / max_ref;
}

// A mask broadcasting to (..., Sq, Sk): additive values in [-3, 0] with some -inf, or bools (a
// third false). Row 0 of the last two dims is masked entirely when `masked_row` (with a (.., 1, Sk)
// mask that is every query of batch 0).
Tensor MakeMask(const std::vector<int64_t>& dims, DType dtype, uint32_t seed, bool masked_row) {
  const Tensor r = Rand(DType::kF32, dims, seed, 0.0, 1.0);
  Tensor m(dtype, dims);
  const int64_t sk = dims.back();
  for (int64_t i = 0; i < r.num_elements(); ++i) {
    const float u = r.data<float>()[i];
    const bool off = (masked_row && i < sk) || u < 0.1f;
    if (dtype == DType::kBool) {
      m.mutable_data<bool>()[i] = !(off || u < 0.33f);
    } else {
      m.mutable_data<float>()[i] = off ? -std::numeric_limits<float>::infinity() : -3.f * u;
    }
  }
  return m;
}

struct Case {
  std::string name;
  std::vector<int64_t> q, k, v;
  std::vector<int64_t> mask = {};  // empty: none
  DType mask_dtype = DType::kF32;  // kF32: additive; kBool
  std::string mask_kind = "";      // the attribute; empty: absent ("additive")
  bool causal = false;
  double dropout = 0.0;
  std::optional<double> scale = std::nullopt;
  bool masked_row = false;
  backend::ExecContext ctx = {.training = true, .seed = 11, .offset = 3};
  std::vector<int> absent_grads = {};  // AttentionGrad outputs the node does not have
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class FlashAttentionBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {.attention = AttentionImpl::kFlash});
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
  }

  int64_t Fallbacks(const std::string& op) const {
    const std::map<std::string, int64_t> f = be_->HostFallbacks();
    auto it = f.find(op);
    return it == f.end() ? 0 : it->second;
  }

  // Runs `op` on the CPU and the GPU (unplanned and planned) and compares every output within `tol`
  // (0 on the host). The CPU runs `reference_inputs` when given (fp32 copies of bf16 inputs), else
  // `inputs`; the GPU's outputs must have the dtype of input 1. Returns the CPU's outputs.
  std::vector<Tensor> RunBoth(ir::OpKind op, const std::string& name, const std::vector<Tensor>& inputs,
                              const ir::Attrs& attrs, int num_outputs, const std::vector<int>& absent,
                              const backend::ExecContext& ctx, bool expect_device = true, double tol = 1e-5,
                              const std::vector<Tensor>* reference_inputs = nullptr) {
    ir::Graph g, ref_g;
    const ir::Node& node = AddTypedNode(g, op, name, inputs, attrs, num_outputs, absent);
    const ir::Node& ref_node =
        AddTypedNode(ref_g, op, name, reference_inputs ? *reference_inputs : inputs, attrs, num_outputs, absent);
    std::vector<Tensor> dev_in;
    for (const Tensor& t : inputs) dev_in.push_back(t.defined() ? Upload(t) : t);
    return RunNodes(g, node, ref_node, reference_inputs ? *reference_inputs : inputs, dev_in, ctx, expect_device, tol);
  }

  Tensor Upload(const Tensor& t) {
    absl::StatusOr<Tensor> d = be_->Upload(t);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }

  // RunBoth's comparison: `node` of `g` on the device inputs `dev_in` against `ref_node` on the host
  // inputs `ref_in` on the CPU.
  std::vector<Tensor> RunNodes(const ir::Graph& g, const ir::Node& node, const ir::Node& ref_node,
                               const std::vector<Tensor>& ref_in, const std::vector<Tensor>& dev_in,
                               const backend::ExecContext& ctx, bool expect_device, double tol) {
    absl::StatusOr<std::vector<Tensor>> want = backend::MakeCpuBackend()->Run(ref_node, ref_in, ctx);
    EXPECT_TRUE(want.ok()) << want.status();
    if (!want.ok()) return {};
    const std::string op_name(ir::OpName(node.op));
    for (bool planned : {false, true}) {
      SCOPED_TRACE(op_name + (planned ? " planned" : " unplanned"));
      PlannedOutputs plan(*be_, be_->WorkspaceBytes(g, node), /*share=*/false, /*poison_outputs=*/true);
      const int64_t before = Fallbacks(op_name);
      absl::StatusOr<std::vector<Tensor>> got = be_->Run(node, dev_in, ctx, planned ? &plan : nullptr);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) continue;
      EXPECT_EQ(Fallbacks(op_name) - before, expect_device ? 0 : 1) << op_name << " ran on the host";
      EXPECT_EQ(got->size(), want->size());
      for (size_t k = 0; k < want->size() && k < got->size(); ++k) {
        SCOPED_TRACE("output " + std::to_string(k));
        EXPECT_EQ((*got)[k].defined(), (*want)[k].defined());
        if (!(*want)[k].defined() || !(*got)[k].defined()) continue;
        EXPECT_EQ((*got)[k].dtype(), dev_in[1].dtype());
        absl::StatusOr<Tensor> h = be_->ToHost((*got)[k]);
        EXPECT_TRUE(h.ok()) << h.status();
        if (h.ok()) {
          const Tensor host = h->dtype() == (*want)[k].dtype() ? *h : h->CastTo((*want)[k].dtype());
          EXPECT_TRUE(Close(host, (*want)[k], expect_device ? tol : 0));
        }
      }
    }
    return *want;
  }

  // `node`'s outputs from the GPU (unplanned, no host fallback) as fp32 host tensors.
  std::vector<Tensor> RunOnDevice(const ir::Node& node, const std::vector<Tensor>& inputs,
                                  const backend::ExecContext& ctx) {
    std::vector<Tensor> dev_in;
    for (const Tensor& t : inputs) {
      absl::StatusOr<Tensor> d = be_->Upload(t);
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) return {};
      dev_in.push_back(*d);
    }
    const std::string op_name(ir::OpName(node.op));
    const int64_t before = Fallbacks(op_name);
    absl::StatusOr<std::vector<Tensor>> got = be_->Run(node, dev_in, ctx, nullptr);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    EXPECT_EQ(Fallbacks(op_name) - before, 0) << op_name << " ran on the host";
    std::vector<Tensor> out;
    for (const Tensor& t : *got) {
      absl::StatusOr<Tensor> h = be_->ToHost(t);
      EXPECT_TRUE(h.ok()) << h.status();
      if (!h.ok()) return {};
      out.push_back(h->CastTo(DType::kF32));
    }
    return out;
  }

  std::shared_ptr<CudaBackend> be_;
};

class FlashAttentionTest : public FlashAttentionBackendTest, public ::testing::WithParamInterface<Case> {};

ir::Attrs AttrsOf(const Case& c) {
  ir::Attrs a;
  if (c.causal) a.Set("causal", int64_t{1});
  if (c.dropout > 0) a.Set("dropout", c.dropout);
  if (c.scale) a.Set("scale", *c.scale);
  if (!c.mask.empty() && !c.mask_kind.empty()) a.Set("mask_kind", c.mask_kind);
  return a;
}

TEST_P(FlashAttentionTest, ForwardAndBackwardMatchTheCpu) {
  const Case& c = GetParam();
  const Tensor q = Rand(DType::kF32, c.q, 1, -1, 1), k = Rand(DType::kF32, c.k, 2, -1, 1),
               v = Rand(DType::kF32, c.v, 3, -1, 1);
  const Tensor mask = c.mask.empty() ? Tensor() : MakeMask(c.mask, c.mask_dtype, 4, c.masked_row);
  const ir::Attrs attrs = AttrsOf(c);
  std::vector<Tensor> in = {q, k, v};
  if (mask.defined()) in.push_back(mask);
  const std::vector<Tensor> o = RunBoth(ir::OpKind::kAttention, "attn", in, attrs, 1, {}, c.ctx);
  ASSERT_EQ(o.size(), 1u);

  ir::Attrs grad_attrs = attrs;
  grad_attrs.Set("rng_key", std::string("attn"));  // replays the forward's dropout
  const Tensor d_o = Rand(DType::kF32, o[0].dims(), 5, -1, 1);
  std::vector<Tensor> grad_in = {d_o, q, k, v};
  if (mask.defined()) grad_in.push_back(mask);
  RunBoth(ir::OpKind::kAttentionGrad, "attn_grad", grad_in, grad_attrs, 3, c.absent_grads, c.ctx);
}

Case Shape(std::string name, std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v) {
  Case c;
  c.name = std::move(name);
  c.q = std::move(q), c.k = std::move(k), c.v = std::move(v);
  return c;
}
Case WithMask(Case c, std::vector<int64_t> mask, DType dtype, bool masked_row = true) {
  c.mask = std::move(mask);
  c.mask_dtype = dtype;
  c.mask_kind = dtype == DType::kBool ? "bool" : "";
  c.masked_row = masked_row;
  return c;
}
Case Causal(Case c) {
  c.causal = true;
  return c;
}
Case Dropout(Case c, double ratio = 0.1) {
  c.dropout = ratio;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    HeadDims, FlashAttentionTest,
    ::
        testing::
            Values(Shape("d8", {2, 3, 37, 8}, {2, 3, 45, 8}, {2, 3, 45, 8}),
                   Shape("d16", {2, 2, 70, 16}, {2, 2, 130, 16}, {2, 2, 130, 16}),
                   Shape("d32", {1, 2, 129, 32}, {1, 2, 64, 32}, {1, 2, 64, 32}),
                   Shape("d64", {2, 2, 100, 64}, {2, 2, 190, 64}, {2, 2, 190, 64}),
                   Shape("d80", {1, 3, 65, 80}, {1, 3, 77, 80}, {1, 3, 77, 80}),
                   Shape("d128", {2, 1, 90, 128}, {2, 1, 150, 128}, {2, 1, 150, 128}),
                   Shape("d32_dv48", {2, 2, 50, 32}, {2, 2, 70, 32}, {2, 2, 70, 48}),
                   Shape("d80_dv24", {2, 2, 66, 80}, {2, 2, 40, 80}, {2, 2, 40, 24}),
                   Shape("d10_dv7_unvectorised", {2, 2, 33, 10}, {2, 2, 29, 10}, {2, 2, 29, 7}),
                   Shape("d3_single_row", {1, 1, 1, 3}, {1, 1, 5, 3}, {1, 1, 5, 3}),
                   Shape("rank3", {4, 50, 24}, {4, 60, 24}, {4, 60, 24}), Shape("rank2", {40, 16}, {70, 16}, {70, 16}),
                   [] {
                     Case c = Shape("scale_attr", {2, 2, 40, 32}, {2, 2, 40, 32}, {2, 2, 40, 32});
                     c.scale = 0.37;
                     return c;
                   }()),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(Broadcast, FlashAttentionTest,
                         ::testing::Values(
                             Shape("kv_head1", {2, 4, 70, 32}, {2, 1, 90, 32}, {2, 1, 90, 32}),
                             Shape("kv_batch1", {3, 2, 40, 16}, {1, 2, 50, 16}, {1, 2, 50, 16}),
                             Shape("kv_rank2", {2, 3, 30, 16}, {45, 16}, {45, 16}),
                             Shape("q_broadcast", {1, 2, 30, 16}, {3, 2, 40, 16}, {3, 2, 40, 16}),
                             Shape("k_and_v_differ", {2, 2, 30, 16}, {2, 1, 40, 16}, {1, 2, 40, 24}),
                             Shape("leading_ones", {1, 2, 30, 16}, {2, 30, 16}, {2, 30, 16}),
                             [] {
                               Case c = Shape("kv_head1_only_dkdv", {2, 4, 70, 32}, {2, 1, 90, 32}, {2, 1, 90, 32});
                               c.absent_grads = {0};
                               return c;
                             }(),
                             [] {
                               Case c = Shape("kv_head1_only_dq", {2, 4, 70, 32}, {2, 1, 90, 32}, {2, 1, 90, 32});
                               c.absent_grads = {1, 2};
                               return c;
                             }(),
                             [] {
                               Case c = Shape("only_dv", {2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32});
                               c.absent_grads = {0, 1};
                               return c;
                             }()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Masks, FlashAttentionTest,
    ::testing::Values(
        WithMask(Shape("additive_key_padding", {3, 2, 70, 32}, {3, 2, 90, 32}, {3, 2, 90, 32}), {3, 1, 1, 90},
                 DType::kF32),
        WithMask(Shape("additive_shared", {2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32}), {1, 1, 70, 90}, DType::kF32),
        WithMask(Shape("additive_full", {2, 2, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64}), {2, 2, 70, 90}, DType::kF32),
        WithMask(Shape("additive_2d", {2, 2, 33, 16}, {2, 2, 65, 16}, {2, 2, 65, 16}), {33, 65}, DType::kF32),
        WithMask(Shape("additive_row_broadcast", {2, 2, 33, 16}, {2, 2, 65, 16}, {2, 2, 65, 16}), {2, 1, 33, 1},
                 DType::kF32, /*masked_row=*/false),
        WithMask(Shape("bool_key_padding", {3, 2, 70, 32}, {3, 2, 90, 32}, {3, 2, 90, 32}), {3, 1, 1, 90},
                 DType::kBool),
        WithMask(Shape("bool_shared", {2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32}), {1, 1, 70, 90}, DType::kBool),
        WithMask(Shape("bool_full_d128", {2, 2, 70, 128}, {2, 2, 90, 128}, {2, 2, 90, 128}), {2, 2, 70, 90},
                 DType::kBool),
        [] {
          // A bool mask under the default mask_kind ("additive"): read as bool, as the CPU does.
          Case c = WithMask(Shape("bool_default_kind", {2, 2, 40, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}), {2, 1, 1, 50},
                            DType::kBool);
          c.mask_kind = "";
          return c;
        }(),
        WithMask(Shape("kv_head1_masked", {2, 4, 70, 32}, {2, 1, 90, 32}, {2, 1, 90, 32}), {2, 1, 70, 90},
                 DType::kF32)),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Causal, FlashAttentionTest,
    ::testing::Values(Causal(Shape("square", {2, 2, 150, 64}, {2, 2, 150, 64}, {2, 2, 150, 64})),
                      Causal(Shape("more_queries", {2, 2, 150, 32}, {2, 2, 70, 32}, {2, 2, 70, 32})),
                      Causal(Shape("more_keys", {2, 2, 70, 32}, {2, 2, 150, 32}, {2, 2, 150, 32})),
                      Causal(WithMask(Shape("additive", {2, 2, 100, 32}, {2, 2, 100, 32}, {2, 2, 100, 32}),
                                      {2, 1, 1, 100}, DType::kF32)),
                      Causal(WithMask(Shape("bool_full", {2, 2, 100, 16}, {2, 2, 130, 16}, {2, 2, 130, 16}),
                                      {2, 2, 100, 130}, DType::kBool))),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Dropout, FlashAttentionTest,
    ::testing::Values(
        Dropout(Shape("plain", {2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32})),
        Dropout(Shape("d64_s256", {2, 4, 256, 64}, {2, 4, 256, 64}, {2, 4, 256, 64})),
        Dropout(Causal(WithMask(Shape("causal_masked", {2, 2, 100, 32}, {2, 2, 100, 32}, {2, 2, 100, 32}),
                                {2, 1, 1, 100}, DType::kBool))),
        Dropout(Shape("kv_head1", {2, 4, 70, 32}, {2, 1, 90, 32}, {2, 1, 90, 32})),
        Dropout(Shape("odd_sk_off_blocks", {2, 2, 33, 10}, {2, 2, 29, 10}, {2, 2, 29, 7})),
        Dropout(Shape("ratio_half", {2, 2, 40, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}), 0.5),
        Dropout(Shape("ratio_one", {2, 2, 40, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}), 1.0),
        [] {
          // Micro-batch 2 of 4 rows: counters start at 2 * Sq * Sk * heads.
          Case c = Dropout(Shape("micro_batch", {2, 2, 45, 16}, {2, 2, 51, 16}, {2, 2, 51, 16}));
          c.ctx.row_offset = 2;
          c.ctx.rows = 2;
          return c;
        }(),
        [] {
          Case c = Dropout(Shape("inference", {2, 2, 40, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}));
          c.ctx.training = false;
          return c;
        }()),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Grouped-query attention: K and V with fewer heads than Q (query head h reads K/V head h / n_rep),
// dK and dV summed over each group inside the dK/dV kernel.
INSTANTIATE_TEST_SUITE_P(
    GroupedKv, FlashAttentionTest,
    ::testing::Values(Shape("gqa_8_over_2", {2, 8, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32}),
                      Causal(Shape("gqa_causal", {2, 6, 150, 64}, {2, 3, 150, 64}, {2, 3, 150, 64})),
                      Shape("gqa_rank3", {6, 40, 16}, {2, 40, 16}, {2, 40, 16}),
                      Dropout(Shape("gqa_dropout", {2, 4, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32})),
                      WithMask(Shape("gqa_per_head_mask", {2, 4, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 24}),
                               {2, 4, 70, 90}, DType::kF32),
                      [] {
                        Case c = Shape("gqa_only_dkdv", {2, 4, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32});
                        c.absent_grads = {0};
                        return c;
                      }()),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The bench shape's forward+backward in one test that exercises many tiles (GEMM-sized work).
INSTANTIATE_TEST_SUITE_P(Large, FlashAttentionTest,
                         ::testing::Values(Causal(Shape("causal_b4_h8_s384", {4, 8, 384, 64}, {4, 8, 384, 64},
                                                        {4, 8, 384, 64})),
                                           Shape("b4_h8_s320", {4, 8, 320, 64}, {4, 8, 320, 64}, {4, 8, 320, 64})),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Shapes the kernels do not cover run the CPU kernel on the host, with its exact result.
TEST_F(FlashAttentionBackendTest, HeadDimsOver128FallBackToTheHost) {
  const Tensor q = Rand(DType::kF32, {1, 2, 20, 160}, 1), k = Rand(DType::kF32, {1, 2, 30, 160}, 2),
               v = Rand(DType::kF32, {1, 2, 30, 160}, 3);
  RunBoth(ir::OpKind::kAttention, "attn", {q, k, v}, {}, 1, {}, {}, /*expect_device=*/false);
}

// --- bf16: the tensor-core kernels -----------------------------------------------------------------
// bf16 Q, K, V, dO (and additive masks) on the GPU against the CPU's fp32 kernels on the same values
// up-cast, outputs bf16, normalised error within kBf16Tolerance; the same shapes, masks, broadcasts
// and dropout as above, head tiles 64 and 128.

constexpr double kBf16Tolerance = 1e-2;

// fp32 inputs rounded to bf16 (bool masks unchanged), and their fp32 values.
std::vector<Tensor> ToBf16(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.dtype() == DType::kF32 ? t.CastTo(DType::kBF16) : t);
  return out;
}
std::vector<Tensor> ToF32(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.dtype() == DType::kBF16 ? t.CastTo(DType::kF32) : t);
  return out;
}

class FlashAttentionBf16Test : public FlashAttentionBackendTest, public ::testing::WithParamInterface<Case> {};

TEST_P(FlashAttentionBf16Test, ForwardAndBackwardMatchTheCpuInFp32) {
  const Case& c = GetParam();
  std::vector<Tensor> in = {Rand(DType::kF32, c.q, 1, -1, 1), Rand(DType::kF32, c.k, 2, -1, 1),
                            Rand(DType::kF32, c.v, 3, -1, 1)};
  const Tensor mask = c.mask.empty() ? Tensor() : MakeMask(c.mask, c.mask_dtype, 4, c.masked_row);
  if (mask.defined()) in.push_back(mask);
  in = ToBf16(in);
  const std::vector<Tensor> ref = ToF32(in);
  const ir::Attrs attrs = AttrsOf(c);
  const std::vector<Tensor> o = RunBoth(ir::OpKind::kAttention, "attn", in, attrs, 1, {}, c.ctx,
                                        /*expect_device=*/true, kBf16Tolerance, &ref);
  ASSERT_EQ(o.size(), 1u);

  ir::Attrs grad_attrs = attrs;
  grad_attrs.Set("rng_key", std::string("attn"));
  std::vector<Tensor> grad_in = {Rand(DType::kF32, o[0].dims(), 5, -1, 1)};
  grad_in = ToBf16(grad_in);
  grad_in.insert(grad_in.end(), in.begin(), in.end());
  const std::vector<Tensor> grad_ref = ToF32(grad_in);
  RunBoth(ir::OpKind::kAttentionGrad, "attn_grad", grad_in, grad_attrs, 3, c.absent_grads, c.ctx,
          /*expect_device=*/true, kBf16Tolerance, &grad_ref);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionBf16Test,
    ::testing::Values(
        Shape("d64", {2, 2, 100, 64}, {2, 2, 190, 64}, {2, 2, 190, 64}),
        Shape("d128", {2, 1, 90, 128}, {2, 1, 150, 128}, {2, 1, 150, 128}),
        Shape("d32_in_tile64", {1, 2, 129, 32}, {1, 2, 64, 32}, {1, 2, 64, 32}),
        Shape("d80_dv24", {2, 2, 66, 80}, {2, 2, 40, 80}, {2, 2, 40, 24}),
        Shape("d64_dv128", {1, 2, 70, 64}, {1, 2, 80, 64}, {1, 2, 80, 128}),
        Shape("d10_dv7_unvectorised", {2, 2, 33, 10}, {2, 2, 29, 10}, {2, 2, 29, 7}),
        Shape("rank3", {4, 50, 24}, {4, 60, 24}, {4, 60, 24}),
        Shape("kv_head1", {2, 4, 70, 64}, {2, 1, 90, 64}, {2, 1, 90, 64}),
        Shape("kv_rank2", {2, 3, 30, 16}, {45, 16}, {45, 16}),
        [] {
          Case c = Shape("kv_head1_only_dkdv", {2, 4, 70, 64}, {2, 1, 90, 64}, {2, 1, 90, 64});
          c.absent_grads = {0};
          return c;
        }(),
        [] {
          Case c = Shape("only_dq", {2, 2, 70, 128}, {2, 2, 90, 128}, {2, 2, 90, 128});
          c.absent_grads = {1, 2};
          return c;
        }(),
        WithMask(Shape("additive_key_padding", {3, 2, 70, 64}, {3, 2, 90, 64}, {3, 2, 90, 64}), {3, 1, 1, 90},
                 DType::kF32),
        WithMask(Shape("additive_full_d128", {2, 2, 70, 128}, {2, 2, 90, 128}, {2, 2, 90, 128}), {2, 2, 70, 90},
                 DType::kF32),
        WithMask(Shape("additive_row_broadcast", {2, 2, 33, 16}, {2, 2, 65, 16}, {2, 2, 65, 16}), {2, 1, 33, 1},
                 DType::kF32, /*masked_row=*/false),
        WithMask(Shape("bool_key_padding", {3, 2, 70, 64}, {3, 2, 90, 64}, {3, 2, 90, 64}), {3, 1, 1, 90},
                 DType::kBool),
        WithMask(Shape("bool_shared", {2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32}), {1, 1, 70, 90}, DType::kBool),
        Causal(Shape("causal_square", {2, 2, 150, 64}, {2, 2, 150, 64}, {2, 2, 150, 64})),
        Causal(Shape("causal_more_queries", {2, 2, 150, 128}, {2, 2, 70, 128}, {2, 2, 70, 128})),
        Causal(Shape("causal_more_keys", {2, 2, 70, 64}, {2, 2, 150, 64}, {2, 2, 150, 64})),
        Causal(WithMask(Shape("causal_additive", {2, 2, 100, 64}, {2, 2, 100, 64}, {2, 2, 100, 64}), {2, 1, 1, 100},
                        DType::kF32))),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Dropout, FlashAttentionBf16Test,
    ::testing::Values(
        Dropout(Shape("plain", {2, 2, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64})),
        Dropout(Shape("d128_s256", {2, 2, 256, 128}, {2, 2, 256, 128}, {2, 2, 256, 128})),
        Dropout(Causal(WithMask(Shape("causal_masked", {2, 2, 100, 64}, {2, 2, 100, 64}, {2, 2, 100, 64}),
                                {2, 1, 1, 100}, DType::kBool))),
        Dropout(Shape("kv_head1", {2, 4, 70, 64}, {2, 1, 90, 64}, {2, 1, 90, 64})),
        Dropout(Shape("odd_sk_off_blocks", {2, 2, 33, 10}, {2, 2, 29, 10}, {2, 2, 29, 7})),
        Dropout(Shape("ratio_one", {2, 2, 40, 64}, {2, 2, 50, 64}, {2, 2, 50, 64}), 1.0),
        [] {
          Case c = Dropout(Shape("micro_batch", {2, 2, 45, 64}, {2, 2, 51, 64}, {2, 2, 51, 64}));
          c.ctx.row_offset = 2;
          c.ctx.rows = 2;
          return c;
        }(),
        [] {
          Case c = Dropout(Shape("inference", {2, 2, 40, 64}, {2, 2, 50, 64}, {2, 2, 50, 64}));
          c.ctx.training = false;
          return c;
        }()),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    GroupedKv, FlashAttentionBf16Test,
    ::testing::Values(Shape("gqa_8_over_2", {2, 8, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64}),
                      Causal(Shape("gqa_causal_d128", {2, 6, 150, 128}, {2, 3, 150, 128}, {2, 3, 150, 128})),
                      Dropout(Shape("gqa_dropout", {2, 4, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64})),
                      WithMask(Shape("gqa_bool_key_padding", {3, 4, 70, 64}, {3, 2, 90, 64}, {3, 2, 90, 64}),
                               {3, 1, 1, 90}, DType::kBool)),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Large, FlashAttentionBf16Test,
    ::testing::Values(Causal(Shape("causal_b4_h8_s384", {4, 8, 384, 64}, {4, 8, 384, 64}, {4, 8, 384, 64})),
                      Shape("b4_h8_s320_d128", {4, 8, 320, 128}, {4, 8, 320, 128}, {4, 8, 320, 128})),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- views: a packed QKV projection read and O written in place ------------------------------------
// Attention and AttentionGrad as the attention-layout pass leaves nn.MultiheadAttention: q_view,
// k_view, v_view read Q, K, V (B, H, S, Dh) from one packed (B, S, 3, H, Dh) value (rows 3 H Dh
// apart) and o_view writes O (B, H, S, Dh) into (B, S, H, Dh); AttentionGrad reads dO through o_view
// and writes the packed value's one gradient through the three views. On the device (no host
// fallback, every element written: outputs are poisoned) against the CPU kernels on the same node,
// fp32 to 1e-5 and bf16 to kBf16Tolerance (normalised). `packed` false: separate dense Q, K, V and
// only O (and dO) through a view.

struct ViewCase {
  std::string name;
  DType dtype = DType::kF32;
  int64_t b = 2, s = 70, h = 2, dh = 32;
  bool packed = true;
  bool causal = false;
  double dropout = 0.0;
};

std::ostream& operator<<(std::ostream& os, const ViewCase& c) { return os << c.name; }

// Piece `piece` (0 Q, 1 K, 2 V) of the packed buffer: operand[b, h, s, d] = packed[b, s, piece, h, d].
ir::StridedView PackedPiece(const ViewCase& c, int piece) {
  const int64_t row = 3 * c.h * c.dh;
  return {.offset = piece * c.h * c.dh, .dims = {c.b, c.h, c.s, c.dh}, .strides = {c.s * row, c.dh, row, 1}};
}

// O[b, h, s, d] at out[b, s, h, d].
ir::StridedView HeadsInterleaved(const ViewCase& c) {
  return {.offset = 0, .dims = {c.b, c.h, c.s, c.dh}, .strides = {c.s * c.h * c.dh, c.dh, c.h * c.dh, 1}};
}

ir::Attrs ViewAttrs(const ViewCase& c) {
  ir::Attrs a;
  if (c.causal) a.Set("causal", int64_t{1});
  if (c.dropout > 0) a.Set("dropout", c.dropout);
  if (c.packed) {
    for (int i = 0; i < 3; ++i) a.Set(ir::AttentionViewAttr(i), ir::ViewToInts(PackedPiece(c, i)));
  }
  a.Set("o_view", ir::ViewToInts(HeadsInterleaved(c)));
  a.Set("o_shape", std::vector<int64_t>{c.b, c.s, c.h, c.dh});
  return a;
}

class FlashAttentionViewsTest : public FlashAttentionBackendTest, public ::testing::WithParamInterface<ViewCase> {
 protected:
  // `op` on `inputs` (fp32 values; cast to the case's dtype for the device, each value uploaded
  // once) on the GPU against the CPU on the fp32 values. Returns the CPU's outputs.
  std::vector<Tensor> Compare(ir::OpKind op, const std::string& name, const std::vector<Tensor>& inputs,
                              const std::vector<int>& same_as, const ir::Attrs& attrs, int num_outputs,
                              const std::vector<int>& absent) {
    const ViewCase& c = GetParam();
    const std::vector<Tensor> typed = c.dtype == DType::kBF16 ? ToBf16(inputs) : inputs;
    const std::vector<Tensor> ref = ToF32(typed);
    std::vector<Tensor> dev_in;
    for (size_t i = 0; i < typed.size(); ++i) {
      dev_in.push_back(same_as[i] == static_cast<int>(i) ? Upload(typed[i]) : dev_in[same_as[i]]);
    }
    ir::Graph g, ref_g;
    const ir::Node& node = AddTypedNode(g, op, name, typed, attrs, num_outputs, absent, same_as);
    const ir::Node& ref_node = AddTypedNode(ref_g, op, name, ref, attrs, num_outputs, absent, same_as);
    const double tol = c.dtype == DType::kBF16 ? kBf16Tolerance : 1e-5;
    return RunNodes(g, node, ref_node, ref, dev_in, {.training = true, .seed = 11, .offset = 3},
                    /*expect_device=*/true, tol);
  }
};

TEST_P(FlashAttentionViewsTest, ForwardAndBackwardThroughViewsMatchTheCpu) {
  const ViewCase& c = GetParam();
  std::vector<Tensor> in;
  if (c.packed) {
    const Tensor packed = Rand(DType::kF32, {c.b, c.s, 3, c.h, c.dh}, 1, -1, 1);
    in = {packed, packed, packed};
  } else {
    for (uint32_t i = 0; i < 3; ++i) in.push_back(Rand(DType::kF32, {c.b, c.h, c.s, c.dh}, 1 + i, -1, 1));
  }
  const std::vector<int> same_as = c.packed ? std::vector<int>{0, 0, 0} : std::vector<int>{0, 1, 2};
  const ir::Attrs attrs = ViewAttrs(c);
  const std::vector<Tensor> o = Compare(ir::OpKind::kAttention, "attn", in, same_as, attrs, 1, {});
  ASSERT_EQ(o.size(), 1u);
  ASSERT_EQ(o[0].dims(), (std::vector<int64_t>{c.b, c.s, c.h, c.dh}));

  ir::Attrs grad_attrs = attrs;
  grad_attrs.Set("rng_key", std::string("attn"));  // replays the forward's dropout
  std::vector<Tensor> grad_in = {Rand(DType::kF32, o[0].dims(), 5, -1, 1)};
  grad_in.insert(grad_in.end(), in.begin(), in.end());
  // Packed: input 1's gradient output carries the value's gradient; outputs 1 and 2 are absent, as
  // autodiff leaves them.
  const std::vector<int> grad_same_as = c.packed ? std::vector<int>{0, 1, 1, 1} : std::vector<int>{0, 1, 2, 3};
  const std::vector<int> absent = c.packed ? std::vector<int>{1, 2} : std::vector<int>{};
  const std::vector<Tensor> grads =
      Compare(ir::OpKind::kAttentionGrad, "attn_grad", grad_in, grad_same_as, grad_attrs, 3, absent);
  ASSERT_GE(grads.size(), 1u);
  EXPECT_EQ(grads[0].dims(), in[0].dims());
}

ViewCase View(std::string name, DType dtype, int64_t s, int64_t h, int64_t dh) {
  ViewCase c;
  c.name = std::move(name);
  c.dtype = dtype;
  c.s = s, c.h = h, c.dh = dh;
  return c;
}
ViewCase Unpacked(ViewCase c) {
  c.packed = false;
  return c;
}
ViewCase CausalDropout(ViewCase c) {
  c.causal = true;
  c.dropout = 0.1;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Packed, FlashAttentionViewsTest,
    ::testing::Values(View("f32_d32", DType::kF32, 70, 2, 32), View("f32_d64_h3", DType::kF32, 130, 3, 64),
                      View("f32_d128", DType::kF32, 65, 2, 128), View("f32_d10_unvectorised", DType::kF32, 45, 2, 10),
                      CausalDropout(View("f32_causal_dropout", DType::kF32, 100, 2, 32)),
                      Unpacked(View("f32_o_view_only", DType::kF32, 70, 2, 32)),
                      View("bf16_d64", DType::kBF16, 70, 2, 64), View("bf16_d128_h3", DType::kBF16, 130, 3, 128),
                      View("bf16_d24", DType::kBF16, 45, 2, 24), View("bf16_d20_unvectorised", DType::kBF16, 45, 2, 20),
                      CausalDropout(View("bf16_causal_dropout", DType::kBF16, 100, 2, 64)),
                      Unpacked(View("bf16_o_view_only", DType::kBF16, 70, 2, 64))),
    [](const ::testing::TestParamInfo<ViewCase>& info) { return info.param.name; });

// Elements where exactly one of got and want is zero (none: success), with the first few named.
::testing::AssertionResult SameZeros(const Tensor& got, const Tensor& want) {
  if (got.dims() != want.dims()) return ::testing::AssertionFailure() << "dims differ";
  int64_t differ = 0;
  std::string first;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if ((g == 0) == (w == 0)) continue;
    if (++differ <= 5) first += " [" + std::to_string(i) + "] gpu " + std::to_string(g) + " cpu " + std::to_string(w);
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << want.num_elements()
                                       << " elements are zero on one side only:" << first;
}

// Q = K = 0 makes every visible probability nonzero and V = I (Dv = Sk) copies dropout(P) into O, so
// O's zeros are exactly the dropped (or invisible) elements; with dO = I (Dv = Sq) dV is dropout(P)^T
// (the dK/dV kernel's transposed draws). Both must have the CPU's zeros, element for element.
TEST_F(FlashAttentionBackendTest, Bf16DropoutDropsTheCpusElements) {
  for (const int64_t s : {100, 128}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE("S " + std::to_string(s) + (causal ? " causal" : ""));
      const std::vector<int64_t> qk = {2, 3, s, 16}, eye_dims = {2, 3, s, s};
      Tensor eye(DType::kF32, eye_dims);
      for (int64_t i = 0; i < eye.num_elements(); ++i) eye.mutable_data<float>()[i] = (i / s) % s == i % s ? 1.f : 0.f;
      const Tensor zeros(DType::kF32, qk);
      const std::vector<Tensor> in = ToBf16({zeros, zeros, eye});
      ir::Attrs attrs;
      attrs.Set("dropout", 0.3);
      if (causal) attrs.Set("causal", int64_t{1});
      const backend::ExecContext ctx = {.training = true, .seed = 7, .offset = 2};
      ir::Graph g, grad_g;
      const ir::Node& node = AddTypedNode(g, ir::OpKind::kAttention, "attn", in, attrs, 1, {});
      absl::StatusOr<std::vector<Tensor>> want = backend::MakeCpuBackend()->Run(node, ToF32(in), ctx);
      ASSERT_TRUE(want.ok()) << want.status();
      const std::vector<Tensor> got = RunOnDevice(node, in, ctx);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_TRUE(SameZeros(got[0], (*want)[0])) << "O";

      ir::Attrs grad_attrs = attrs;
      grad_attrs.Set("rng_key", std::string("attn"));
      const std::vector<Tensor> grad_in = ToBf16({eye, zeros, zeros, eye});
      const ir::Node& grad = AddTypedNode(grad_g, ir::OpKind::kAttentionGrad, "attn_grad", grad_in, grad_attrs, 3, {});
      absl::StatusOr<std::vector<Tensor>> grad_want = backend::MakeCpuBackend()->Run(grad, ToF32(grad_in), ctx);
      ASSERT_TRUE(grad_want.ok()) << grad_want.status();
      const std::vector<Tensor> grad_got = RunOnDevice(grad, grad_in, ctx);
      ASSERT_EQ(grad_got.size(), 3u);
      EXPECT_TRUE(SameZeros(grad_got[2], (*grad_want)[2])) << "dV";
    }
  }
}

// --- fp64 through the kernel API --------------------------------------------------------------

class FlashAttentionF64Test : public CudaTest {};

TEST_F(FlashAttentionF64Test, MatchesTheCpuInFp64) {
  struct F64Case {
    std::vector<int64_t> q, k, v, mask;
    bool causal;
    double dropout;
  };
  const F64Case cases[] = {
      {{2, 2, 70, 32}, {2, 2, 90, 32}, {2, 2, 90, 32}, {}, false, 0.0},
      {{2, 2, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 40}, {2, 1, 1, 90}, true, 0.1},
      {{1, 3, 33, 10}, {1, 3, 29, 10}, {1, 3, 29, 7}, {1, 1, 33, 29}, false, 0.2},
  };
  for (const F64Case& fc : cases) {
    const Tensor q = Rand(DType::kF64, fc.q, 1, -1, 1), k = Rand(DType::kF64, fc.k, 2, -1, 1),
                 v = Rand(DType::kF64, fc.v, 3, -1, 1);
    Tensor mask;
    if (!fc.mask.empty()) mask = MakeMask(fc.mask, DType::kF32, 4, true).CastTo(DType::kF64);
    ir::Attrs attrs;
    if (fc.causal) attrs.Set("causal", int64_t{1});
    if (fc.dropout > 0) attrs.Set("dropout", fc.dropout);
    const cpu::EvalContext ctx{true, 5, 9};
    std::vector<Tensor> in = {q, k, v};
    if (mask.defined()) in.push_back(mask);
    const int n_in = static_cast<int>(in.size());
    absl::StatusOr<std::vector<Tensor>> o =
        cpu::testing::Eval(cpu::testing::MakeNode(ir::OpKind::kAttention, n_in, 1, attrs, "attn"), in, ctx);
    ASSERT_TRUE(o.ok()) << o.status();
    const Tensor d_o = Rand(DType::kF64, (*o)[0].dims(), 5, -1, 1);
    ir::Attrs grad_attrs = attrs;
    grad_attrs.Set("rng_key", std::string("attn"));
    std::vector<Tensor> grad_in = {d_o, q, k, v};
    if (mask.defined()) grad_in.push_back(mask);
    absl::StatusOr<std::vector<Tensor>> grads = cpu::testing::Eval(
        cpu::testing::MakeNode(ir::OpKind::kAttentionGrad, n_in + 1, 3, grad_attrs, "attn_grad"), grad_in, ctx);
    ASSERT_TRUE(grads.ok()) << grads.status();

    FlashAttentionConfig c;
    c.dtype = DType::kF64;
    c.q_dims = fc.q, c.k_dims = fc.k, c.v_dims = fc.v;
    if (mask.defined()) c.mask = FlashMask::kAdditive, c.mask_dims = fc.mask;
    c.causal = fc.causal;
    c.dropout.training = true;
    c.dropout.ratio = fc.dropout;
    c.dropout.seed = 5;
    c.dropout.offset = 9;
    c.dropout.node_key = cpu::Fnv1a64("attn", 4);
    absl::StatusOr<FlashAttentionPlan> plan = PlanFlashAttention(c);
    ASSERT_TRUE(plan.ok()) << plan.status();
    DeviceTensor dq_in(q), dk_in(k), dv_in(v), ddo(d_o);
    std::optional<DeviceTensor> dmask;
    if (mask.defined()) dmask.emplace(mask);
    const void* mp = dmask ? dmask->get() : nullptr;
    DeviceTensor out(DType::kF64, plan->out_dims);
    ASSERT_TRUE(FlashAttentionForward(*plan, dq_in.get(), dk_in.get(), dv_in.get(), mp, out.get(), nullptr).ok());
    EXPECT_TRUE(Close(out.ToHost(), (*o)[0], 1e-12));

    DeviceTensor gq(DType::kF64, fc.q), gk(DType::kF64, fc.k), gv(DType::kF64, fc.v);
    const int64_t ws_bytes = FlashAttentionBackwardWorkspaceBytes(*plan, true, true, true);
    DeviceTensor ws(DType::kU8, {std::max<int64_t>(ws_bytes, 1)});
    FlashBackwardBuffers b;
    b.d_o = ddo.get(), b.q = dq_in.get(), b.k = dk_in.get(), b.v = dv_in.get(), b.mask = mp;
    b.dq = gq.get(), b.dk = gk.get(), b.dv = gv.get();
    b.workspace = ws.get(), b.workspace_bytes = ws_bytes;
    const absl::Status st = FlashAttentionBackward(*plan, b, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(Close(gq.ToHost(), (*grads)[0], 1e-12)) << "dQ";
    EXPECT_TRUE(Close(gk.ToHost(), (*grads)[1], 1e-12)) << "dK";
    EXPECT_TRUE(Close(gv.ToHost(), (*grads)[2], 1e-12)) << "dV";
  }
}

TEST(FlashAttentionPlanTest, RejectsWhatTheKernelsDoNotCover) {
  FlashAttentionConfig c;
  c.q_dims = {2, 4, 8}, c.k_dims = {2, 5, 8}, c.v_dims = {2, 5, 8};
  EXPECT_TRUE(PlanFlashAttention(c).ok());
  FlashAttentionConfig bad = c;
  bad.k_dims = {2, 5, 9};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("expected Q"));
  bad = c;
  bad.q_dims = {2, 4, 200}, bad.k_dims = {2, 5, 200}, bad.v_dims = {2, 5, 200};
  EXPECT_EQ(PlanFlashAttention(bad).status().code(), absl::StatusCode::kUnimplemented);
  bad = c;
  bad.dtype = DType::kF64;
  bad.v_dims = {2, 5, 100};
  EXPECT_EQ(PlanFlashAttention(bad).status().code(), absl::StatusCode::kUnimplemented);
  bad = c;
  bad.mask = FlashMask::kBool, bad.mask_dims = {3, 4, 5};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("does not broadcast"));
  bad = c;
  bad.dropout.ratio = 1.5;
  EXPECT_FALSE(PlanFlashAttention(bad).ok());
  bad = c;
  bad.dtype = DType::kF16;
  EXPECT_FALSE(PlanFlashAttention(bad).ok());
  // Workspace: statistics only when dK or dV is wanted; a broadcast K adds its full-batch gradient.
  FlashAttentionConfig bc = c;
  bc.k_dims = {1, 5, 8};
  absl::StatusOr<FlashAttentionPlan> p = PlanFlashAttention(bc);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, true, false, false), 0);
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, false, false, true), 256);        // 3 x 2 x 4 floats
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, false, true, false), 256 + 512);  // + 2 x 5 x 8 floats
}

TEST(FlashAttentionPlanTest, StridesSetTheGeometryAndAreChecked) {
  // Q, K, V (B 2, H 3, S 5, Dh 8) read from a packed (2, 5, 3, 3, 8) buffer, O written into (2, 5, 3, 8).
  FlashAttentionConfig c;
  c.q_dims = c.k_dims = c.v_dims = {2, 3, 5, 8};
  FlashAttentionConfig dense = c;
  c.q_strides = c.k_strides = c.v_strides = {5 * 72, 8, 72, 1};
  c.o_strides = {5 * 24, 8, 24, 1};
  absl::StatusOr<FlashAttentionPlan> p = PlanFlashAttention(c);
  ASSERT_TRUE(p.ok()) << p.status();
  const FlashGeometry& g = p->geometry;
  EXPECT_EQ(g.q_ld, 72);
  EXPECT_EQ(g.v_ld, 72);
  EXPECT_EQ(g.o_ld, 24);
  EXPECT_EQ(g.k_stride[0], 360);
  EXPECT_EQ(g.k_stride[1], 8);
  EXPECT_EQ(g.o_stride[0], 120);
  EXPECT_EQ(g.o_stride[1], 8);
  // The gradients go where their operands came from.
  EXPECT_EQ(g.dk_ld, 72);
  EXPECT_EQ(g.dk_stride[0], 360);
  EXPECT_EQ(g.dk_stride[1], 8);
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, true, true, true), 512);  // statistics only: 3 x 6 x 5 floats

  // No strides: dense, as before.
  p = PlanFlashAttention(dense);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->geometry.q_ld, 8);
  EXPECT_EQ(p->geometry.o_ld, 8);
  EXPECT_EQ(p->geometry.dv_ld, 8);
  EXPECT_EQ(p->geometry.q_stride[0], 120);
  EXPECT_EQ(p->geometry.o_stride[1], 40);
  EXPECT_EQ(p->geometry.dq_stride[1], 40);

  // A strided operand that broadcasts (one head) reads with stride 0 and is never summed.
  FlashAttentionConfig bc = c;
  bc.k_dims = {2, 1, 5, 8};
  p = PlanFlashAttention(bc);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->geometry.k_stride[1], 0);
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, false, true, false), 512);

  FlashAttentionConfig bad = c;
  bad.q_strides = {5 * 72, 8, 72, 2};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("last stride must be 1"));
  bad = c;
  bad.k_strides = {8, 72, 1};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("one per dim"));
  bad = c;
  bad.v_strides = {5 * 72, -8, 72, 1};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("negative"));
  bad = c;
  bad.o_strides = {24, 1};
  EXPECT_THAT(std::string(PlanFlashAttention(bad).status().message()), ::testing::HasSubstr("O strides"));
}

TEST(FlashAttentionPlanTest, Bf16TakesTileWidths64And128AndFp32Statistics) {
  FlashAttentionConfig c;
  c.dtype = DType::kBF16;
  c.q_dims = {2, 40, 8}, c.k_dims = {1, 50, 8}, c.v_dims = {2, 50, 8};
  absl::StatusOr<FlashAttentionPlan> p = PlanFlashAttention(c);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->geometry.head_tile, 64);
  // Statistics: 3 x 2 x 40 fp32 (960 bytes, one 1024-byte part); dK's full batch: 2 x 50 x 8 bf16.
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, false, false, true), 1024);
  EXPECT_EQ(FlashAttentionBackwardWorkspaceBytes(*p, false, true, false), 1024 + 1792);
  c.q_dims = {2, 40, 80}, c.k_dims = {2, 50, 80}, c.v_dims = {2, 50, 128};
  p = PlanFlashAttention(c);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->geometry.head_tile, 128);
  c.v_dims = {2, 50, 136};
  EXPECT_EQ(PlanFlashAttention(c).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
