// Strided views against a reference that moves explicit element addresses: a tensor of addresses
// is reshaped, transposed, split and indexed the way the ONNX ops move data, and the view the
// functions compute must address the same elements in the same order.
#include "frontend/ir/strided_view.h"

#include <numeric>

#include "gtest/gtest.h"

namespace onnxpipe::ir {
namespace {

// A tensor of buffer addresses (row-major over dims).
struct Addresses {
  std::vector<int64_t> dims;
  std::vector<int64_t> at;
};

Addresses Iota(const std::vector<int64_t>& dims) {
  Addresses a{dims, {}};
  a.at.resize(std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>()));
  std::iota(a.at.begin(), a.at.end(), 0);
  return a;
}

std::vector<int64_t> Index(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> idx(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = flat % dims[d];
    flat /= dims[d];
  }
  return idx;
}

int64_t Flat(const std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  int64_t f = 0;
  for (size_t d = 0; d < dims.size(); ++d) f = f * dims[d] + idx[d];
  return f;
}

Addresses Transpose(const Addresses& a, const std::vector<int64_t>& perm) {
  Addresses out;
  for (int64_t p : perm) out.dims.push_back(a.dims[p]);
  out.at.resize(a.at.size());
  for (size_t i = 0; i < a.at.size(); ++i) {
    const std::vector<int64_t> o = Index(static_cast<int64_t>(i), out.dims);
    std::vector<int64_t> src(o.size());
    for (size_t d = 0; d < perm.size(); ++d) src[perm[d]] = o[d];
    out.at[i] = a.at[Flat(src, a.dims)];
  }
  return out;
}

Addresses Narrow(const Addresses& a, int axis, int64_t start, int64_t length, bool drop) {
  Addresses out;
  out.dims = a.dims;
  out.dims[axis] = length;
  for (size_t i = 0; i < a.at.size(); ++i) {
    const std::vector<int64_t> idx = Index(static_cast<int64_t>(i), a.dims);
    if (idx[axis] >= start && idx[axis] < start + length) out.at.push_back(a.at[i]);
  }
  if (drop) out.dims.erase(out.dims.begin() + axis);
  return out;
}

std::vector<int64_t> AddressesOf(const StridedView& v) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < v.NumElements(); ++i) {
    const std::vector<int64_t> idx = Index(i, v.dims);
    int64_t a = v.offset;
    for (size_t d = 0; d < idx.size(); ++d) a += idx[d] * v.strides[d];
    out.push_back(a);
  }
  return out;
}

// The exporter's nn.MultiheadAttention chain from the packed projection (S, B, 3E) to Q, K or V
// (B, H, S, Dh): merging B with H in between is not one stride, yet the result is a strided view.
TEST(StridedViewTest, MultiheadAttentionChainMatchesMovedAddresses) {
  const int64_t S = 3, B = 2, H = 2, Dh = 4, E = H * Dh;
  for (int part = 0; part < 3; ++part) {
    Addresses ref = Iota({S, B, 3 * E});
    std::optional<FactoredView> v = FactoredView::Of(ContiguousView({S, B, 3 * E}));
    auto reshape = [&](const std::vector<int64_t>& dims) {
      ref.dims = dims;
      v = ViewReshape(*v, dims);
      ASSERT_TRUE(v.has_value());
    };
    reshape({S, B, 3, E});
    reshape({1, S, B, 3, E});
    ref = Transpose(ref, {3, 1, 2, 0, 4});
    v = ViewTranspose(*v, {3, 1, 2, 0, 4});
    reshape({3, S, B, E});
    ref = Narrow(ref, 0, part, 1, /*drop=*/true);
    v = ViewSelect(*v, 0, part);
    ASSERT_TRUE(v.has_value());
    reshape({S, B * H, Dh});
    EXPECT_FALSE(v->ToView().has_value());  // (S, B*H, Dh) is not one stride per dim
    ref = Transpose(ref, {1, 0, 2});
    v = ViewTranspose(*v, {1, 0, 2});
    reshape({B, H, S, Dh});
    const std::optional<StridedView> plain = v->ToView();
    ASSERT_TRUE(plain.has_value());
    EXPECT_EQ(AddressesOf(*plain), ref.at) << "part " << part;
    EXPECT_EQ(plain->strides, (std::vector<int64_t>{3 * E, Dh, B * 3 * E, 1}));
  }
}

TEST(StridedViewTest, ReshapeRefusesToCutAFactorUnevenly) {
  const FactoredView v = ViewTranspose(FactoredView::Of(ContiguousView({4, 6})), {1, 0});  // (6, 4)
  EXPECT_TRUE(ViewReshape(v, {3, 2, 4}).has_value());
  EXPECT_FALSE(ViewReshape(v, {4, 6}).has_value());                             // 4 of the first factor's 6
  EXPECT_FALSE(ViewReshape(v, {5, 5}).has_value());                             // other element count
  EXPECT_FALSE(ViewNarrow(ViewReshape(v, {24}).value(), 0, 0, 2).has_value());  // not one stride
}

TEST(StridedViewTest, CoversExactly) {
  // Three (2, 4) pieces of a (2, 12) buffer, 4 elements apart.
  std::vector<StridedView> pieces;
  for (int i = 0; i < 3; ++i) pieces.push_back({4 * i, {2, 4}, {12, 1}});
  EXPECT_TRUE(CoversExactly(24, pieces));
  EXPECT_FALSE(CoversExactly(24, {pieces[0], pieces[1]}));                  // a piece unread
  EXPECT_FALSE(CoversExactly(24, {pieces[0], pieces[0], pieces[2]}));       // one read twice
  EXPECT_TRUE(CoversExactly(24, {StridedView{0, {4, 2, 3}, {1, 12, 4}}}));  // permuted
  EXPECT_FALSE(CoversExactly(24, {StridedView{0, {4, 6}, {6, 0}}}));        // broadcast
  EXPECT_FALSE(CoversExactly(24, {StridedView{0, {2, 12}, {12, 2}}}));      // out of range
}

TEST(StridedViewTest, NestedFormReadsTheViewsElements) {
  const int64_t n = 2 * 5 * 12;
  for (const StridedView& v : {StridedView{4, {2, 2, 5, 4}, {60, 4, 12, 1}}, StridedView{0, {5, 2, 12}, {12, 60, 1}},
                               StridedView{13, {3, 4}, {12, 1}}}) {
    const std::optional<NestedForm> f = ToNestedForm(v, n);
    ASSERT_TRUE(f.has_value());
    Addresses a = Iota(f->fine);
    for (size_t j = 0; j < f->fine.size(); ++j) a = Narrow(a, static_cast<int>(j), f->starts[j], f->lengths[j], false);
    a.dims = f->picked;
    a = Transpose(a, f->perm);
    EXPECT_EQ(a.at, AddressesOf(v));
  }
  EXPECT_FALSE(ToNestedForm(StridedView{0, {4, 6}, {5, 1}}, 24).has_value());  // rows overlap
}

TEST(StridedViewTest, AttributeFormIsChecked) {
  const StridedView v{3, {2, 4}, {12, 1}};
  EXPECT_EQ(ViewFromInts(ViewToInts(v), 24, "q_view").value(), v);
  EXPECT_FALSE(ViewFromInts({0, 2}, 24, "q_view").ok());             // even length
  EXPECT_FALSE(ViewFromInts({0, 2, -12, 4, 1}, 24, "q_view").ok());  // negative stride
  absl::StatusOr<StridedView> far = ViewFromInts({13, 2, 12, 4, 1}, 24, "node 'a' attribute q_view");
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("node 'a' attribute q_view"), std::string::npos) << far.status();
}

}  // namespace
}  // namespace onnxpipe::ir
