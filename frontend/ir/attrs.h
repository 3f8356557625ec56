// Typed node attributes: attrs.Get<float>("epsilon", 1e-5f).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "frontend/ir/tensor.h"

namespace onnxpipe::ir {

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, Tensor>;

class Attrs {
 public:
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  void Set(const std::string& name, AttrValue v) { values_[name] = std::move(v); }
  void Erase(const std::string& name) { values_.erase(name); }
  const std::map<std::string, AttrValue>& all() const { return values_; }

  // Returns the attribute converted to T, or `def` when absent or of another kind.
  // T: int64_t/int/bool (from int), float/double (from float or int), std::string,
  // std::vector<int64_t>, std::vector<double>, Tensor.
  template <typename T>
  T Get(const std::string& name, T def = T()) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    const AttrValue& v = it->second;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (auto* d = std::get_if<double>(&v)) return static_cast<T>(*d);
      if (auto* i = std::get_if<int64_t>(&v)) return static_cast<T>(*i);
      return def;
    } else if constexpr (std::is_integral_v<T>) {
      if (auto* i = std::get_if<int64_t>(&v)) return static_cast<T>(*i);
      return def;
    } else {
      if (auto* x = std::get_if<T>(&v)) return *x;
      return def;
    }
  }

  bool operator==(const Attrs& o) const;
  std::string ToString() const;

 private:
  std::map<std::string, AttrValue> values_;
};

}  // namespace onnxpipe::ir
