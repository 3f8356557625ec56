// Strided views: a tensor read in place from another value's dense row-major buffer. Element
// (i_0, ..., i_{r-1}) of the view is element offset + sum_d i_d * strides[d] of the buffer (offsets
// and strides in elements). The attention-layout pass (frontend/passes/attention_layout.h) folds
// chains of layout ops (Reshape, Transpose, Split, ...) into such views, and Attention reads its
// Q, K, V and writes its O through them (frontend/ir/op.h), so the chains' copies disappear.
//
// Attribute form (ViewToInts / ViewFromInts): [offset, dim_0, stride_0, dim_1, stride_1, ...].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace onnxpipe::ir {

struct StridedView {
  int64_t offset = 0;
  std::vector<int64_t> dims, strides;

  int64_t NumElements() const;
  bool operator==(const StridedView&) const = default;
};

// The view of a whole dense buffer of `dims`.
StridedView ContiguousView(const std::vector<int64_t>& dims);

// A view while layout ops are applied to it: each dim a row-major run of (extent, stride) factors,
// so a reshape may merge dims that are not one stride apart (a (S, B, E) view of a packed (S, B, 3E)
// buffer reshaped to (S, B*H, Dh)) and a later transpose and reshape separate them again.
struct FactoredView {
  using Factors = std::vector<std::pair<int64_t, int64_t>>;  // (extent, stride), outermost first
  int64_t offset = 0;
  std::vector<Factors> dims;

  static FactoredView Of(const StridedView& v);
  std::vector<int64_t> Dims() const;
  // The plain view; nullopt when some dim's factors are not one stride apart.
  std::optional<StridedView> ToView() const;
};

// The view's dims permuted: dim d of the result is dim perm[d] of `v` (ONNX Transpose).
FactoredView ViewTranspose(const FactoredView& v, const std::vector<int64_t>& perm);
// The same elements in row-major order with other dims (ONNX Reshape, Flatten, Squeeze, Unsqueeze
// with concrete dims); nullopt when the element counts differ or a new dim would cut a factor
// unevenly.
std::optional<FactoredView> ViewReshape(const FactoredView& v, const std::vector<int64_t>& dims);
// Elements [start, start + length) of dim `axis` (Split); index `index` of it, the dim dropped
// (Gather with a scalar index). nullopt when that dim is not one stride.
std::optional<FactoredView> ViewNarrow(const FactoredView& v, int axis, int64_t start, int64_t length);
std::optional<FactoredView> ViewSelect(const FactoredView& v, int axis, int64_t index);

std::vector<int64_t> ViewToInts(const StridedView& v);
// Parses the attribute form; InvalidArgument naming `what` for an odd length, negative dims, or
// addresses outside a buffer of `buffer_elements` (negative strides are refused).
absl::StatusOr<StridedView> ViewFromInts(const std::vector<int64_t>& ints, int64_t buffer_elements,
                                         const std::string& what);

// True when `views` of one buffer of `buffer_elements` address every element exactly once between
// them (each view injective, no two overlapping, no element left out). Decided for views that are
// translates of one another (the same dims and strides, offsets a multiple of one step apart: the
// pieces of a packed projection); false whenever that cannot be proven.
bool CoversExactly(int64_t buffer_elements, const std::vector<StridedView>& views);

// A view spelled with standard layout ops (for writing ONNX): reshape the buffer to `fine`, take
// [starts, starts + lengths) of each fine dim, reshape that to `picked` (the taken fine dims whose
// length is not 1), transpose by `perm` and reshape to the view's dims. nullopt when the view's
// strides do not nest (each larger than the next stride times its dim).
struct NestedForm {
  std::vector<int64_t> fine, starts, lengths, picked, perm;
};
std::optional<NestedForm> ToNestedForm(const StridedView& v, int64_t buffer_elements);

}  // namespace onnxpipe::ir
