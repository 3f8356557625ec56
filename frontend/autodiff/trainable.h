// Which initializers a trainer trains: the general rule that tells a model's parameters from the
// buffers and constants an exporter also writes as initializers (rotary inv_freq, ALiBi slopes,
// mask fill values, eps, attention scales, position-id buffers), without looking at names.
//
// A float initializer is trained unless one of these holds (first match is the reason given):
//   kNonFloat      integer/bool: indices, shapes, masks (never a parameter; listed for the report);
//   kUnused        no graph output depends on it at all;
//   kNoGradient    outputs depend on it only through edges no gradient crosses: it is used only as an
//                  index, shape, Where condition or comparison operand (a causal-mask buffer sliced
//                  and compared, a position table cast to integers);
//   kSentinel      it holds an infinity, a NaN or its dtype's largest magnitude (finfo.min/max): the
//                  fill value of a mask, which no training produces;
//   kScalar        rank 0: torch's exporters lift every Python scalar of the traced code (eps,
//                  1/sqrt(d), GELU's coefficients, Pow's exponent, the 0 of a mask) into a rank-0
//                  initializer, while module parameters have at least one dim (a learned scalar such
//                  as CLIP's logit_scale is trained with --train-only);
//   kSinusoidal    its values are the fixed sinusoidal position encoding: along one axis, every
//                  column is sin(w p) or cos(w p) of the row index p (the PositionalEncoding buffer
//                  of PyTorch's tutorials and of the IDRIS benchmark model); a learned table is not;
//   kPositional    before its values meet any activation or other parameter, they are multiplied
//                  (Mul, MatMul, Gemm, Div) by a float that counts positions (a Cast of integer
//                  position ids or distances, a Range, or, in a fixed-size export, a constant tensor
//                  of several elements) in a product that broadcasts them over new positions: rotary
//                  inv_freq x positions, ALiBi slopes x distances. A parameter meets activations
//                  first (a Linear weight, a norm scale, an embedding table gathered by token ids
//                  and added to other embeddings, T5's relative bias table added to the scores);
//   kExportedBuffer the file records it as a registered buffer or lifted tensor constant (torch's
//                  dynamo exporter stores torch.export's graph signature in the graph metadata,
//                  ir::Value::exported_as): BART's final_logits_bias, rotary inv_freq;
//   kExporterMade  the file has that signature and it names no parameter or buffer for this
//                  initializer: the exporter made it, folding module state through a fixed
//                  computation (a position embedding gathered at the positions 0..S-1 of a
//                  fixed-shape export). Kept trained when every use, through Casts, is a MatMul or
//                  Gemm operand and it is rank 2: that is a Linear weight the exporter
//                  pre-transposed, the only copy of that parameter in the file;
//   kZeroRow       all zeros, of shape (1, ..., 1, N) with N > 1, and every use (through Casts and
//                  Identities) an operand of Add or Sub: a zero buffer added to activations
//                  (BART's final_logits_bias in a TorchScript export, which records no signature).
//                  A module's bias parameter is rank 1 (nn.Linear, Conv1D) and is not matched.
// The rules up to kPositional look at the graph only; the last three come after them (only what
// the graph rules leave trained is looked at) and use what the exporter recorded.
// The gradient paths are the autodiff's own (GradRegistry's stop edges), from the graph outputs
// (and TrainableOptions::targets). The user's regexes come first: --freeze freezes what it
// matches; --train-only freezes every float initializer it does not match and trains the ones it
// matches whatever the rule says. What stays indistinguishable from a parameter (a non-zero buffer
// added like a bias in a file without a signature, a parameter folded into a constant by an
// exporter that records nothing) is trained: --freeze names it.
//
// Runs on the forward graph as imported (before folding: a Cast of positions must still be there),
// in the forward pipeline's first pass (passes/freeze_buffers.h) and in `onnxpipe train`/`inspect`,
// which print the report. Decisions are stored in ir::Value::param_state; values already decided
// are kept, so running it twice changes nothing.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

enum class FreezeReason {
  kNone,  // trained
  kUserFreeze,
  kNotTrainOnly,
  kUnused,
  kNoGradient,
  kSentinel,
  kScalar,
  kSinusoidal,
  kPositional,
  kExportedBuffer,
  kExporterMade,
  kZeroRow,
  kNonFloat,  // integer/bool (reported, never a parameter)
};

// A short description of the reason, for reports ("rank-0 exporter literals (...)").
std::string_view FreezeReasonText(FreezeReason r);
// A stable key for JSON ("scalar", "positional", ...).
std::string_view FreezeReasonKey(FreezeReason r);

struct TrainableOptions {
  std::string freeze_regex;      // ECMAScript, std::regex_search on the names; empty: none
  std::string train_only_regex;  // empty: every initializer is a candidate
  // Values the loss reads besides the graph outputs (--logits when it is an inner value).
  std::vector<ir::ValueId> targets;
};

struct InitializerDecision {
  ir::ValueId value = ir::kNoValue;
  bool trainable = false;
  FreezeReason reason = FreezeReason::kNone;
};

struct TrainableReport {
  // The initializers this call decided (float ones whose param_state was kUndecided) and every
  // integer/bool initializer (kNonFloat), in value-id order.
  std::vector<InitializerDecision> decisions;

  int64_t num_trainable() const;
  // One line per reason with the count and the first few names, e.g.
  //   "rank-0 exporter literals (eps, scales, exponents, fill values): 5 (val_37, val_40, ...)".
  std::vector<std::string> SummaryLines(const ir::Graph& g, int max_names = 4) const;
};

// Decides every undecided float initializer of `g`; decided ones (ir::Value::param_state) keep
// their state and take part as what they are (a trained one counts as a parameter that others
// may meet). Fails on an invalid regex.
absl::StatusOr<TrainableReport> DecideTrainable(const ir::Graph& g, const TrainableOptions& options = {});

// Writes the report's decisions into ir::Value::param_state of float initializers.
void ApplyTrainable(ir::Graph* g, const TrainableReport& report);

// DecideTrainable + ApplyTrainable.
absl::StatusOr<TrainableReport> MarkTrainable(ir::Graph* g, const TrainableOptions& options = {});

}  // namespace onnxpipe::autodiff
