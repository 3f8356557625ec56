// What the CUDA op tests (cuda_ops_test.cc, cuda_ops_bf16_test.cc) share: a node run through CudaBackend::Run and
// through the CPU backend on the same inputs, compared (fp32 within a normalised error -- max |gpu - cpu| over
// max |cpu| -- or bit for bit), unplanned and planned (an allocator whose workspace is exactly what
// CudaBackend::WorkspaceBytes reported for the node), with the host fallbacks counted. Skips without a GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/planned_outputs.h"

namespace onnxpipe::cuda::ops_test {

using testing::PlannedOutputs;

using ir::DType;
using ir::Tensor;

inline ir::Attrs Attrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

inline Tensor Rand(std::vector<int64_t> dims, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return Tensor::FromVector<float>(std::move(dims), v);
}

inline Tensor Ints(std::vector<int64_t> dims, std::vector<int64_t> v, DType dtype = DType::kI64) {
  const Tensor t = Tensor::FromVector<int64_t>(std::move(dims), v);
  return dtype == DType::kI64 ? t : t.CastTo(dtype);
}

// Floats 0, 1, 2, 0, 1, 2, ... (comparisons of two of them hit equality).
inline Tensor SmallInts(std::vector<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 3);
  return Tensor::FromVector<float>(std::move(dims), v);
}

inline Tensor Bools(std::vector<int64_t> dims, uint32_t seed) {
  Tensor t(DType::kBool, std::move(dims));
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<bool>()[i] = gen() % 3 != 0;
  return t;
}

struct Case {
  ir::OpKind op = ir::OpKind::kIdentity;
  std::vector<Tensor> inputs = {};  // host tensors; undefined = absent, DimsOnly = a `like` input
  ir::Attrs attrs = {};
  int outputs = 1;
  std::vector<int> absent_outputs = {};  // optional outputs the node does not have
  double tol = 1e-5;                     // normalised max error; 0: bit for bit
  backend::ExecContext ctx = {};
  uint32_t host_inputs = 0;  // inputs left on the host (constants)
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {.attention = AttentionImpl::kFlash});
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
  }

  // How output k of the device (got) is judged against the CPU backend's (want).
  using Expect = std::function<void(size_t k, const Tensor& got, const Tensor& want)>;

  // The CPU backend's outputs of `c` on `reference_inputs`, and the CUDA backend's unplanned and
  // planned ones on c.inputs (planned twice: the step in ctx, then in device memory), compared by
  // `expect`.
  // The node of `c` in `g`: its inputs and outputs are values of g.
  static ir::NodeId AddCaseNode(const Case& c, ir::Graph& g) {
    std::vector<ir::ValueId> in_ids, out_ids;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (!t.defined()) {
        in_ids.push_back(ir::kNoValue);
        continue;
      }
      in_ids.push_back(g.AddValue("in" + std::to_string(i), t.dtype(), ir::Shape(t.dims().begin(), t.dims().end())));
    }
    for (int k = 0; k < c.outputs; ++k) {
      const bool absent = std::find(c.absent_outputs.begin(), c.absent_outputs.end(), k) != c.absent_outputs.end();
      out_ids.push_back(absent ? ir::kNoValue
                               : g.AddValue("out" + std::to_string(k), DType::kF32, {}, /*shape_known=*/false));
    }
    return g.AddNode(c.op, "node", in_ids, out_ids, c.attrs);
  }

  // The CPU backend's outputs of `c` on `inputs`.
  static std::vector<Tensor> CpuOutputs(const Case& c, const std::vector<Tensor>& inputs) {
    ir::Graph g;
    const ir::NodeId id = AddCaseNode(c, g);
    absl::StatusOr<std::vector<Tensor>> out = backend::MakeCpuBackend()->Run(g.node(id), inputs, c.ctx);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : std::vector<Tensor>();
  }

  void Compare(const Case& c, const std::vector<Tensor>& reference_inputs, bool expect_device, const Expect& expect) {
    ir::Graph g;
    const ir::Node& node = g.node(AddCaseNode(c, g));
    const std::string name(ir::OpName(c.op));
    const std::vector<Tensor> want = CpuOutputs(c, reference_inputs);
    if (want.empty()) return;
    std::vector<Tensor> dev_in;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (!t.has_data() || (c.host_inputs >> i & 1u) != 0) {
        dev_in.push_back(t);
        continue;
      }
      absl::StatusOr<Tensor> d = be_->Upload(t);
      ASSERT_TRUE(d.ok()) << d.status();
      dev_in.push_back(*d);
    }
    // The third run takes the step from device memory (ExecContext::device_offset, as a CUDA graph's
    // replay does) with a wrong ctx.offset beside it: it must not be read.
    absl::StatusOr<Tensor> device_step = be_->Upload(Tensor::Scalar<int64_t>(static_cast<int64_t>(c.ctx.offset)));
    ASSERT_TRUE(device_step.ok()) << device_step.status();
    for (int run = 0; run < 3; ++run) {
      const bool planned = run > 0;
      SCOPED_TRACE(name + (planned ? " planned" : " unplanned") + (run == 2 ? ", step on the device" : ""));
      backend::ExecContext ctx = c.ctx;
      if (run == 2) {
        ctx.device_offset = static_cast<const uint64_t*>(device_step->device_raw());
        ctx.offset += 7919;
      }
      PlannedOutputs plan(*be_, be_->WorkspaceBytes(g, node), /*share=*/false);
      const int64_t fallbacks_before = Fallbacks(name);
      absl::StatusOr<std::vector<Tensor>> got = be_->Run(node, dev_in, ctx, planned ? &plan : nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Fallbacks(name) - fallbacks_before, expect_device ? 0 : 1) << name << " ran on the host";
      // Trailing optional outputs may be left out or returned undefined (kernel.h): compare them as undefined.
      auto at = [](const std::vector<Tensor>& v, size_t k) { return k < v.size() ? v[k] : Tensor(); };
      for (size_t k = 0; k < std::max(got->size(), want.size()); ++k) {
        SCOPED_TRACE("output " + std::to_string(k));
        const Tensor w = at(want, k), gk = at(*got, k);
        if (k < node.outputs.size() && node.outputs[k] == ir::kNoValue) continue;  // not an output of the node
        ASSERT_EQ(gk.defined(), w.defined());
        if (!w.defined()) continue;
        ASSERT_FALSE(gk.on_host());
        absl::StatusOr<Tensor> h = be_->ToHost(gk);
        ASSERT_TRUE(h.ok()) << h.status();
        expect(k, *h, w);
      }
    }
  }

  void Check(const Case& c, bool expect_device = true) {
    Compare(c, c.inputs, expect_device,
            [&](size_t, const Tensor& got, const Tensor& want) { ExpectClose(got, want, c.tol); });
  }

  // A bf16 graph's node: c.inputs hold bf16 activations (and f32 statistics, integer indices, ...);
  // the reference is the CPU's fp32 kernel on those inputs widened to f32 (exactly), its outputs
  // rounded once to bf16 where the device output is bf16. `out_dtypes` are the dtypes the bf16
  // graph gives the outputs. c.tol = 0: bit for bit; otherwise bf16 outputs within one bf16 unit
  // in the last place (testing::Bf16Close) and f32 ones within c.tol as in Check. `reference`, when
  // given, replaces the widened inputs as the CPU kernel's.
  void CheckBf16(const Case& c, const std::vector<DType>& out_dtypes, bool expect_device = true,
                 const std::vector<Tensor>& reference = {}) {
    ASSERT_EQ(out_dtypes.size(), static_cast<size_t>(c.outputs));
    Compare(c, reference.empty() ? Widened(c.inputs) : reference, expect_device,
            [&](size_t k, const Tensor& got, const Tensor& want) {
              ASSERT_LT(k, out_dtypes.size());
              ASSERT_EQ(got.dtype(), out_dtypes[k]) << "the bf16 graph's output dtype";
              ASSERT_EQ(got.dims(), want.dims());
              if (out_dtypes[k] != DType::kBF16) {
                ExpectClose(got, want, c.tol);
                return;
              }
              const std::vector<float> g = Floats(got), w = Floats(want.CastTo(DType::kBF16));
              if (c.tol == 0) {
                const int64_t i = FirstDifferentBits(g, w);
                EXPECT_EQ(i, -1) << "not bit for bit the fp32 result rounded to bf16: element " << i << " is "
                                 << (i >= 0 ? g[i] : 0.f) << ", want " << (i >= 0 ? w[i] : 0.f) << " (signs matter); "
                                 << testing::Bf16Close(g, w, 0, 0, 0).message();
                return;
              }
              EXPECT_TRUE(testing::Bf16Close(g, w));
            });
  }

  // `inputs` with bf16 tensors widened to f32 (exactly).
  static std::vector<Tensor> Widened(const std::vector<Tensor>& inputs) {
    std::vector<Tensor> out;
    for (const Tensor& t : inputs) {
      if (!t.defined() || t.dtype() != DType::kBF16) {
        out.push_back(t);
      } else {
        out.push_back(t.has_data() ? t.CastTo(DType::kF32) : Tensor::DimsOnly(DType::kF32, t.dims()));
      }
    }
    return out;
  }

  // The first element whose bits differ (-0 is not +0; NaN meets any NaN: cvt.rn.bf16.f32 and the
  // CPU's FloatToBF16 canonicalise NaN differently), or -1; a and b have one size.
  static int64_t FirstDifferentBits(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
    }
    return -1;
  }

  // The elements of a float tensor (any float dtype) as floats.
  static std::vector<float> Floats(const Tensor& t) {
    const Tensor f = t.CastTo(DType::kF32);
    return std::vector<float>(f.data<float>(), f.data<float>() + f.num_elements());
  }

  int64_t Fallbacks(const std::string& op) const {
    const std::map<std::string, int64_t> f = be_->HostFallbacks();
    auto it = f.find(op);
    return it == f.end() ? 0 : it->second;
  }

  static void ExpectClose(const Tensor& got, const Tensor& want, double tol) {
    ASSERT_EQ(got.dtype(), want.dtype());
    ASSERT_EQ(got.dims(), want.dims());
    if (tol == 0 || want.dtype() != DType::kF32) {
      EXPECT_TRUE(got.BitwiseEquals(want)) << "not bit for bit equal";
      return;
    }
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      const double g = got.data<float>()[i], w = want.data<float>()[i];
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(g)) << "element " << i;
        continue;
      }
      max_err = std::max(max_err, std::abs(g - w));
      max_ref = std::max(max_ref, std::abs(w));
    }
    EXPECT_LE(max_err, tol * std::max(max_ref, 1e-30)) << "max |gpu - cpu| " << max_err << ", max |cpu| " << max_ref;
  }

  std::shared_ptr<CudaBackend> be_;
};

}  // namespace onnxpipe::cuda::ops_test
