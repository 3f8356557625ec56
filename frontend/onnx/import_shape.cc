// Importers for ops that move or reinterpret data without arithmetic: Transpose, Reshape, Flatten,
// Squeeze, Unsqueeze, Concat, Split, Slice, Shape, Expand, ConstantOfShape, Range, Trilu, and Tile
// (lowered to Reshape/Expand, below).
// Static operands that ONNX turned into inputs (Squeeze/Unsqueeze axes, Split sizes) become
// attributes here; dynamic shape operands (Reshape/Expand shape, Slice bounds) stay inputs.
#include <algorithm>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "frontend/ir/infer.h"
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

ONNX_IMPORTER(Transpose) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> perm,
                   ctx.attrs().GetOptional<std::vector<int64_t>>("perm"));
  ir::Attrs attrs;
  if (perm) {
    std::vector<int64_t> sorted = *perm;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] != static_cast<int64_t>(i)) {
        return ctx.Error() << "attribute perm [" << absl::StrJoin(*perm, ",")
                           << "] is not a permutation of 0.." << perm->size() - 1;
      }
    }
    attrs.Set("perm", *perm);
  }
  return ctx.Emit(OpKind::kTranspose, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Reshape) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(int64_t allowzero, ctx.attrs().Get<int64_t>("allowzero", 0));
  ir::Attrs attrs;
  attrs.Set("allowzero", allowzero);
  return ctx.Emit(OpKind::kReshape, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

ONNX_IMPORTER(Flatten) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", 1));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  return ctx.Emit(OpKind::kFlatten, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Squeeze) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes,
                   AttrOrConstantInputInts(ctx, "axes", 1));
  ir::Attrs attrs;
  if (axes && !axes->empty()) attrs.Set("axes", *axes);  // none or empty: all 1-dims
  return ctx.Emit(OpKind::kSqueeze, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Unsqueeze) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes,
                   AttrOrConstantInputInts(ctx, "axes", 1));
  if (!axes || axes->empty()) return ctx.Error() << "needs axes (input 1 or attribute)";
  ir::Attrs attrs;
  attrs.Set("axes", *axes);
  return ctx.Emit(OpKind::kUnsqueeze, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Concat) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, ir::kVariadic));
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error() << "input " << i << " is empty";
  }
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Required<int64_t>("axis"));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  std::vector<ir::ValueId> in(ctx.num_inputs());
  for (int i = 0; i < ctx.num_inputs(); ++i) in[i] = ctx.input(i);
  return ctx.Emit(OpKind::kConcat, std::move(in), std::move(attrs));
}

// Opsets 13-17 give sizes as input 1 (or split evenly by the output count); opset 18 adds
// `num_outputs`, where the last chunk may be smaller. Both become the IR's `split` attribute,
// left unset for an even split so that every opset's even split imports to the same IR.
ONNX_IMPORTER(Split) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  ctx.MaterializeAllOutputs();
  const int64_t n = ctx.num_outputs();
  if (n < 1) return ctx.Error() << "has no outputs";
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", 0));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> split,
                   AttrOrConstantInputInts(ctx, "split", 1));
  ASSIGN_OR_RETURN(std::optional<int64_t> num_outputs,
                   ctx.attrs().GetOptional<int64_t>("num_outputs"));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  if (split && split->empty()) split.reset();
  if (split && num_outputs) {
    return ctx.Error() << "gives both split sizes and num_outputs; ONNX allows one of them";
  }
  if (split) {
    if (static_cast<int64_t>(split->size()) != n) {
      return ctx.Error() << "split sizes [" << absl::StrJoin(*split, ",") << "] name "
                         << split->size() << " parts but the node has " << n << " outputs";
    }
    for (int64_t s : *split) {
      if (s < 0) return ctx.Error() << "split sizes must be non-negative; got " << s;
    }
    attrs.Set("split", *split);
  } else if (num_outputs) {
    if (*num_outputs != n) {
      return ctx.Error() << "num_outputs is " << *num_outputs << " but the node has " << n
                         << " outputs";
    }
    // Uneven chunks need the axis length; use it when the file declares it, else assume even.
    const ir::Value& x = ctx.graph().value(ctx.input(0));
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (x.shape_known && a >= 0 && a < rank && x.shape[a].is_concrete()) {
      const int64_t len = x.shape[a].value();
      if (len % n != 0) {
        const int64_t chunk = (len + n - 1) / n;
        std::vector<int64_t> sizes(n);
        int64_t left = len;
        for (int64_t i = 0; i < n; ++i) {
          sizes[i] = std::min(chunk, left);
          left -= sizes[i];
        }
        attrs.Set("split", sizes);
      }
    } else {
      ctx.Warn(absl::StrCat("Split num_outputs=", n,
                            ": the split axis length is not declared in the file; onnxpipe "
                            "assumes it divides evenly"));
    }
  }
  return ctx.Emit(OpKind::kSplit, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Slice) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(3, 5));
  std::vector<ir::ValueId> in(ctx.num_inputs());
  for (int i = 0; i < ctx.num_inputs(); ++i) in[i] = ctx.input(i);
  return ctx.Emit(OpKind::kSlice, std::move(in));
}

ONNX_IMPORTER(Shape) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(int64_t start, ctx.attrs().Get<int64_t>("start", 0));
  ASSIGN_OR_RETURN(std::optional<int64_t> end, ctx.attrs().GetOptional<int64_t>("end"));
  ir::Attrs attrs;
  attrs.Set("start", start);
  if (end) attrs.Set("end", *end);
  return ctx.Emit(OpKind::kShape, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Expand) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  return ctx.Emit(OpKind::kExpand, {ctx.input(0), ctx.input(1)});
}

// The fill value becomes a one-element Tensor attribute `value` (ONNX default: float 0).
// Tile(X, repeats), lowered at import to ops that have shape rules, kernels and gradients on every
// backend. For X of dims (d0, .., dn) and repeats (r0, .., rn):
//   Reshape X to (1, d0, 1, d1, .., 1, dn), Expand that to (r0, d0, r1, d1, .., rn, dn) and Reshape
//   the result to (r0 d0, .., rn dn).
// Row-major order makes copy k of axis i the k-th block of output axis i, which is Tile. The three
// shapes are computed in the graph from Shape(X) and repeats (interleaved through a (n, 2) Concat),
// so repeats may be dynamic (GPT-J's and DeBERTa's TorchScript exports build them from shapes);
// with concrete dims the shape arithmetic folds away. The gradient is Expand's (a sum over the copies).
ONNX_IMPORTER(Tile) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  const ir::ValueId x = ctx.input(0), repeats = ctx.input(1);
  ir::Attrs column;  // (n) -> (n, 1)
  column.Set("axes", std::vector<int64_t>{1});
  ir::Attrs last;
  last.Set("axis", int64_t{1});
  const ir::ValueId dims = ctx.EmitHelper(OpKind::kShape, {x});
  ir::Attrs one_fill;
  one_fill.Set("value", ir::Tensor::FromVector<int64_t>({1}, {1}));
  const ir::ValueId ones =
      ctx.EmitHelper(OpKind::kConstantOfShape, {ctx.EmitHelper(OpKind::kShape, {dims})}, one_fill);
  const ir::ValueId flat = ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({1}, {-1}));
  // Row i of the (n, 2) Concat is (a_i, b_i); flattened: (a_0, b_0, a_1, b_1, ..).
  auto interleave = [&](ir::ValueId a, ir::ValueId b) {
    const ir::ValueId pairs = ctx.EmitHelper(
        OpKind::kConcat, {ctx.EmitHelper(OpKind::kUnsqueeze, {a}, column), ctx.EmitHelper(OpKind::kUnsqueeze, {b}, column)},
        last);
    return ctx.EmitHelper(OpKind::kReshape, {pairs, flat});
  };
  ir::Attrs exact;  // a 0 in these shapes is an empty dim, not "copy the input's"
  exact.Set("allowzero", int64_t{1});
  const ir::ValueId spread = ctx.EmitHelper(OpKind::kReshape, {x, interleave(ones, dims)}, exact);
  const ir::ValueId copies = ctx.EmitHelper(OpKind::kExpand, {spread, interleave(repeats, ones)});
  return ctx.Emit(OpKind::kReshape, {copies, ctx.EmitHelper(OpKind::kMul, {dims, repeats})}, exact);
}

// Pad(X, pads, constant_value?, axes?) in constant mode, lowered at import to Concat with blocks of the fill:
// for each axis with a pad, ConstantOfShape(X's dims with that dim replaced by the pad) before and/or after X
// (the block shapes from Shape(X) in the graph, so the other dims may be dynamic). The gradient is Concat's (a slice
// of dY). Pads known at import (an initializer, or TorchScript's Concat/Reshape/Slice/Transpose chain over
// F.pad's list, which ir::KnownInts evaluates) give blocks only where a pad is not 0; pads computed from a
// dynamic dim give a block on every side, sized by the pads tensor's element at run time (0 makes it empty; once
// the dims are bound, folding turns it into a constant). Reflect, edge and wrap modes and known negative pads
// (cropping) are refused, naming the node; a negative pad computed at run time fails there.
ONNX_IMPORTER(Pad) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 4));  // pads are an input from opset 11 (onnxpipe reads 13 and above)
  ASSIGN_OR_RETURN(const std::string mode, ctx.attrs().Get<std::string>("mode", "constant"));
  if (mode != "constant") return ctx.Error() << "mode '" << mode << "' is not supported (only constant padding)";
  const ir::ValueId x = ctx.input(0);
  const ir::Value& xv = InferredValue(ctx, x);
  if (!xv.shape_known) return ctx.Error() << "needs X's rank known at import";
  const int64_t rank = static_cast<int64_t>(xv.shape.size());
  ir::Tensor fill = ir::Tensor(xv.dtype, {1});  // zeros
  ASSIGN_OR_RETURN(const ir::Tensor* value, ctx.ConstantInput(2, "constant_value"));
  if (value != nullptr) {
    if (value->num_elements() != 1) return ctx.Error() << "constant_value must hold one element";
    fill = value->CastTo(xv.dtype).Reshaped({1});
  }
  std::vector<int64_t> axes(rank);
  for (int64_t i = 0; i < rank; ++i) axes[i] = i;
  if (ctx.has_input(3)) {
    ASSIGN_OR_RETURN(const ir::Tensor* a, ctx.ConstantInput(3, "axes"));
    ASSIGN_OR_RETURN(axes, TensorToInts(*a, "axes", ctx));
    for (int64_t& axis : axes) {
      if (axis < -rank || axis >= rank) return ctx.Error() << "axis " << axis << " is out of range for rank " << rank;
      if (axis < 0) axis += rank;
    }
  }
  const int64_t n = static_cast<int64_t>(axes.size());
  // Each pad amount: known at import (a constant, or arithmetic on constants and static dims), or one element of
  // the pads tensor sliced at run time (pads from a dynamic dim: a sequence padded to a multiple of a block).
  std::vector<std::optional<int64_t>> known(2 * n);
  const ir::ValueId pads = ctx.input(1);
  std::optional<std::vector<int64_t>> ints = ir::KnownInts(ctx.graph(), pads);
  if (!ints) {  // the file's declared shapes may hide what inference knows (TorchScript's "unk__N" dims)
    ir::InferShapes(ctx.graph()).IgnoreError();
    ints = ir::KnownInts(ctx.graph(), pads);
  }
  if (ints) {
    if (static_cast<int64_t>(ints->size()) != 2 * n) {
      return ctx.Error() << "has " << ints->size() << " pads for " << n << " axes; expected " << 2 * n;
    }
    if (std::any_of(ints->begin(), ints->end(), [](int64_t p) { return p < 0; })) {
      return ctx.Error() << "has negative pads (cropping), which onnxpipe does not import";
    }
    for (int64_t k = 0; k < 2 * n; ++k) known[k] = (*ints)[k];
  } else {
    const ir::Value& pv = ctx.graph().value(pads);
    if (!pv.shape_known || pv.shape.size() != 1 || pv.shape[0] != ir::Dim(2 * n)) {
      return ctx.Error() << "pads ('" << pv.name << "') must be a constant, or of known length " << 2 * n
                         << " (two per padded axis)";
    }
  }
  auto amount = [&](int64_t k) {
    if (known[k]) return ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({1}, {*known[k]}));
    return ctx.EmitHelper(OpKind::kSlice, {pads, ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({1}, {k})),
                                           ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({1}, {k + 1}))});
  };
  ir::Attrs fill_attr;
  fill_attr.Set("value", fill);
  auto block = [&](ir::ValueId of, int64_t axis, int64_t k) {
    std::vector<ir::ValueId> dims;
    ir::Attrs head, tail;
    head.Set("end", axis);
    tail.Set("start", axis + 1);
    if (axis > 0) dims.push_back(ctx.EmitHelper(OpKind::kShape, {of}, head));
    dims.push_back(amount(k));
    if (axis + 1 < rank) dims.push_back(ctx.EmitHelper(OpKind::kShape, {of}, tail));
    ir::Attrs cat;
    cat.Set("axis", int64_t{0});
    return ctx.EmitHelper(OpKind::kConstantOfShape, {ctx.EmitHelper(OpKind::kConcat, dims, cat)}, fill_attr);
  };
  auto pads_at = [&](int64_t k) { return !known[k] || *known[k] != 0; };  // a block to add (maybe empty at run time)
  ir::ValueId y = x;
  std::vector<int64_t> padded;
  for (int64_t j = 0; j < n; ++j) {
    if (pads_at(j) || pads_at(n + j)) padded.push_back(j);
  }
  for (size_t p = 0; p < padded.size(); ++p) {
    const int64_t j = padded[p], axis = axes[j];
    std::vector<ir::ValueId> parts;
    if (pads_at(j)) parts.push_back(block(y, axis, j));
    parts.push_back(y);
    if (pads_at(n + j)) parts.push_back(block(y, axis, n + j));
    ir::Attrs cat;
    cat.Set("axis", axis);
    if (p + 1 == padded.size()) return ctx.Emit(OpKind::kConcat, std::move(parts), std::move(cat));
    y = ctx.EmitHelper(OpKind::kConcat, std::move(parts), std::move(cat));
  }
  return ctx.Emit(OpKind::kIdentity, {x});  // nothing padded
}

ONNX_IMPORTER(ConstantOfShape) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(ir::Tensor value,
                   ctx.attrs().Get<ir::Tensor>("value", ir::Tensor(ir::DType::kF32, {1})));
  if (value.num_elements() != 1) {
    return ctx.Error() << "attribute value must hold exactly one element; got "
                       << value.DebugString(4);
  }
  ir::Attrs attrs;
  attrs.Set("value", value);
  return ctx.Emit(OpKind::kConstantOfShape, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Range) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(3, 3));
  return ctx.Emit(OpKind::kRange, {ctx.input(0), ctx.input(1), ctx.input(2)});
}

ONNX_IMPORTER(Trilu) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  ASSIGN_OR_RETURN(int64_t upper, ctx.attrs().Get<int64_t>("upper", 1));
  ir::Attrs attrs;
  attrs.Set("upper", upper);
  return ctx.Emit(OpKind::kTrilu, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

}  // namespace

void RegisterShapeImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, Transpose);
  REGISTER_ONNX_IMPORTER(r, Reshape);
  REGISTER_ONNX_IMPORTER(r, Flatten);
  REGISTER_ONNX_IMPORTER(r, Squeeze);
  REGISTER_ONNX_IMPORTER(r, Unsqueeze);
  REGISTER_ONNX_IMPORTER(r, Concat);
  REGISTER_ONNX_IMPORTER(r, Split);
  REGISTER_ONNX_IMPORTER(r, Slice);
  REGISTER_ONNX_IMPORTER(r, Shape);
  REGISTER_ONNX_IMPORTER(r, Expand);
  REGISTER_ONNX_IMPORTER(r, ConstantOfShape);
  REGISTER_ONNX_IMPORTER(r, Tile);
  REGISTER_ONNX_IMPORTER(r, Pad);
  REGISTER_ONNX_IMPORTER(r, Range);
  REGISTER_ONNX_IMPORTER_SINCE(r, Trilu, 14);
}

}  // namespace onnxpipe::onnx_frontend
