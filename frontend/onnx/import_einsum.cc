// Einsum, lowered at import to IR ops that already have shape rules, kernels and gradients.
//
// PyTorch exports torch.outer, torch.einsum and some bilinear forms as Einsum. For one or two
// operands with single-letter labels (explicit "->" output or the implicit form) the lowering is:
// order every operand's axes as [output labels..., contracted labels...] (Transpose), insert the
// labels it lacks as size-1 axes (Unsqueeze), multiply with numpy broadcasting (Mul) and sum the
// contracted axes away (ReduceSum). That is exact for every such equation; it materialises the
// broadcast product, so it suits the small einsums exporters produce (outer products, position
// tables), not large contractions. An ellipsis ("...") stands for the dims an operand has beyond
// its letters (its rank must be known at import): they get unused letters, right-aligned across the
// operands as numpy broadcasts them, and lead the implicit output. Repeated labels within one operand
// (diagonals), an explicit output that leaves out the dims of an ellipsis (numpy refuses it too) and
// more than two operands are refused with an error naming the equation.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

struct Equation {
  std::vector<std::string> operands;  // labels per operand
  std::string output;
  bool explicit_output = false;  // "->" given
  std::string ellipsis;          // the letters that stand for the dims of "..."
};

// The equation split into operands and output, spaces dropped; labels are checked by CheckLabels.
absl::StatusOr<Equation> SplitEquation(ImportContext& ctx, const std::string& text, int n) {
  std::string s;
  for (char c : text) {
    if (c != ' ') s += c;
  }
  Equation eq;
  const size_t arrow = s.find("->");
  const std::string lhs = s.substr(0, arrow);
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    eq.operands.push_back(lhs.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(eq.operands.size()) != n) {
    return ctx.Error() << "equation '" << text << "' names " << eq.operands.size() << " operands; the node has " << n;
  }
  eq.explicit_output = arrow != std::string::npos;
  if (eq.explicit_output) eq.output = s.substr(arrow + 2);
  return eq;
}

// Replaces each "..." by letters the equation does not use: operand i's covers rank_i - (its letters) dims, which
// take the last of the widest ellipsis's letters (numpy's right alignment).
absl::Status ExpandEllipsis(ImportContext& ctx, const std::string& text, Equation& eq) {
  const int n = static_cast<int>(eq.operands.size());
  std::vector<int64_t> covered(n, -1);
  int64_t widest = 0;
  for (int i = 0; i < n; ++i) {
    if (eq.operands[i].find("...") == std::string::npos) continue;
    const ir::Value& v = InferredValue(ctx, ctx.input(i));
    if (!v.shape_known)
      return ctx.Error() << "equation '" << text << "': the ellipsis needs operand " << i << "'s rank";
    covered[i] = static_cast<int64_t>(v.shape.size()) - static_cast<int64_t>(eq.operands[i].size() - 3);
    if (covered[i] < 0) {
      return ctx.Error() << "equation '" << text << "': operand " << i << " has rank " << v.shape.size()
                         << ", fewer dims than its labels";
    }
    widest = std::max(widest, covered[i]);
  }
  if (std::all_of(covered.begin(), covered.end(), [](int64_t c) { return c < 0; })) return absl::OkStatus();
  for (char c = 'A'; c <= 'z' && static_cast<int64_t>(eq.ellipsis.size()) < widest; ++c) {
    if (!std::isalpha(static_cast<unsigned char>(c))) continue;
    bool used = eq.output.find(c) != std::string::npos;
    for (const std::string& op : eq.operands) used = used || op.find(c) != std::string::npos;
    if (!used) eq.ellipsis += c;
  }
  if (static_cast<int64_t>(eq.ellipsis.size()) < widest) {
    return ctx.Error() << "equation '" << text << "': no letters left for the ellipsis's " << widest << " dims";
  }
  for (int i = 0; i < n; ++i) {
    if (covered[i] >= 0) eq.operands[i].replace(eq.operands[i].find("..."), 3, eq.ellipsis.substr(widest - covered[i]));
  }
  if (const size_t e = eq.output.find("..."); e != std::string::npos) {
    eq.output.replace(e, 3, eq.ellipsis);
  } else if (eq.explicit_output && widest > 0) {
    return ctx.Error() << "equation '" << text << "': the output leaves out the " << widest
                       << " dims of the ellipsis; write '...' in it";
  }
  return absl::OkStatus();
}

// Checks the labels (letters, none repeated within an operand or the output, every output label an input's) and
// fills in the implicit output: the ellipsis's letters, then the labels that appear once, alphabetically.
absl::Status CheckLabels(ImportContext& ctx, const std::string& text, Equation& eq) {
  std::map<char, int> count;
  for (const std::string& op : eq.operands) {
    for (size_t i = 0; i < op.size(); ++i) {
      const char c = op[i];
      if (!std::isalpha(static_cast<unsigned char>(c))) {
        return ctx.Error() << "equation '" << text << "': '" << c << "' is not a label letter";
      }
      if (op.find(c, i + 1) != std::string::npos) {
        return ctx.Error() << "equation '" << text << "': label '" << c
                           << "' repeats within one operand (a diagonal); not supported";
      }
      ++count[c];
    }
  }
  if (!eq.explicit_output) {
    eq.output = eq.ellipsis;
    for (const auto& [c, k] : count) {
      if (k == 1 && eq.ellipsis.find(c) == std::string::npos) eq.output += c;
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < eq.output.size(); ++i) {
    const char c = eq.output[i];
    if (!count.count(c) || eq.output.find(c, i + 1) != std::string::npos) {
      return ctx.Error() << "equation '" << text << "': output label '" << c << "' is not an input label or repeats";
    }
  }
  return absl::OkStatus();
}

ONNX_IMPORTER(Einsum) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  ASSIGN_OR_RETURN(std::string text, ctx.attrs().Required<std::string>("equation"));
  const int n = ctx.num_inputs();
  ASSIGN_OR_RETURN(Equation eq, SplitEquation(ctx, text, n));
  RETURN_IF_ERROR(ExpandEllipsis(ctx, text, eq));
  RETURN_IF_ERROR(CheckLabels(ctx, text, eq));

  // Global axis order: output labels, then contracted labels in order of appearance.
  std::string order = eq.output;
  for (const std::string& op : eq.operands) {
    for (char c : op) {
      if (order.find(c) == std::string::npos) order += c;
    }
  }
  const int64_t num_out = static_cast<int64_t>(eq.output.size());

  // Each operand aligned to the global order, as a chain of pending steps.
  std::vector<ir::ValueId> aligned;
  for (int i = 0; i < n; ++i) {
    const std::string& labels = eq.operands[i];
    std::string present;  // this operand's labels in global order
    for (char c : order) {
      if (labels.find(c) != std::string::npos) present += c;
    }
    ir::ValueId v = ctx.input(i);
    std::vector<int64_t> perm;
    for (char c : present) perm.push_back(static_cast<int64_t>(labels.find(c)));
    bool identity = true;
    for (size_t k = 0; k < perm.size(); ++k) identity = identity && perm[k] == static_cast<int64_t>(k);
    if (!identity) {
      ir::Attrs a;
      a.Set("perm", perm);
      v = ctx.EmitHelper(OpKind::kTranspose, {v}, std::move(a));
    }
    std::vector<int64_t> missing;
    for (size_t k = 0; k < order.size(); ++k) {
      if (labels.find(order[k]) == std::string::npos) missing.push_back(static_cast<int64_t>(k));
    }
    if (!missing.empty()) {
      ir::Attrs a;
      a.Set("axes", missing);
      v = ctx.EmitHelper(OpKind::kUnsqueeze, {v}, std::move(a));
    }
    aligned.push_back(v);
  }
  std::vector<int64_t> contracted;
  for (int64_t k = num_out; k < static_cast<int64_t>(order.size()); ++k) contracted.push_back(k);

  ir::Attrs sum_attrs;
  sum_attrs.Set("axes", contracted);
  sum_attrs.Set("keepdims", int64_t{0});
  sum_attrs.Set("noop_with_empty_axes", int64_t{0});
  if (n == 1) {
    if (!contracted.empty()) return ctx.Emit(OpKind::kReduceSum, {aligned[0]}, std::move(sum_attrs));
    return ctx.Emit(OpKind::kIdentity, {aligned[0]});
  }
  if (contracted.empty()) return ctx.Emit(OpKind::kMul, {aligned[0], aligned[1]});
  const ir::ValueId product = ctx.EmitHelper(OpKind::kMul, {aligned[0], aligned[1]});
  return ctx.Emit(OpKind::kReduceSum, {product}, std::move(sum_attrs));
}

}  // namespace

void RegisterEinsumImporter(ImporterRegistry& r) { REGISTER_ONNX_IMPORTER(r, Einsum); }

}  // namespace onnxpipe::onnx_frontend
