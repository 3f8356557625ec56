// Dimensions and shapes: a dim is a positive factor times a product of named symbols ("B", "S").
// Concrete dims have no symbols. Products are kept exactly so that shape inference can follow
// Reshape(B*S, D) -> (B, S, D); anything it cannot express becomes a fresh unknown symbol "?k".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace onnxpipe::ir {

class Dim {
 public:
  Dim() = default;
  Dim(int64_t value) : factor_(value) {}  // NOLINT: implicit from an integer is intended.
  static Dim Symbol(std::string name);
  // A fresh unknown dimension, unique within the process.
  static Dim Unknown();

  bool is_concrete() const { return symbols_.empty(); }
  bool is_unknown() const;  // contains a "?" symbol
  int64_t value() const { return factor_; }  // meaningful only when is_concrete()
  int64_t factor() const { return factor_; }
  const std::vector<std::string>& symbols() const { return symbols_; }

  Dim operator*(const Dim& o) const;
  // this / o when it divides exactly (factor divisible, symbols a sub-multiset), else nullopt.
  std::optional<Dim> DivExact(const Dim& o) const;
  bool operator==(const Dim& o) const { return factor_ == o.factor_ && symbols_ == o.symbols_; }
  bool operator!=(const Dim& o) const { return !(*this == o); }

  // Replaces bound symbols by their values.
  Dim Bind(const std::map<std::string, int64_t>& bindings) const;
  std::string ToString() const;

 private:
  int64_t factor_ = 1;
  std::vector<std::string> symbols_;  // sorted
};

using Shape = std::vector<Dim>;

bool IsConcrete(const Shape& s);
// Product of all dims (the element count).
Dim NumElements(const Shape& s);
int64_t ElementCount(const std::vector<int64_t>& dims);  // of concrete dims; 1 for none
// The dims of a keep-bits tensor (u8, one bit per element of a tensor of dims `s`, op.h's Gelu):
// `s` with its last dim divided by 8; nullopt when `s` has no dims or its last is not a multiple of 8.
std::optional<Shape> KeepBitsShape(const Shape& s);
std::optional<std::vector<int64_t>> KeepBitsDims(const std::vector<int64_t>& dims);  // the same of concrete dims

// ONNX Slice on one axis of concrete size `dim` (step != 0): negative start and end count from the
// end, then they are clamped to [0, dim] (step > 0) or to [0, dim-1] / [-1, dim-1] (step < 0).
// `start` is the first index taken, meaningful when `length` > 0.
struct SliceAxis {
  int64_t start = 0;
  int64_t length = 0;
};
SliceAxis ClampSliceAxis(int64_t dim, int64_t start, int64_t end, int64_t step);
// Concrete dims as int64 (requires IsConcrete).
std::vector<int64_t> ToInts(const Shape& s);
Shape FromInts(const std::vector<int64_t>& dims);
std::string ShapeToString(const Shape& s);

}  // namespace onnxpipe::ir
