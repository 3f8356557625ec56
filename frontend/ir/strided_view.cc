#include "frontend/ir/strided_view.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "frontend/ir/shape.h"

namespace onnxpipe::ir {
namespace {

// The dims of `v` other than 1, as (dim, stride), in order.
std::vector<std::pair<int64_t, int64_t>> Proper(const StridedView& v) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t d = 0; d < v.dims.size(); ++d)
    if (v.dims[d] != 1) out.emplace_back(v.dims[d], v.strides[d]);
  return out;
}

// One injective view addressing all of [0, n): its proper dims, by increasing stride, nest densely.
bool Dense(const StridedView& v, int64_t n) {
  if (v.offset != 0 || v.NumElements() != n) return false;
  std::vector<std::pair<int64_t, int64_t>> p = Proper(v);
  std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  int64_t next = 1;
  for (const auto& [dim, stride] : p) {
    if (stride != next) return false;
    next *= dim;
  }
  return true;
}

}  // namespace

int64_t StridedView::NumElements() const { return ElementCount(dims); }

StridedView ContiguousView(const std::vector<int64_t>& dims) {
  StridedView v;
  v.dims = dims;
  v.strides.assign(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) v.strides[d] = v.strides[d + 1] * dims[d + 1];
  return v;
}

FactoredView FactoredView::Of(const StridedView& v) {
  FactoredView f;
  f.offset = v.offset;
  for (size_t d = 0; d < v.dims.size(); ++d) f.dims.push_back({{v.dims[d], v.strides[d]}});
  return f;
}

std::vector<int64_t> FactoredView::Dims() const {
  std::vector<int64_t> out;
  for (const Factors& f : dims) {
    int64_t n = 1;
    for (const auto& [extent, stride] : f) n *= extent;
    out.push_back(n);
  }
  return out;
}

std::optional<StridedView> FactoredView::ToView() const {
  StridedView v;
  v.offset = offset;
  for (const Factors& f : dims) {
    int64_t extent = 1, stride = 1;
    bool first = true;
    for (const auto& [e, s] : f) {  // merge factor (e, s) below the run (extent, stride)
      if (e == 1) continue;
      if (!first && stride != s * e) return std::nullopt;
      extent *= e;
      stride = s;
      first = false;
    }
    v.dims.push_back(extent);
    v.strides.push_back(first ? 1 : stride);
  }
  return v;
}

FactoredView ViewTranspose(const FactoredView& v, const std::vector<int64_t>& perm) {
  FactoredView out;
  out.offset = v.offset;
  for (int64_t p : perm) out.dims.push_back(v.dims[p]);
  return out;
}

std::optional<FactoredView> ViewReshape(const FactoredView& v, const std::vector<int64_t>& dims) {
  if (ElementCount(dims) != ElementCount(v.Dims())) return std::nullopt;
  if (ElementCount(dims) == 0) {
    FactoredView out = FactoredView::Of(ContiguousView(dims));
    out.offset = v.offset;
    return out;
  }
  std::vector<std::pair<int64_t, int64_t>> atoms;  // every factor other than 1, outermost first
  for (const FactoredView::Factors& f : v.dims)
    for (const auto& a : f)
      if (a.first != 1) atoms.push_back(a);
  FactoredView out;
  out.offset = v.offset;
  size_t next = 0;
  for (int64_t n : dims) {
    FactoredView::Factors f;
    int64_t need = n;
    while (need > 1) {
      auto& [extent, stride] = atoms[next];
      if (extent <= need) {
        if (need % extent != 0) return std::nullopt;
        f.emplace_back(extent, stride);
        need /= extent;
        ++next;
      } else {  // the new dim takes the outer `need` of this factor
        if (extent % need != 0) return std::nullopt;
        f.emplace_back(need, stride * (extent / need));
        extent /= need;
        need = 1;
      }
    }
    if (f.empty()) f.emplace_back(1, 1);
    out.dims.push_back(std::move(f));
  }
  return out;
}

std::optional<FactoredView> ViewNarrow(const FactoredView& v, int axis, int64_t start, int64_t length) {
  const std::optional<StridedView> plain = FactoredView{0, {v.dims[axis]}}.ToView();
  if (!plain) return std::nullopt;
  FactoredView out = v;
  out.offset += start * plain->strides[0];
  out.dims[axis] = {{length, plain->strides[0]}};
  return out;
}

std::optional<FactoredView> ViewSelect(const FactoredView& v, int axis, int64_t index) {
  std::optional<FactoredView> out = ViewNarrow(v, axis, index, 1);
  if (out) out->dims.erase(out->dims.begin() + axis);
  return out;
}

std::vector<int64_t> ViewToInts(const StridedView& v) {
  std::vector<int64_t> out = {v.offset};
  for (size_t d = 0; d < v.dims.size(); ++d) {
    out.push_back(v.dims[d]);
    out.push_back(v.strides[d]);
  }
  return out;
}

absl::StatusOr<StridedView> ViewFromInts(const std::vector<int64_t>& ints, int64_t buffer_elements,
                                         const std::string& what) {
  if (ints.empty() || ints.size() % 2 != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", ints.size(), " integers, expected [offset, dim, stride, ...] (an odd count)"));
  }
  StridedView v;
  v.offset = ints[0];
  int64_t last = v.offset;
  for (size_t i = 1; i < ints.size(); i += 2) {
    if (ints[i] < 0 || ints[i + 1] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dim ", ints[i], " with stride ", ints[i + 1], ", expected both >= 0"));
    }
    v.dims.push_back(ints[i]);
    v.strides.push_back(ints[i + 1]);
    last += (ints[i] - 1) * ints[i + 1];
  }
  if (v.NumElements() > 0 && (v.offset < 0 || last >= buffer_elements)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": addresses elements ", v.offset, " to ", last, " of a buffer of ", buffer_elements));
  }
  return v;
}

bool CoversExactly(int64_t buffer_elements, const std::vector<StridedView>& views) {
  if (views.empty()) return buffer_elements == 0;
  if (views.size() == 1) return Dense(views[0], buffer_elements);
  std::vector<int64_t> offsets;
  for (const StridedView& v : views) {
    if (v.dims != views[0].dims || v.strides != views[0].strides) return false;
    offsets.push_back(v.offset);
  }
  std::sort(offsets.begin(), offsets.end());
  const int64_t step = offsets[1] - offsets[0];
  for (size_t i = 0; i < offsets.size(); ++i)
    if (offsets[i] != static_cast<int64_t>(i) * step) return false;
  StridedView all = views[0];  // the pieces as one view with a leading dim over them
  all.offset = 0;
  all.dims.insert(all.dims.begin(), static_cast<int64_t>(views.size()));
  all.strides.insert(all.strides.begin(), step);
  return Dense(all, buffer_elements);
}

std::optional<NestedForm> ToNestedForm(const StridedView& v, int64_t buffer_elements) {
  // The proper dims by decreasing stride; each fine dim spans from its stride to the stride above.
  std::vector<int> order;
  for (int d = 0; d < static_cast<int>(v.dims.size()); ++d)
    if (v.dims[d] != 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v.strides[a] > v.strides[b]; });
  NestedForm f;
  std::vector<int64_t> fine_strides;
  int64_t above = buffer_elements;
  for (int d : order) {
    const int64_t s = v.strides[d];
    if (s <= 0 || above % s != 0) return std::nullopt;
    f.fine.push_back(above / s);
    fine_strides.push_back(s);
    f.lengths.push_back(v.dims[d]);
    above = s;
  }
  if (above > 1 || order.empty()) {  // the elements below the smallest stride: take one
    f.fine.push_back(above);
    fine_strides.push_back(1);
    f.lengths.push_back(1);
  }
  int64_t rem = v.offset;
  for (size_t j = 0; j < f.fine.size(); ++j) {
    f.starts.push_back(rem / fine_strides[j]);
    rem %= fine_strides[j];
    if (f.starts[j] + f.lengths[j] > f.fine[j]) return std::nullopt;
  }
  if (rem != 0) return std::nullopt;
  for (int d : order) f.picked.push_back(v.dims[d]);
  // Transposing `picked` (decreasing stride) back to the view's order of proper dims.
  std::vector<int> by_view = order;
  std::sort(by_view.begin(), by_view.end());
  for (int d : by_view) f.perm.push_back(std::find(order.begin(), order.end(), d) - order.begin());
  return f;
}

}  // namespace onnxpipe::ir
