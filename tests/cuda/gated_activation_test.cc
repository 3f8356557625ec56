// GatedActivation and GatedActivationGrad on the GPU (gated_activation.h) against the CPU backend's
// kernels on the same inputs: fp32 within a normalised error of 1e-6 (the GPU's expf/erff/tanhf and
// fused multiply-adds differ from the host's libm by a few ulps), bf16 against the CPU's fp32 result
// on the widened inputs (within one bf16 rounding). Every activation (silu, gelu erf, gelu tanh); the
// backward with both gradients (one two-output launch) and with each alone; sizes on and off the
// 16-byte path (a tail after the last whole run, a misaligned pointer); and the backend's kernel
// table runs both ops on the device. Skips without a GPU.
#include "executor/cuda/gated_activation.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_kernels.h"
#include "frontend/ir/gated_activation.h"
#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Eval;
using cpu::testing::Eval1;
using cpu::testing::MakeNode;
using cpu::testing::Rand;
using ir::DType;
using ir::GatedAct;
using ir::OpKind;
using ir::Tensor;

class GatedActivationTest : public CudaTest {};

constexpr GatedAct kActs[] = {GatedAct::kSilu, GatedAct::kGeluErf, GatedAct::kGeluTanh};

// Llama's (B, S, FFN), a row off the 16-byte runs (a tail of 3), and one element.
const std::vector<std::vector<int64_t>> kShapes = {{2, 7, 64}, {3, 5, 11}, {1}};

// Which gradients the backward computes.
enum class Wanted { kBoth, kGateOnly, kUpOnly };

// t's data `offset` elements into a larger device buffer (a misaligned start when 1).
struct Padded {
  Padded(const Tensor& t, int64_t offset) : offset(offset), buffer(Pad(t, offset)) {}
  static Tensor Pad(const Tensor& t, int64_t offset) {
    Tensor p(t.dtype(), {t.num_elements() + offset});
    std::memcpy(static_cast<char*>(p.raw()) + offset * ir::DTypeSize(t.dtype()), t.raw(), t.num_bytes());
    return p;
  }
  template <typename T>
  T* ptr() const {
    return buffer.as<T>() + offset;
  }
  Tensor ToHost(const std::vector<int64_t>& dims) const {
    const Tensor all = buffer.ToHost();
    Tensor t(all.dtype(), dims);
    std::memcpy(t.raw(), static_cast<const char*>(all.raw()) + offset * ir::DTypeSize(t.dtype()), t.num_bytes());
    return t;
  }
  int64_t offset;
  DeviceTensor buffer;
};

// The GPU's results: {y} for the forward, {dgate, dup} for the backward (undefined where not wanted).
template <typename T>
std::vector<Tensor> OnDevice(GatedAct act, bool backward, Wanted wanted, const std::vector<Tensor>& in,
                             int64_t offset) {
  std::vector<std::unique_ptr<Padded>> d;
  for (const Tensor& t : in) d.push_back(std::make_unique<Padded>(t, offset));
  const Tensor zeros(in[0].dtype(), in[0].dims());
  const int64_t n = in[0].num_elements();
  if (!backward) {
    Padded y(zeros, offset);
    EXPECT_TRUE(GatedActivationForward(act, d[0]->ptr<T>(), d[1]->ptr<T>(), y.ptr<T>(), n, nullptr).ok());
    return {y.ToHost(in[0].dims())};
  }
  Padded dgate(zeros, offset), dup(zeros, offset);
  const absl::Status st = GatedActivationBackward(act, d[0]->ptr<T>(), d[1]->ptr<T>(), d[2]->ptr<T>(),
                                                  wanted == Wanted::kUpOnly ? nullptr : dgate.ptr<T>(),
                                                  wanted == Wanted::kGateOnly ? nullptr : dup.ptr<T>(), n, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return {wanted == Wanted::kUpOnly ? Tensor() : dgate.ToHost(in[0].dims()),
          wanted == Wanted::kGateOnly ? Tensor() : dup.ToHost(in[0].dims())};
}

ir::Node CpuNode(GatedAct act, bool backward) {
  return MakeNode(backward ? OpKind::kGatedActivationGrad : OpKind::kGatedActivation, backward ? 3 : 2,
                  backward ? 2 : 1, ir::GatedActAttrs(act));
}

// The CPU's results on `in` (fp32 on bf16's widened values).
std::vector<Tensor> OnCpu(GatedAct act, bool backward, const std::vector<Tensor>& in) {
  std::vector<Tensor> wide;
  for (const Tensor& t : in) wide.push_back(t.CastTo(DType::kF32));
  absl::StatusOr<std::vector<Tensor>> r = Eval(CpuNode(act, backward), wide);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<Tensor>{};
}

void CheckAgainstCpu(DType dt, double tol) {
  uint32_t seed = dt == DType::kF32 ? 1 : 100;
  for (GatedAct act : kActs) {
    for (const std::vector<int64_t>& dims : kShapes) {
      std::vector<Tensor> in;  // dy, gate, up
      for (double range : {2.0, 6.0, 2.0}) in.push_back(Rand(DType::kF32, dims, seed++, -range, range).CastTo(dt));
      for (bool backward : {false, true}) {
        const std::vector<Tensor> ops = backward ? in : std::vector<Tensor>{in[1], in[2]};
        const std::vector<Tensor> want = OnCpu(act, backward, ops);
        for (Wanted wanted : {Wanted::kBoth, Wanted::kGateOnly, Wanted::kUpOnly}) {
          if (!backward && wanted != Wanted::kBoth) continue;
          for (int64_t offset : {0, 1}) {
            const std::vector<Tensor> got = dt == DType::kF32
                                                ? OnDevice<float>(act, backward, wanted, ops, offset)
                                                : OnDevice<__nv_bfloat16>(act, backward, wanted, ops, offset);
            ASSERT_EQ(got.size(), want.size());
            for (size_t k = 0; k < got.size(); ++k) {
              if (!got[k].defined()) continue;
              ASSERT_EQ(got[k].dtype(), dt);
              EXPECT_LT(NormalisedError(got[k].CastTo(DType::kF32), want[k]), tol)
                  << ir::GatedActName(act) << (backward ? " backward output " + std::to_string(k) : " forward") << ", "
                  << dims.size() << "-d of " << ops[0].num_elements() << ", wanted " << static_cast<int>(wanted)
                  << ", offset " << offset;
            }
          }
        }
      }
    }
  }
}

TEST_F(GatedActivationTest, Fp32MatchesTheCpu) { CheckAgainstCpu(DType::kF32, 1e-6); }

TEST_F(GatedActivationTest, Bf16IsTheFp32ResultRoundedOnce) { CheckAgainstCpu(DType::kBF16, 4e-3); }

TEST_F(GatedActivationTest, KernelTableRunsBothOpsOnTheDevice) {
  absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {});
  ASSERT_TRUE(be.ok()) << be.status();
  const KernelTable table = RegisterAllKernels();
  KernelContext ctx;
  ctx.backend = be->get();
  const std::vector<int64_t> dims = {2, 3, 48};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (GatedAct act : kActs) {
      const std::vector<Tensor> host = {Rand(DType::kF32, dims, 7).CastTo(dt),
                                        Rand(DType::kF32, dims, 8, -5, 5).CastTo(dt),
                                        Rand(DType::kF32, dims, 9).CastTo(dt)};
      std::vector<Tensor> dev;
      for (const Tensor& t : host) {
        absl::StatusOr<Tensor> d = (*be)->Upload(t);
        ASSERT_TRUE(d.ok()) << d.status();
        dev.push_back(*d);
      }
      for (bool backward : {false, true}) {
        const OpKind op = backward ? OpKind::kGatedActivationGrad : OpKind::kGatedActivation;
        ir::Graph g;
        const ir::Shape shape(dims.begin(), dims.end());
        std::vector<ir::ValueId> ins, outs;
        for (int i = 0; i < (backward ? 3 : 2); ++i) ins.push_back(g.AddValue("in" + std::to_string(i), dt, shape));
        for (int k = 0; k < (backward ? 2 : 1); ++k) outs.push_back(g.AddValue("out" + std::to_string(k), dt, shape));
        const ir::NodeId n = g.AddNode(op, "gated", ins, outs, ir::GatedActAttrs(act));
        const std::vector<Tensor> args = backward ? dev : std::vector<Tensor>{dev[1], dev[2]};
        KernelResult r = table.at(op).run(ctx, g.node(n), args);
        ASSERT_TRUE(r.has_value()) << ir::OpName(op) << " " << ir::DTypeName(dt) << " fell back to the host";
        ASSERT_TRUE(r->ok()) << r->status();
        const std::vector<Tensor> want = OnCpu(act, backward, backward ? host : std::vector<Tensor>{host[1], host[2]});
        ASSERT_EQ((*r)->size(), want.size());
        for (size_t k = 0; k < want.size(); ++k) {
          absl::StatusOr<Tensor> y = (*be)->ToHost((**r)[k]);
          ASSERT_TRUE(y.ok()) << y.status();
          EXPECT_LT(NormalisedError(y->CastTo(DType::kF32), want[k]), dt == DType::kF32 ? 1e-6 : 4e-3)
              << ir::OpName(op) << " " << ir::GatedActName(act) << " output " << k;
        }
      }
    }
  }
}

// Host-only: runs without a GPU.
TEST(GatedActivationArgsTest, RefusesANegativeCountAndABackwardWithNoOutput) {
  EXPECT_FALSE(GatedActivationForward<float>(GatedAct::kSilu, nullptr, nullptr, nullptr, -1, nullptr).ok());
  EXPECT_FALSE(
      GatedActivationBackward<float>(GatedAct::kSilu, nullptr, nullptr, nullptr, nullptr, nullptr, 4, nullptr).ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
