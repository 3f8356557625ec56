// Graph builders for the patterns the fusion passes match, shared by the structural tests and the
// numerical-equivalence tests. Each mirrors what PyTorch's exporter (torch 1.13) writes, with
// options for the variants and the negative cases.
#pragma once

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "frontend/ir/graph.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes::testing::patterns {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::Tensor;
using ir::ValueId;

struct LayerNormVariant {
  int64_t axis = -1;           // axes of both ReduceMeans
  bool swap_operands = false;  // Add(eps, v), Mul(scale, n), Add(bias, y)
  bool square_as_mul = false;  // Mul(d, d) instead of Pow(d, 2)
  bool casts = false;          // Cast(d) -> Pow -> Cast, as the exporter writes for half inputs
  bool reciprocal = false;     // Mul(d, Reciprocal(s)) instead of Div(d, s)
  bool bias = true;
  double pow_exponent = 2.0;
  bool extra_mean_use = false;  // negative: the mean has another consumer
};

struct LayerNormGraph {
  ValueId x, scale, bias, y;
};

// The opset < 17 export of nn.LayerNorm(16, eps=1e-5) on a (B, S, 16) input, output through a Relu.
LayerNormGraph BuildDecomposedLayerNorm(GraphBuilder& b, const LayerNormVariant& v);

struct RMSNormVariant {
  enum Rsqrt { kReciprocalSqrt, kDivOneBySqrt, kPowMinusHalf, kDivBySqrt } rsqrt = kReciprocalSqrt;
  bool square_as_mul = false;   // Mul(x, x) instead of Pow(x, 2)
  bool casts = false;           // Llama: x.to(float32) read by both, the result cast back
  bool weight_first = true;     // Mul(weight, n) as Llama writes it
  bool two_axes = false;        // normalise the last two dims (x (B, 4, 16), weight (4, 16))
  bool eps_parameter = false;   // negative: eps is a trainable initializer
  bool extra_mean_use = false;  // negative: the mean of squares has another consumer
  bool other_square = false;    // negative: the square reads another value than the normalisation
  bool middle_axis = false;     // negative: the mean is over a dim that is not trailing
};

struct RMSNormGraph {
  ValueId x, weight, y;
};

// LlamaRMSNorm(16, eps=1e-6) on a (B, S, 16) input as torch's exporters write it, output through a Relu.
RMSNormGraph BuildDecomposedRMSNorm(GraphBuilder& b, const RMSNormVariant& v);

inline const ir::Shape kGeluShape = {ir::Dim::Symbol("B"), ir::Dim(8)};

enum class GeluForm {
  kErfExporter,       // 0.5 * (x * (1 + erf(x / 1.4142135)))     torch 1.13 nn.GELU()
  kErfHalfFirst,      // (x * 0.5) * (1 + erf(x / 1.4142))
  kErfMulRsqrt2,      // x * (0.5 * (erf(x * 0.70710678) + 1))
  kTanhExporter,      // F.gelu(approximate='tanh'): x*x*x products, constants on the left
  kTanhPow,           // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
};

struct GeluOptions {
  GeluForm form = GeluForm::kErfExporter;
  bool x_from_add = false;   // x is a bias Add's output (an Add leaf besides 1 + erf)
  float half = 0.5f;
  bool extra_use = false;    // the Erf/Tanh output has another consumer
};

// Builds y = gelu(x) in the requested form, output through a Relu; returns {x, y}.
std::pair<ValueId, ValueId> BuildGelu(GraphBuilder& b, const GeluOptions& o);

// Rotary position embedding as torch's exporters write Hugging Face's apply_rotary_pos_emb
// (rotary_fusion.h): x = xin * w (w a parameter, so gradients reach one) of (B, H, S, W) = (2, 2, 8,
// width), tables (B, 1, S, R) graph inputs; GPT-J's layout (B, S, H, W) with tables (B, S, 1, R).
// With rotary_dim < width the rotated slice is concatenated back in front of the rest (partial).
struct RotaryVariant {
  bool interleaved = false;
  int64_t width = 8, rotary_dim = 8;
  bool gptj_layout = false;
  bool swap_add = false;         // Add(rot * sin, x * cos)
  bool swap_muls = false;        // Mul(cos, x), Mul(sin, rot)
  bool end_as_width = false;     // slice ends written as the width (else INT64_MAX, as TorchScript)
  bool neg_first_half = false;   // negative: Concat(Neg(x1), x2), the other sign
  bool same_half_twice = false;  // negative: both slices take the first half
  bool seq_axis = false;         // negative: halves sliced and concatenated along the sequence axis
  bool table_parameter = false;  // negative: cos is a trainable parameter
  bool other_x = false;          // negative: the cos product reads another value than the rotation
  bool pass_first = false;       // negative for the partial rewrite: Concat(pass, rotated)
};

struct RotaryGraph {
  ValueId x, cos, sin, y;
};

RotaryGraph BuildRotary(GraphBuilder& b, const RotaryVariant& v);

// A gated MLP as torch's exporters write Llama's (SwiGLU) and, after GeluFusion, Gemma's (GeGLU):
// down(act(gate) * up), gate = MatMul(x, Wg), up = MatMul(x, Wu) of (B, S, 16) from x (B, S, 8), Wg,
// Wu, Wd parameters (gradients reach them through the activation), y = MatMul(h, Wd) the output.
struct GatedMlpVariant {
  enum Act { kSilu, kGeluErf, kGeluTanh } act = kSilu;
  bool symbolic = true;           // B and S symbolic dims (else 2 and 3)
  bool sigmoid_first = false;     // SiLU as Mul(Sigmoid(gate), gate)
  bool up_first = false;          // Mul(up, act(gate))
  bool up_is_gate = false;        // act(gate) * gate (one value read twice)
  bool act_used = false;          // negative: act(gate) is also a graph output
  bool sigmoid_used = false;      // negative: Sigmoid(gate) is also a graph output
  bool broadcast_up = false;      // negative: up is (B, S, 1), broadcast over the features
  bool sigmoid_of_other = false;  // negative: Mul(gate, Sigmoid(up)) is no SiLU
  bool tanh_not_sigmoid = false;  // negative: Mul(gate, Tanh(gate)) is no SiLU
  bool gelu_dropout = false;      // negative: the Gelu carries a fused dropout
};

struct GatedMlpGraph {
  ValueId gate, up, h, y;
};

GatedMlpGraph BuildGatedMlp(GraphBuilder& b, const GatedMlpVariant& v);

inline constexpr int64_t kS = 5;
inline const float kInf = std::numeric_limits<float>::infinity();


ir::Attrs Perm(std::vector<int64_t> p);
// Additive (S, S) causal mask as torch.triu(full(-inf), 1) builds it, with leading unit dims.
Tensor AdditiveCausal(std::vector<int64_t> dims, float fill = -kInf);
// Boolean (S, S) mask; `masked_above`: true above the diagonal (masked_fill's condition).
Tensor BoolTriangle(std::vector<int64_t> dims, bool masked_above);

// nn.MultiheadAttention as torch 1.13 exports it: (S, B*H, Dh) heads transposed to (B*H, S, Dh),
// Q pre-divided by sqrt(Dh), K^T by one Transpose perm [1, 2, 0], dropout on the probabilities.
struct MhaOptions {
  enum Mask { kNone, kCausalConst, kInputMask } mask = kNone;
  bool extra_softmax_use = false;
  bool scale_after_mask = false;
  bool dropout_mask_used = false;
  // Where(IsNaN(P), fill, P) after the softmax, fill 0 (as SDPA decompositions) or 1.
  enum NanGuard { kNoGuard, kZeroGuard, kOneGuard } nan_guard = kNoGuard;
};

struct MhaGraph {
  ValueId qh, kr, vh, out, mask = ir::kNoValue;
};

MhaGraph BuildMha(GraphBuilder& b, const MhaOptions& o);

// Llama's SDPA attention as torch's dynamo exporter writes it (opset 18): Q and K^T each scaled by
// sqrt(1/sqrt(Dh)) (a rank-0 initializer the trainable-parameter rule freezes), K^T through a
// flattening (Reshape (B*H, S, Dh) -> Transpose [0, 2, 1] -> Reshape (B, H, Dh, S)), K and V
// expanded from KVH = 2 to H = 4 heads (Unsqueeze, Expand, Reshape), the additive mask
// Where(keep, 0, finfo.min) of frozen rank-0 initializers, and the NaN guard after the softmax.
// B = 2, S = kS, Dh = 4. `trainable_scale`: the scale initializer is left undecided (a parameter).
struct DynamoSdpaGraph {
  ValueId q, k_heads, v_heads, mask, out;
  float sqrt_scale = 0.70710677f;
};
DynamoSdpaGraph BuildDynamoSdpa(GraphBuilder& b, bool trainable_scale = false);

// GPT-style: (B, S, H, Dh) -> Transpose [0,2,1,3] for Q and V, K^T straight from (B, S, H, Dh)
// with perm [0,2,3,1], Mul by 1/sqrt(Dh) after the MatMul, masked_fill via Where.
// kWindowConst: GPT-Neo's local layers, torch.where(band, scores, finfo.min) with a constant band
// (key j visible from query i when i - 2 <= j <= i); `padding_mask` adds an input (B, 1, 1, S)
// after the Where, as Hugging Face adds its attention mask.
struct GptOptions {
  enum Cond { kCausalConst, kInputCond, kKeepCond, kWindowConst } cond = kCausalConst;
  bool extra_scores_use = false;
  bool padding_mask = false;
};

struct GptGraph {
  ValueId qh, kr, vh, out, cond, padding = ir::kNoValue;
};

GptGraph BuildGpt(GraphBuilder& b, const GptOptions& o);

// BLOOM-style (baddbmm/bmm on merged heads): Q (B*H, S, Dh), K^T (B*H, Dh, S), V (B*H, S, Dh),
// scores = MatMul(Q, K^T) * 0.5 + ALiBi (B*H, 1, S) * 1, reshaped to (B, H, S, S), plus the padding
// mask (B, 1, S, S), softmax, reshaped back to (B*H, S, S), times V. B = 2, H = 2, Dh = 4.
// `masked_fill`: DeBERTa's form instead of the padding mask, Where(mask, finfo.min, scores) with a
// bool input mask (B, 1, S, S), true = masked.
struct BloomGraph {
  ValueId q, kt, v, alibi, mask, out;
};
BloomGraph BuildBloom(GraphBuilder& b, bool masked_fill = false);

}  // namespace onnxpipe::passes::testing::patterns
