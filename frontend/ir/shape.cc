#include "frontend/ir/shape.h"

#include <algorithm>
#include <atomic>

namespace onnxpipe::ir {

Dim Dim::Symbol(std::string name) {
  Dim d;
  d.symbols_.push_back(std::move(name));
  return d;
}

Dim Dim::Unknown() {
  static std::atomic<int64_t> counter{0};
  return Symbol("?" + std::to_string(counter++));
}

bool Dim::is_unknown() const {
  return std::any_of(symbols_.begin(), symbols_.end(),
                     [](const std::string& s) { return !s.empty() && s[0] == '?'; });
}

Dim Dim::operator*(const Dim& o) const {
  Dim r;
  r.factor_ = factor_ * o.factor_;
  r.symbols_ = symbols_;
  r.symbols_.insert(r.symbols_.end(), o.symbols_.begin(), o.symbols_.end());
  std::sort(r.symbols_.begin(), r.symbols_.end());
  if (r.factor_ == 0) r.symbols_.clear();
  return r;
}

std::optional<Dim> Dim::DivExact(const Dim& o) const {
  if (o.factor_ == 0 || factor_ % o.factor_ != 0) return std::nullopt;
  Dim r;
  r.factor_ = factor_ / o.factor_;
  r.symbols_ = symbols_;
  for (const std::string& s : o.symbols_) {
    auto it = std::find(r.symbols_.begin(), r.symbols_.end(), s);
    if (it == r.symbols_.end()) return std::nullopt;
    r.symbols_.erase(it);
  }
  return r;
}

Dim Dim::Bind(const std::map<std::string, int64_t>& bindings) const {
  Dim r;
  r.factor_ = factor_;
  for (const std::string& s : symbols_) {
    auto it = bindings.find(s);
    if (it != bindings.end()) {
      r.factor_ *= it->second;
    } else {
      r.symbols_.push_back(s);
    }
  }
  return r;
}

std::string Dim::ToString() const {
  if (symbols_.empty()) return std::to_string(factor_);
  std::string out = factor_ == 1 ? "" : std::to_string(factor_) + "*";
  for (size_t i = 0; i < symbols_.size(); ++i) out += (i ? "*" : "") + symbols_[i];
  return out;
}

bool IsConcrete(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](const Dim& d) { return d.is_concrete(); });
}

int64_t ElementCount(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Dim NumElements(const Shape& s) {
  Dim n(1);
  for (const Dim& d : s) n = n * d;
  return n;
}

std::optional<Shape> KeepBitsShape(const Shape& s) {
  if (s.empty()) return std::nullopt;
  const std::optional<Dim> bytes = s.back().DivExact(Dim(8));
  if (!bytes) return std::nullopt;
  Shape out = s;
  out.back() = *bytes;
  return out;
}

std::optional<std::vector<int64_t>> KeepBitsDims(const std::vector<int64_t>& dims) {
  const std::optional<Shape> bits = KeepBitsShape(FromInts(dims));
  if (!bits) return std::nullopt;
  return ToInts(*bits);
}

std::vector<int64_t> ToInts(const Shape& s) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (const Dim& d : s) out.push_back(d.value());
  return out;
}

Shape FromInts(const std::vector<int64_t>& dims) { return Shape(dims.begin(), dims.end()); }

std::string ShapeToString(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].ToString();
  return out + ")";
}

SliceAxis ClampSliceAxis(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (dim == 0) return {};
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    return {start, end > start ? (end - start + step - 1) / step : 0};
  }
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  return {start, start > end ? (start - end - step - 1) / -step : 0};
}

}  // namespace onnxpipe::ir
