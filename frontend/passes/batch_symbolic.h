// Fixed-batch exports. PyTorch's exporter without dynamic axes bakes the export batch into
// Reshape/Expand shape constants (`x.view(b, s, h, dh)` becomes the constant [b, s, h, dh]).
// MakeBatchSymbolic re-derives a symbolic batch dim: the inputs' leading dim becomes the symbol,
// and each Reshape/Expand shape constant holding the export batch is rewritten where shape
// inference proves which entry is the batch (Reshape: exactly one entry equal to the export batch
// makes the element counts agree once replaced by -1; Expand: the entry faces the input's batch dim
// and becomes 1). When two entries could be the batch (batch 4 with 4 heads) it refuses, naming the
// node, and says to re-export with dynamic axes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::passes {

// See the file comment. `g` is an imported, shape-inferred forward graph whose inputs all have the
// same concrete leading dim (returned in *export_batch). Replaces it by `symbol` and re-infers every
// shape; afterwards the graph is polymorphic in the batch and BindSymbols can bind it.
absl::Status MakeBatchSymbolic(ir::Graph* g, const std::string& symbol, int64_t* export_batch);

// True when no graph input has a symbolic leading dim (a fixed-batch export).
bool HasFixedBatch(const ir::Graph& g);

// True when every graph input's leading dim is the concrete `batch`.
bool LeadingDimsAre(const ir::Graph& g, int64_t batch);

}  // namespace onnxpipe::passes
