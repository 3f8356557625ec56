// ONNX Attention and RotaryEmbedding (ai.onnx opset 23), imported to the fused IR Attention and Rotary (op.h).
// torch's dynamo exporter writes them for scaled_dot_product_attention and transformers' rotary at opset 23.
//
// RotaryEmbedding(X, cos_cache, sin_cache, position_ids?) attrs interleaved, num_heads, rotary_embedding_dim:
// X is (B, H, S, D), or (B, S, H * D) with num_heads; the caches hold R / 2 angles per position, (B, S, R / 2),
// or (P, R / 2) indexed by position_ids (B, S). The IR Rotary takes a table entry per rotated feature, so the
// caches are widened to R: [c, c] for the rotate-half form, each angle twice in place for the interleaved one.
// A 3-D X is split into heads around the Rotary and merged again.
//
// Attention(Q, K, V, attn_mask?) attrs is_causal, scale, q_num_heads, kv_num_heads: Q (B, Hq, Sq, Dh), K and V
// (B, Hkv, Sk, Dh | Dv) with Hkv dividing Hq (the IR's grouped-query layout), or 3-D (B, S, heads * Dh) with the
// head counts, split and merged around it. A bool mask keeps where true, a float mask is added; scale defaults
// to 1 / sqrt(Dh); softmax_precision is met (the IR's softmax is f32 or wider). A KV cache (past_key, past_value,
// present outputs), the QK output and softcap are refused with an error naming the node: onnxpipe trains.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;
using ir::ValueId;

std::optional<int64_t> LastDim(ImportContext& ctx, ValueId v) {
  const ir::Value& val = InferredValue(ctx, v);
  if (!val.shape_known || val.shape.empty() || !val.shape.back().is_concrete()) return std::nullopt;
  return val.shape.back().value();
}

std::optional<int64_t> Rank(ImportContext& ctx, ValueId v) {
  const ir::Value& val = InferredValue(ctx, v);
  if (!val.shape_known) return std::nullopt;
  return static_cast<int64_t>(val.shape.size());
}

ValueId Ints(ImportContext& ctx, std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({n}, v));
}

ValueId Helper(ImportContext& ctx, OpKind op, std::vector<ValueId> inputs, const char* attr = nullptr,
               std::vector<int64_t> values = {}) {
  ir::Attrs a;
  if (attr != nullptr) a.Set(attr, values);
  return ctx.EmitHelper(op, std::move(inputs), std::move(a));
}

ValueId ConcatLast(ImportContext& ctx, ValueId a, ValueId b) {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  return ctx.EmitHelper(OpKind::kConcat, {a, b}, std::move(attrs));
}

// (B, S, heads * d) -> (B, heads, S, d).
ValueId SplitHeads(ImportContext& ctx, ValueId x, int64_t heads) {
  const ValueId split = ctx.EmitHelper(OpKind::kReshape, {x, Ints(ctx, {0, 0, heads, -1})});
  return Helper(ctx, OpKind::kTranspose, {split}, "perm", {0, 2, 1, 3});
}

// A cache of R / 2 angles per position widened to the IR Rotary's R, in (B, S, R) (or with position_ids'
// dims in front of R).
ValueId WidenCache(ImportContext& ctx, ValueId cache, ValueId position_ids, bool interleaved) {
  ValueId c = cache;
  if (position_ids != ir::kNoValue) {
    ir::Attrs a;
    a.Set("axis", int64_t{0});
    c = ctx.EmitHelper(OpKind::kGather, {cache, position_ids}, std::move(a));
  }
  if (!interleaved) return ConcatLast(ctx, c, c);
  const ValueId pairs = Helper(ctx, OpKind::kUnsqueeze, {c}, "axes", {-1});
  return ctx.EmitHelper(OpKind::kReshape, {ConcatLast(ctx, pairs, pairs), Ints(ctx, {0, 0, -1})});
}

ONNX_IMPORTER(RotaryEmbedding) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(3, 4));
  if (ctx.num_outputs() != 1) return ctx.Error() << "has " << ctx.num_outputs() << " outputs; expected 1 (Y)";
  ASSIGN_OR_RETURN(const int64_t interleaved, ctx.attrs().Get<int64_t>("interleaved", 0));
  ASSIGN_OR_RETURN(const int64_t num_heads, ctx.attrs().Get<int64_t>("num_heads", 0));
  ASSIGN_OR_RETURN(int64_t rotary_dim, ctx.attrs().Get<int64_t>("rotary_embedding_dim", 0));
  if (interleaved != 0 && interleaved != 1) return ctx.Error() << "attribute interleaved must be 0 or 1";
  if (num_heads < 0 || rotary_dim < 0 || rotary_dim % 2 != 0) {
    return ctx.Error() << "attributes num_heads (" << num_heads << ") and rotary_embedding_dim (" << rotary_dim
                       << ") must be >= 0, rotary_embedding_dim even";
  }
  const ValueId x = ctx.input(0);
  const std::optional<int64_t> rank = Rank(ctx, x);
  if (!rank || (*rank != 3 && *rank != 4)) {
    return ctx.Error() << "needs X of known rank 3 (B, S, H * D) or 4 (B, H, S, D)"
                       << (rank ? "; got rank " + std::to_string(*rank) : std::string());
  }
  if (*rank == 3 && num_heads == 0) return ctx.Error() << "needs the attribute num_heads for a 3-D X";
  const std::optional<int64_t> half = LastDim(ctx, ctx.input(1));
  if (!half) {
    return ctx.Error() << "needs the cos_cache's last dim (rotary_embedding_dim / 2) to be known at import";
  }
  if (rotary_dim == 0) rotary_dim = 2 * *half;
  if (rotary_dim != 2 * *half) {
    return ctx.Error() << "rotary_embedding_dim " << rotary_dim << " needs caches of " << rotary_dim / 2
                       << " angles per position; cos_cache has " << *half;
  }
  const ValueId cos = WidenCache(ctx, ctx.input(1), ctx.input(3), interleaved == 1);
  const ValueId sin = WidenCache(ctx, ctx.input(2), ctx.input(3), interleaved == 1);
  ir::Attrs attrs;
  attrs.Set("rotary_dim", rotary_dim);
  attrs.Set("interleaved", interleaved);
  if (*rank == 4) {  // (B, H, S, D) against tables (B, 1, S, R)
    const ValueId c4 = Helper(ctx, OpKind::kUnsqueeze, {cos}, "axes", {1});
    const ValueId s4 = Helper(ctx, OpKind::kUnsqueeze, {sin}, "axes", {1});
    return ctx.Emit(OpKind::kRotary, {x, c4, s4}, std::move(attrs));
  }
  // (B, S, H * D) as (B, S, H, D) against tables (B, S, 1, R), merged back.
  const ValueId heads = ctx.EmitHelper(OpKind::kReshape, {x, Ints(ctx, {0, 0, num_heads, -1})});
  const ValueId c4 = Helper(ctx, OpKind::kUnsqueeze, {cos}, "axes", {2});
  const ValueId s4 = Helper(ctx, OpKind::kUnsqueeze, {sin}, "axes", {2});
  const ValueId rotated = ctx.EmitHelper(OpKind::kRotary, {heads, c4, s4}, std::move(attrs));
  return ctx.Emit(OpKind::kReshape, {rotated, Ints(ctx, {0, 0, -1})});
}

ONNX_IMPORTER(Attention) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(3, 6));
  if (ctx.has_input(4) || ctx.has_input(5)) {
    return ctx.Error() << "has a KV cache (past_key, past_value): onnxpipe trains, export without a cache";
  }
  if (ctx.num_outputs() != 1) {
    return ctx.Error() << "asks for " << ctx.num_outputs() << " outputs; onnxpipe computes Y only (no present "
                       << "key/value, no QK output)";
  }
  ASSIGN_OR_RETURN(const int64_t is_causal, ctx.attrs().Get<int64_t>("is_causal", 0));
  ASSIGN_OR_RETURN(const std::optional<double> scale_attr, ctx.attrs().GetOptional<double>("scale"));
  ASSIGN_OR_RETURN(const double softcap, ctx.attrs().Get<double>("softcap", 0.0));
  ASSIGN_OR_RETURN(const int64_t q_heads, ctx.attrs().Get<int64_t>("q_num_heads", 0));
  ASSIGN_OR_RETURN(const int64_t kv_heads, ctx.attrs().Get<int64_t>("kv_num_heads", 0));
  if (softcap != 0.0) {
    return ctx.Error() << "has softcap " << softcap << ": the fused Attention has no score cap (export the "
                       << "capped scores as ops, e.g. eager attention)";
  }
  if (is_causal != 0 && is_causal != 1) return ctx.Error() << "attribute is_causal must be 0 or 1";
  const std::optional<int64_t> rank = Rank(ctx, ctx.input(0));
  if (!rank || (*rank != 3 && *rank != 4)) {
    return ctx.Error() << "needs Q of known rank 3 (B, S, heads * Dh) or 4 (B, heads, S, Dh)"
                       << (rank ? "; got rank " + std::to_string(*rank) : std::string());
  }
  if (*rank == 3 && (q_heads <= 0 || kv_heads <= 0)) {
    return ctx.Error() << "needs the attributes q_num_heads and kv_num_heads for 3-D Q, K, V";
  }
  double scale = 0;
  if (scale_attr) {
    scale = *scale_attr;
  } else {
    std::optional<int64_t> width = LastDim(ctx, ctx.input(0));
    if (!width || (*rank == 3 && *width % q_heads != 0)) {
      return ctx.Error() << "needs Q's head size known at import for the default scale 1 / sqrt(head size)";
    }
    scale = 1.0 / std::sqrt(static_cast<double>(*rank == 3 ? *width / q_heads : *width));
  }
  std::vector<ValueId> inputs = {ctx.input(0), ctx.input(1), ctx.input(2)};
  if (*rank == 3) {
    inputs = {SplitHeads(ctx, inputs[0], q_heads), SplitHeads(ctx, inputs[1], kv_heads),
              SplitHeads(ctx, inputs[2], kv_heads)};
  }
  ir::Attrs attrs;
  attrs.Set("scale", scale);
  attrs.Set("causal", is_causal);
  attrs.Set("dropout", 0.0);
  if (ctx.has_input(3)) {
    inputs.push_back(ctx.input(3));
    const bool keep = InferredValue(ctx, ctx.input(3)).dtype == ir::DType::kBool;  // true: attend
    attrs.Set("mask_kind", std::string(keep ? "bool" : "additive"));
  }
  if (*rank == 4) return ctx.Emit(OpKind::kAttention, std::move(inputs), std::move(attrs));
  const ValueId o = ctx.EmitHelper(OpKind::kAttention, std::move(inputs), std::move(attrs));
  const ValueId merged = Helper(ctx, OpKind::kTranspose, {o}, "perm", {0, 2, 1, 3});
  return ctx.Emit(OpKind::kReshape, {merged, Ints(ctx, {0, 0, -1})});
}

}  // namespace

void RegisterAttentionImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER_SINCE(r, RotaryEmbedding, 23);
  REGISTER_ONNX_IMPORTER_SINCE(r, Attention, 23);
}

}  // namespace onnxpipe::onnx_frontend
