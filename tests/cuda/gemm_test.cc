// cuBLASLt GEMMs against a double-precision reference written here: every transpose, batched, each type
// combination and each epilogue; tactic cache round trips; bad input. GPU tests skip without a GPU; the tactic
// cache (de)serialisation and GemmDesc validation tests need none.
#include "executor/cuda/gemm.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <cuda_runtime.h>

#include "executor/cuda/cuda_status.h"
#include "executor/io/atomic_file.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda {
namespace {

using ir::DType;

// ---- host values of the GEMM's types -------------------------------------------------------------------------

uint16_t ToBf16Bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16Bits(uint16_t h) {
  uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double RoundTo(DType t, double v) {
  return t == DType::kBF16 ? FromBf16Bits(ToBf16Bits(static_cast<float>(v))) : static_cast<float>(v);
}

std::vector<double> RandomValues(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = RoundTo(t, dist(rng));
  return v;
}

// A device buffer holding values of type `t`.
class DeviceArray {
 public:
  DeviceArray(DType t, const std::vector<double>& values) : type_(t), n_(values.size()) {
    const int64_t size = ir::DTypeSize(t);
    std::vector<char> bytes(n_ * size);
    for (int64_t i = 0; i < n_; ++i) {
      if (t == DType::kBF16) {
        const uint16_t h = ToBf16Bits(static_cast<float>(values[i]));
        std::memcpy(&bytes[i * 2], &h, 2);
      } else {
        const float f = static_cast<float>(values[i]);
        std::memcpy(&bytes[i * 4], &f, 4);
      }
    }
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes.size(), 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceArray(DType t, int64_t n) : DeviceArray(t, std::vector<double>(n, 0.0)) {}
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void* get() const { return ptr_; }
  std::vector<double> Read() const {
    const int64_t size = ir::DTypeSize(type_);
    std::vector<char> bytes(n_ * size);
    EXPECT_EQ(cudaMemcpy(bytes.data(), ptr_, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> out(n_);
    for (int64_t i = 0; i < n_; ++i) {
      if (type_ == DType::kBF16) {
        uint16_t h;
        std::memcpy(&h, &bytes[i * 2], 2);
        out[i] = FromBf16Bits(h);
      } else {
        float f;
        std::memcpy(&f, &bytes[i * 4], 4);
        out[i] = f;
      }
    }
    return out;
  }

 private:
  DType type_;
  int64_t n_;
  void* ptr_ = nullptr;
};

// Uninitialised device bytes (the GEMM workspace).
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) { EXPECT_EQ(cudaMalloc(&ptr_, n), cudaSuccess); }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

constexpr int64_t kWorkspaceBytes = 32 << 20;

// ---- reference -----------------------------------------------------------------------------------------------

double GeluTanh(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double GeluTanhGrad(double x) {
  const double c = std::sqrt(2 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}

// Elements a strided batch of `rows x cols` matrices spans.
int64_t Span(int64_t batch, int64_t stride, int64_t rows, int64_t cols) {
  return batch > 1 ? stride * (batch - 1) + rows * cols : rows * cols;
}

struct Operands {
  std::vector<double> a, b, c, bias, aux;  // aux: the dGELU input
};

Operands MakeOperands(const GemmDesc& d) {
  Operands o;
  o.a = RandomValues(d.input_type, Span(d.batch, d.stride_a, d.m, d.k), 1);
  o.b = RandomValues(d.input_type, Span(d.batch, d.stride_b, d.k, d.n), 2);
  o.c = RandomValues(d.output_type, Span(d.batch, d.stride_c, d.m, d.n), 3);
  o.bias = RandomValues(d.output_type, d.n, 4);
  o.aux = RandomValues(d.output_type, d.m * d.n, 5);
  for (double& x : o.aux) x = RoundTo(d.output_type, 3 * x);  // spans GELU's curved part
  return o;
}

double OpA(const GemmDesc& d, const Operands& o, int64_t p, int64_t m, int64_t k) {
  return o.a[p * d.stride_a + (d.trans_a ? k * d.m + m : m * d.k + k)];
}
double OpB(const GemmDesc& d, const Operands& o, int64_t p, int64_t k, int64_t n) {
  return o.b[p * d.stride_b + (d.trans_b ? n * d.k + k : k * d.n + n)];
}

struct Expected {
  std::vector<double> d, aux, bias_grad;  // d laid out like C (strided batch); aux/bias_grad when produced
};

Expected Reference(const GemmDesc& d, const Operands& o) {
  Expected e;
  e.d = o.c;  // elements between batch strides keep C's values
  if (d.epilogue == GemmEpilogue::kBiasGeluTanh) e.aux.assign(d.m * d.n, 0);
  if (d.epilogue == GemmEpilogue::kBGradA) e.bias_grad.assign(d.m, 0);
  if (d.epilogue == GemmEpilogue::kBGradB || d.epilogue == GemmEpilogue::kDGeluTanhBGrad) e.bias_grad.assign(d.n, 0);
  for (int64_t p = 0; p < d.batch; ++p) {
    for (int64_t m = 0; m < d.m; ++m) {
      for (int64_t n = 0; n < d.n; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < d.k; ++k) acc += OpA(d, o, p, m, k) * OpB(d, o, p, k, n);
        const int64_t at = p * d.stride_c + m * d.n + n;
        double v = d.alpha * acc + d.beta * o.c[at];
        switch (d.epilogue) {
          case GemmEpilogue::kBias: v += o.bias[n]; break;
          case GemmEpilogue::kBiasGeluTanh:
            e.aux[m * d.n + n] = v + o.bias[n];
            v = GeluTanh(v + o.bias[n]);
            break;
          case GemmEpilogue::kDGeluTanh:
          case GemmEpilogue::kDGeluTanhBGrad: v *= GeluTanhGrad(o.aux[m * d.n + n]); break;
          default: break;
        }
        if (d.epilogue == GemmEpilogue::kDGeluTanhBGrad) e.bias_grad[n] += v;
        e.d[at] = v;
      }
    }
  }
  for (int64_t m = 0; m < d.m && d.epilogue == GemmEpilogue::kBGradA; ++m) {
    for (int64_t k = 0; k < d.k; ++k) e.bias_grad[m] += OpA(d, o, 0, m, k);
  }
  for (int64_t n = 0; n < d.n && d.epilogue == GemmEpilogue::kBGradB; ++n) {
    for (int64_t k = 0; k < d.k; ++k) e.bias_grad[n] += OpB(d, o, 0, k, n);
  }
  return e;
}

// ||got - want|| / ||want||
double NormError(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The largest |got - want| and where, for failure messages: "max |got - want| E at element I (got G, want W)".
std::string Worst(const std::vector<double>& got, const std::vector<double>& want) {
  size_t at = 0;
  double worst = -1;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double e = std::abs(got[i] - want[i]);
    if (!(e <= worst)) worst = e, at = i;  // NaN counts as worst
  }
  if (worst < 0) return "no elements";
  return "max |got - want| " + std::to_string(worst) + " at element " + std::to_string(at) + " (got " +
         std::to_string(got[at]) + ", want " + std::to_string(want[at]) + ")";
}

// bf16 outputs: rounding to 8 bits of mantissa. TF32: 10-bit products. Exact fp32 otherwise; a GELU epilogue in fp32
// may evaluate tanh with the hardware approximation (relative error ~2^-11), so its outputs get 2e-3.
double Tolerance(const GemmDesc& d, bool through_gelu) {
  if (d.output_type == DType::kBF16) return 1e-2;
  if (d.input_type == DType::kF32 && d.allow_tf32) return 5e-3;
  return through_gelu ? 2e-3 : 1e-5;
}

bool HasGpu() { return DeviceCount() > 0; }

struct GpuResult {
  absl::Status status;
  std::vector<double> d, aux, bias_grad;
};

// Runs `d` on fresh random operands with `ctx`; `offset_a` shifts A's pointer by that many elements.
GpuResult RunOnGpu(GemmContext& ctx, const GemmDesc& d, const Operands& o, int64_t offset_a = 0) {
  std::vector<double> a(offset_a, 0.0);
  a.insert(a.end(), o.a.begin(), o.a.end());
  DeviceArray da(d.input_type, a), db(d.input_type, o.b), dc(d.output_type, o.c), dbias(d.output_type, o.bias),
      daux(d.output_type, o.aux), dbgrad(d.output_type, std::max(d.m, d.n));
  DeviceBytes dws(kWorkspaceBytes);
  GemmBuffers buf;
  buf.a = static_cast<char*>(da.get()) + offset_a * ir::DTypeSize(d.input_type);
  buf.b = db.get();
  buf.c = dc.get();
  buf.bias = dbias.get();
  buf.aux = daux.get();
  buf.bias_grad = dbgrad.get();
  buf.workspace = dws.get();
  buf.workspace_bytes = kWorkspaceBytes;
  GpuResult r;
  r.status = ctx.Run(d, buf, /*stream=*/nullptr);
  if (r.status.ok()) r.status = [] { CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize()); return absl::OkStatus(); }();
  r.d = dc.Read();
  r.aux = daux.Read();
  r.bias_grad = dbgrad.Read();
  return r;
}

// Runs `d` and compares every output with the reference.
void CheckAgainstReference(GemmContext& ctx, const std::string& name, const GemmDesc& d) {
  const Operands o = MakeOperands(d);
  const Expected want = Reference(d, o);
  GpuResult got = RunOnGpu(ctx, d, o);
  ASSERT_TRUE(got.status.ok()) << name << ": " << got.status;
  const bool gelu = d.epilogue != GemmEpilogue::kNone && d.epilogue != GemmEpilogue::kBias &&
                    d.epilogue != GemmEpilogue::kBGradA && d.epilogue != GemmEpilogue::kBGradB;
  const double err_d = NormError(got.d, want.d);
  std::printf("[gemm] %-28s D %.2e", name.c_str(), err_d);
  EXPECT_LT(err_d, Tolerance(d, gelu)) << name << ": D normalised error; " << Worst(got.d, want.d);
  if (!want.aux.empty()) {
    const double err = NormError(got.aux, want.aux);
    std::printf("  aux %.2e", err);
    EXPECT_LT(err, Tolerance(d, /*through_gelu=*/false)) << name << ": aux normalised error; " << Worst(got.aux, want.aux);
  }
  if (!want.bias_grad.empty()) {
    got.bias_grad.resize(want.bias_grad.size());
    const double err = NormError(got.bias_grad, want.bias_grad);
    std::printf("  bias_grad %.2e", err);
    EXPECT_LT(err, Tolerance(d, gelu)) << name << ": bias_grad normalised error; "
                                       << Worst(got.bias_grad, want.bias_grad);
  }
  std::printf("\n");
}

// ---- every variant -------------------------------------------------------------------------------------------

struct Case {
  std::string name;
  GemmDesc desc;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  const DType bf16 = DType::kBF16, f32 = DType::kF32;
  using E = GemmEpilogue;
  std::vector<Case> cases;
  // Plain GEMMs: every transpose per type; (M, N, K) = (64, 96, 80).
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const std::string tr = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
    cases.push_back({"bf16_" + tr, {.m = 64, .n = 96, .k = 80, .trans_a = ta, .trans_b = tb}});
    cases.push_back({"bf16_to_f32_" + tr,
                     {.m = 64, .n = 96, .k = 80, .trans_a = ta, .trans_b = tb, .output_type = f32,
                      .alpha = 0.5f, .beta = 1}});
    cases.push_back({"f32_" + tr,
                     {.m = 64, .n = 96, .k = 80, .trans_a = ta, .trans_b = tb, .input_type = f32,
                      .output_type = f32, .alpha = 0.5f, .beta = 0.25f}});
  }
  cases.push_back({"f32_tf32_NT", {.m = 64, .n = 96, .k = 256, .trans_b = true, .input_type = f32,
                                   .output_type = f32, .allow_tf32 = true}});
  // Strided batches: attention-style Q K^T, a B shared by the batch, a padded C stride with accumulation.
  cases.push_back({"bf16_batched_NT", {.m = 32, .n = 48, .k = 64, .trans_b = true, .batch = 6,
                                       .stride_a = 32 * 64, .stride_b = 48 * 64, .stride_c = 32 * 48}});
  cases.push_back({"bf16_batched_shared_B", {.m = 32, .n = 48, .k = 64, .batch = 5, .stride_a = 32 * 64,
                                             .stride_b = 0, .stride_c = 32 * 48}});
  cases.push_back({"f32_batched_TN_beta", {.m = 24, .n = 40, .k = 32, .trans_a = true, .batch = 3,
                                           .stride_a = 24 * 32, .stride_b = 32 * 40, .stride_c = 24 * 40 + 8,
                                           .input_type = f32, .output_type = f32, .beta = 1}});
  // Epilogues, in the Linear layouts: Y = X W^T (+ b) with W stored (out, in); dX = dY W; dW = dY^T X.
  const GemmDesc fwd{.m = 128, .n = 96, .k = 64, .trans_b = true};
  const GemmDesc dx{.m = 128, .n = 96, .k = 64};
  const GemmDesc dw{.m = 96, .n = 64, .k = 128, .trans_a = true};
  struct Types { std::string name; DType in, out; };
  for (const Types& ty : {Types{"bf16", bf16, bf16}, Types{"bf16_to_f32", bf16, f32}, Types{"f32", f32, f32}}) {
    auto with = [&](GemmDesc d, E e, float beta = 0) {
      d.input_type = ty.in;
      d.output_type = ty.out;
      d.epilogue = e;
      d.beta = beta;
      return d;
    };
    cases.push_back({ty.name + "_bias", with(fwd, E::kBias)});
    cases.push_back({ty.name + "_bias_beta", with(fwd, E::kBias, 0.5f)});
    cases.push_back({ty.name + "_bias_gelu_tanh", with(fwd, E::kBiasGeluTanh)});
    cases.push_back({ty.name + "_dgelu_tanh", with(dx, E::kDGeluTanh)});
    cases.push_back({ty.name + "_dgelu_tanh_bgrad", with(dx, E::kDGeluTanhBGrad)});
    cases.push_back({ty.name + "_dW_bgrad_a", with(dw, E::kBGradA, ty.out == f32 ? 1.f : 0.f)});
    GemmDesc dw_t = dw;  // dW^T (in, out) = X^T dY: the bias gradient comes from B = dY
    dw_t.m = 64, dw_t.n = 96;
    cases.push_back({ty.name + "_dWt_bgrad_b", with(dw_t, E::kBGradB, ty.out == f32 ? 1.f : 0.f)});
  }
  return cases;
}

class GemmCaseTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GemmCaseTest, MatchesDoubleReference) {
  auto ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  CheckAgainstReference(**ctx, GetParam().name, GetParam().desc);
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmCaseTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// M, N, K not multiples of 8 and a 2-byte-aligned A: cuBLASLt either computes it correctly or we report clearly.
TEST(GemmOddShapes, CorrectOrClearError) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  auto ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  for (int64_t offset_a : {0, 1}) {
    for (GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kBias}) {
      const GemmDesc d{.m = 37, .n = 53, .k = 29, .trans_b = true, .epilogue = e};
      const Operands o = MakeOperands(d);
      GpuResult got = RunOnGpu(**ctx, d, o, offset_a);
      const std::string name = "odd_37x53x29_" + std::string(GemmEpilogueName(e)) + "_offsetA" +
                               std::to_string(offset_a);
      if (!got.status.ok()) {
        std::printf("[gemm] %-28s refused: %s\n", name.c_str(), std::string(got.status.message()).c_str());
        EXPECT_EQ(got.status.code(), absl::StatusCode::kUnimplemented) << got.status;
        EXPECT_NE(got.status.message().find("M37 N53 K29"), std::string_view::npos) << got.status;
        continue;
      }
      const double err = NormError(got.d, Reference(d, o).d);
      std::printf("[gemm] %-28s D %.2e\n", name.c_str(), err);
      EXPECT_LT(err, 1e-2) << name;
    }
  }
  // The GELU aux epilogue needs N % 8 == 0: refused before reaching cuBLASLt.
  const GemmDesc gelu{.m = 37, .n = 53, .k = 29, .epilogue = GemmEpilogue::kBiasGeluTanh};
  GpuResult got = RunOnGpu(**ctx, gelu, MakeOperands(gelu));
  EXPECT_EQ(got.status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(got.status.message().find("N divisible by 8"), std::string_view::npos) << got.status;
}

TEST(GemmBuffersTest, NullPointersAreNamed) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  auto ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const GemmDesc d{.m = 8, .n = 8, .k = 8, .epilogue = GemmEpilogue::kBias};
  DeviceArray x(DType::kBF16, 64);
  GemmBuffers buf{.a = x.get(), .b = x.get(), .c = x.get()};
  absl::Status s = (*ctx)->Run(d, buf, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bias pointer is null"), std::string_view::npos) << s;
  buf.bias = x.get();
  buf.a = nullptr;
  s = (*ctx)->Run(d, buf, nullptr);
  EXPECT_NE(s.message().find("A pointer is null"), std::string_view::npos) << s;
  buf.a = x.get();
  buf.workspace_bytes = 1024;  // without a workspace pointer
  s = (*ctx)->Run(d, buf, nullptr);
  EXPECT_NE(s.message().find("workspace"), std::string_view::npos) << s;
}

// Prepared GEMMs are captured into a CUDA graph and replay correctly; an unprepared one is refused under capture.
// The problem is prepared with a bias 16 bytes past its allocation: the capture's buffers (256-byte aligned) take
// that plan, chosen for the weaker alignment, as nothing can be chosen while capturing.
TEST(GemmCaptureTest, PreparedGemmReplaysInAGraphAndUnpreparedIsRefused) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  auto ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const GemmDesc d{.m = 64, .n = 96, .k = 80, .trans_b = true, .epilogue = GemmEpilogue::kBias};
  const Operands o = MakeOperands(d);
  DeviceArray a(d.input_type, o.a), b(d.input_type, o.b), c(d.output_type, d.m * d.n), bias(d.output_type, o.bias);
  DeviceBytes ws(kWorkspaceBytes);
  const GemmBuffers buf{.a = a.get(), .b = b.get(), .c = c.get(), .bias = bias.get(), .workspace = ws.get(),
                        .workspace_bytes = kWorkspaceBytes};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceArray shifted_bias(d.output_type, static_cast<int64_t>(o.bias.size()) + 8);
  GemmBuffers shifted = buf;
  shifted.bias = static_cast<char*>(shifted_bias.get()) + 16;
  ASSERT_TRUE((*ctx)->Prepare(d, shifted, stream).ok());
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = (*ctx)->Run(d, buf, stream);
  GemmDesc unprepared = d;
  unprepared.m = 32;
  const absl::Status refused = (*ctx)->Run(unprepared, buf, stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_TRUE(captured.ok()) << captured;
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const double err = NormError(c.Read(), Reference(d, o).d);
  std::printf("[gemm] %-28s D %.2e\n", "graph_replay_bf16_bias", err);
  EXPECT_LT(err, 1e-2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- tactics -------------------------------------------------------------------------------------------------

std::string TempPath(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::filesystem::remove(path);
  return path;
}

// The dW accumulation (bf16 -> f32, beta = 1): timing candidates must leave C intact, so the result checks that too.
const GemmDesc kTunedDesc{.m = 256, .n = 192, .k = 320, .trans_a = true, .output_type = DType::kF32, .beta = 1};

TEST(GemmTacticTest, TimedTacticIsSavedAndReusedByAFreshContext) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string path = TempPath("gemm_tactics_roundtrip.json");
  const Operands o = MakeOperands(kTunedDesc);
  const Expected want = Reference(kTunedDesc, o);
  GemmTactic first;
  {
    auto ctx = GemmContext::Create({.tactic_cache_path = path});
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    GpuResult got = RunOnGpu(**ctx, kTunedDesc, o);
    ASSERT_TRUE(got.status.ok()) << got.status;
    EXPECT_LT(NormError(got.d, want.d), 1e-5);
    EXPECT_EQ((*ctx)->timed_problems(), 1);
    auto saved = GemmTacticCache::Load(path);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->size(), 1u);
  }
  auto again = GemmContext::Create({.tactic_cache_path = path});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->cache_load_status().ok());
  GpuResult got = RunOnGpu(**again, kTunedDesc, o);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_LT(NormError(got.d, want.d), 1e-5);
  EXPECT_EQ((*again)->timed_problems(), 0) << "the tactic should have come from the file";
  auto file = GemmTacticCache::Load(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), 1u);
  std::printf("[gemm] tuned tactic: %s", file->ToJson().c_str());
}

TEST(GemmTacticTest, SameAlgorithmIdAfterReload) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string path = TempPath("gemm_tactics_ids.json");
  DeviceArray a(DType::kBF16, 256 * 320), b(DType::kBF16, 320 * 192), c(DType::kF32, 256 * 192);
  DeviceBytes ws(kWorkspaceBytes);
  const GemmBuffers buf{.a = a.get(), .b = b.get(), .c = c.get(), .workspace = ws.get(),
                        .workspace_bytes = kWorkspaceBytes};
  auto first = GemmContext::Create({.tactic_cache_path = path});
  ASSERT_TRUE(first.ok()) << first.status();
  auto t1 = (*first)->Prepare(kTunedDesc, buf, nullptr);
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_GT(t1->time_us, 0);
  auto second = GemmContext::Create({.tactic_cache_path = path});
  ASSERT_TRUE(second.ok()) << second.status();
  auto t2 = (*second)->Prepare(kTunedDesc, buf, nullptr);
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->algo_id, t1->algo_id);
  EXPECT_EQ(t2->algo, t1->algo);
  EXPECT_EQ((*second)->timed_problems(), 0);
  // Without a cache file: the heuristic's first algorithm, untimed.
  auto plain = GemmContext::Create();
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto t3 = (*plain)->Prepare(kTunedDesc, buf, nullptr);
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ(t3->time_us, 0);
  EXPECT_EQ((*plain)->timed_problems(), 0);
}

TEST(GemmTacticTest, CorruptFileIsReportedIgnoredAndRewritten) {
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device";
  const std::string path = TempPath("gemm_tactics_corrupt.json");
  ASSERT_TRUE(io::WriteFileAtomically(path, "{\"format\": \"onnxpipe-gemm-tactics\", \"version\": 1, \"tac").ok());
  auto ctx = GemmContext::Create({.tactic_cache_path = path});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->cache_load_status().code(), absl::StatusCode::kDataLoss);
  const Operands o = MakeOperands(kTunedDesc);
  GpuResult got = RunOnGpu(**ctx, kTunedDesc, o);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_LT(NormError(got.d, Reference(kTunedDesc, o).d), 1e-5);
  auto rewritten = GemmTacticCache::Load(path);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->size(), 1u);
}

// No GPU needed from here on.

GemmTacticCache TwoTactics() {
  GemmTacticCache cache;
  cache.Insert("H200|bf16->bf16|NT|M65536 N4096 K1024|bias", {.algo_id = 66,
               .algo = {0x0123456789abcdefull, ~0ull, 0, 1, 2, 3, 0x8000000000000000ull, 42},
               .time_us = 812.5});
  cache.Insert("H200|f32->f32|NN|M8 N8 K8|none", {.algo_id = 0, .algo = {}, .time_us = 3.25});
  return cache;
}

TEST(GemmTacticCacheTest, FileRoundTripKeepsEveryTactic) {
  const std::string path = TempPath("gemm_tactics_file.json");
  const GemmTacticCache cache = TwoTactics();
  ASSERT_TRUE(cache.Save(path).ok());
  EXPECT_FALSE(std::filesystem::exists(io::AtomicTempPath(path)));
  auto loaded = GemmTacticCache::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  for (const char* key : {"H200|bf16->bf16|NT|M65536 N4096 K1024|bias", "H200|f32->f32|NN|M8 N8 K8|none"}) {
    ASSERT_NE(loaded->Find(key), nullptr) << key;
    EXPECT_EQ(*loaded->Find(key), *cache.Find(key)) << key;
  }
  EXPECT_EQ(loaded->Find("H200|other"), nullptr);
}

// Writer w of a shared tactic file: inserts its `each` problems, saving after every one. False when a save fails.
bool WriteSharedTactics(const std::string& path, int w, int each) {
  GemmTacticCache cache;
  for (int i = 0; i < each; ++i) {
    cache.Insert("writer" + std::to_string(w) + "|M" + std::to_string(i), {.algo_id = w, .time_us = 1.0 + i});
    if (!cache.SaveMerged(path).ok()) return false;
  }
  return true;
}

// The file holds every writer's problems with the tactic it inserted, and nothing else.
void ExpectEveryWritersTactics(const std::string& path, int writers, int each) {
  auto loaded = GemmTacticCache::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), static_cast<size_t>(writers * each));
  for (int w = 0; w < writers; ++w) {
    for (int i = 0; i < each; ++i) {
      const GemmTactic* t = loaded->Find("writer" + std::to_string(w) + "|M" + std::to_string(i));
      ASSERT_NE(t, nullptr) << w << " " << i;
      EXPECT_EQ(t->algo_id, w);
      EXPECT_EQ(t->time_us, 1.0 + i);
    }
  }
}

// Per-stream contexts share one file, each saving from its own thread. A plain Save would leave only the last
// writer's map; SaveMerged must keep every problem any thread timed.
TEST(GemmTacticCacheTest, ConcurrentMergedSavesKeepEveryWritersTactics) {
  const std::string path = TempPath("gemm_tactics_shared.json");
  constexpr int kWriters = 3, kEach = 12;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&path, w] { EXPECT_TRUE(WriteSharedTactics(path, w, kEach)) << "writer " << w; });
  }
  for (std::thread& t : writers) t.join();
  ExpectEveryWritersTactics(path, kWriters, kEach);
}

// Ranks of one node are processes sharing the file: the flock beside it serialises their merges.
TEST(GemmTacticCacheTest, ConcurrentMergedSavesFromProcessesKeepEveryTactic) {
  const std::string path = TempPath("gemm_tactics_ranks.json");
  constexpr int kRanks = 4, kEach = 15;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(WriteSharedTactics(path, rank, kEach) ? 0 : 1);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank's save failed";
  }
  ExpectEveryWritersTactics(path, kRanks, kEach);
  EXPECT_TRUE(std::filesystem::exists(path + ".lock"));
  EXPECT_FALSE(std::filesystem::exists(io::AtomicTempPath(path)));
}

TEST(GemmTacticCacheTest, MergedSaveToAnUnwritableFolderIsAnError) {
  GemmTacticCache cache = TwoTactics();
  const absl::Status saved = cache.SaveMerged(::testing::TempDir() + "/no_such_folder/gemm_tactics.json");
  ASSERT_FALSE(saved.ok());
  EXPECT_NE(saved.message().find("no_such_folder"), std::string_view::npos) << saved;
}

TEST(GemmTacticCacheTest, MergedSaveReplacesACorruptFile) {
  const std::string path = TempPath("gemm_tactics_replace.json");
  ASSERT_TRUE(io::WriteFileAtomically(path, "{\"format\": \"onnxpipe").ok());
  GemmTacticCache cache = TwoTactics();
  ASSERT_TRUE(cache.SaveMerged(path).ok());
  auto loaded = GemmTacticCache::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 2u);
}

TEST(GemmTacticCacheTest, MissingFileIsNotFound) {
  EXPECT_EQ(GemmTacticCache::Load(TempPath("gemm_tactics_absent.json")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(GemmTacticCacheTest, CorruptTextIsDataLossNamingTheProblem) {
  const std::string good = TwoTactics().ToJson();
  std::string bad_hex = good;
  bad_hex.replace(bad_hex.find("0123456789abcdef"), 1, "g");
  std::string bad_id = good;
  bad_id.replace(bad_id.find("66"), 2, "\"x\"");
  const std::vector<std::pair<std::string, std::string>> corrupt = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"[1, 2]", "not an object"},
      {"{\"format\": \"other\", \"version\": 1, \"tactics\": {}}", "\"format\""},
      {"{\"format\": \"onnxpipe-gemm-tactics\", \"version\": 2, \"tactics\": {}}", "\"version\""},
      {"{\"format\": \"onnxpipe-gemm-tactics\", \"version\": 1}", "\"tactics\""},
      {bad_hex, "\"algo\""},
      {bad_id, "\"algo_id\""},
  };
  for (const auto& [text, what] : corrupt) {
    auto parsed = GemmTacticCache::FromJson(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(parsed.status().message().find(what), std::string_view::npos) << parsed.status();
  }
  const std::string path = TempPath("gemm_tactics_bad.json");
  ASSERT_TRUE(io::WriteFileAtomically(path, "garbage").ok());
  auto loaded = GemmTacticCache::Load(path);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find(path), std::string_view::npos) << loaded.status();
}

TEST(GemmValidateTest, BadDescriptionsAreRefusedWithTheReason) {
  const std::vector<std::pair<GemmDesc, std::string>> bad = {
      {{.m = 0, .n = 4, .k = 4}, "M, N and K must be positive"},
      {{.m = 4, .n = 4, .k = 4, .batch = 0}, "batch must be >= 1"},
      {{.m = 4, .n = 4, .k = 4, .batch = 2, .stride_a = -1}, "batch strides of A and B"},
      {{.m = 4, .n = 4, .k = 4, .batch = 2, .stride_c = 15}, "batch stride of C must be >= M*N = 16"},
      {{.m = 4, .n = 4, .k = 4, .input_type = DType::kF16, .output_type = DType::kF16}, "inputs f16 with output f16"},
      {{.m = 4, .n = 4, .k = 4, .input_type = DType::kF32, .output_type = DType::kBF16}, "inputs f32 with output bf16"},
      {{.m = 4, .n = 8, .k = 4, .batch = 2, .stride_c = 32, .epilogue = GemmEpilogue::kBias}, "needs batch 1"},
      {{.m = 4, .n = 8, .k = 4, .epilogue = GemmEpilogue::kBiasGeluTanh, .beta = 1}, "needs beta = 0"},
      {{.m = 4, .n = 12, .k = 4, .epilogue = GemmEpilogue::kDGeluTanh}, "N divisible by 8"},
      {{.m = 4, .n = 8, .k = 4, .epilogue = GemmEpilogue::kBGradA, .alpha = 2}, "needs alpha = 1"},
  };
  for (const auto& [desc, what] : bad) {
    const absl::Status s = ValidateGemm(desc);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string_view::npos) << s;
  }
  EXPECT_TRUE(ValidateGemm({.m = 4, .n = 8, .k = 4, .epilogue = GemmEpilogue::kDGeluTanhBGrad}).ok());
  EXPECT_TRUE(ValidateGemm({.m = 3, .n = 5, .k = 7, .batch = 2, .stride_b = 0, .stride_c = 15,
                            .input_type = DType::kF32, .output_type = DType::kF32}).ok());
}

TEST(GemmWorkspaceTest, HopperPlansThirtyTwoMiB) {
  EXPECT_EQ(GemmWorkspaceBytes(9), 32 << 20);
  EXPECT_EQ(GemmWorkspaceBytes(8), 4 << 20);
}

}  // namespace
}  // namespace onnxpipe::cuda
