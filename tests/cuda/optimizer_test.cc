// Multi-tensor SGD / AdamW steps and the global gradient norm on the GPU against the CPU backend's
// SGDUpdate / AdamWUpdate / SumSquares (-> SumScalars) -> Sqrt -> ClipScale over several steps (fp32 within 1e-6
// relative; the kernels round like the CPU's, so the steps are expected bitwise), with clipping
// scale, bf16 compute copies, batches of many tensors and chunks, and argument errors.
#include "executor/cuda/optimizer.h"

#include <cmath>
#include <functional>

#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Eval;
using cpu::testing::Eval1;
using cpu::testing::MakeNode;
using cpu::testing::Rand;
using ir::DType;
using ir::OpKind;
using ir::Tensor;

class OptimizerTest : public CudaTest {};

// One parameter's device state and the CPU's copy of it.
struct Param {
  Tensor p, s0, s1;  // CPU: param, momentum/m, v
  std::unique_ptr<DeviceTensor> dp, dg, ds0, ds1, dbf16;
  Param(int64_t n, uint32_t seed) : p(Rand(DType::kF32, {n}, seed)), s0(DType::kF32, {n}), s1(DType::kF32, {n}) {
    std::fill_n(s0.mutable_data<float>(), n, 0.f);
    std::fill_n(s1.mutable_data<float>(), n, 0.f);
    dp = std::make_unique<DeviceTensor>(p);
    dg = std::make_unique<DeviceTensor>(DType::kF32, std::vector<int64_t>{n});
    ds0 = std::make_unique<DeviceTensor>(s0);
    ds1 = std::make_unique<DeviceTensor>(s1);
    dbf16 = std::make_unique<DeviceTensor>(DType::kBF16, std::vector<int64_t>{n});
  }
  OptimizerTensor View() const {
    return {.param = dp->as<float>(),
            .grad = dg->as<float>(),
            .state0 = ds0->as<float>(),
            .state1 = ds1->as<float>(),
            .param_bf16 = dbf16->get(),
            .n = p.num_elements()};
  }
};

std::vector<std::unique_ptr<Param>> MakeParams(const std::vector<int64_t>& sizes) {
  std::vector<std::unique_ptr<Param>> ps;
  for (size_t i = 0; i < sizes.size(); ++i) ps.push_back(std::make_unique<Param>(sizes[i], 100 + i));
  return ps;
}

// Uploads a fresh gradient per parameter for `step` and returns the CPU copies.
std::vector<Tensor> NewGrads(const std::vector<std::unique_ptr<Param>>& ps, int step) {
  std::vector<Tensor> gs;
  for (size_t i = 0; i < ps.size(); ++i) {
    gs.push_back(Rand(DType::kF32, ps[i]->p.dims(), 1000 * step + i, -0.5, 0.5));
    EXPECT_EQ(cudaMemcpy(ps[i]->dg->get(), gs.back().raw(), gs.back().num_bytes(), cudaMemcpyHostToDevice), 0);
  }
  return gs;
}

// Compares the device state with the CPU's; returns how many elements differ in any bit.
int64_t ExpectStateMatches(const Param& ps, bool check_s0, bool check_s1, const std::string& where) {
  int64_t differ = 0;
  auto cmp = [&](const DeviceTensor& d, const Tensor& want, const char* what) {
    const Tensor got = d.ToHost();
    EXPECT_LT(MaxRelError(got, want, 1e-20), 1e-6) << where << " " << what;
    for (int64_t i = 0; i < want.num_elements(); ++i) differ += got.data<float>()[i] != want.data<float>()[i];
  };
  cmp(*ps.dp, ps.p, "param");
  if (check_s0) cmp(*ps.ds0, ps.s0, "state0");
  if (check_s1) cmp(*ps.ds1, ps.s1, "state1");
  EXPECT_TRUE(ps.dbf16->ToHost().BitwiseEquals(ps.p.CastTo(DType::kBF16))) << where << " bf16 copy";
  return differ;
}

TEST_F(OptimizerTest, AdamWStepsEqualCpu) {
  auto ps = MakeParams({1, 1000, 3 * 65536 + 17});
  const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
  ir::Attrs a;
  a.Set("beta1", beta1);
  a.Set("beta2", beta2);
  a.Set("eps", eps);
  a.Set("weight_decay", wd);
  int64_t differ = 0;
  for (int step = 1; step <= 5; ++step) {
    const double lr = 1e-3 * step;
    const std::vector<Tensor> gs = NewGrads(ps, step);
    // Steps 3 and 5 carry a clipping scale, as after ClipScale.
    const bool scaled = step % 2 == 1 && step > 1;
    const Tensor scale = Tensor::Scalar<float>(0.37f);
    DeviceTensor dscale(scale);
    std::vector<OptimizerTensor> views;
    for (const auto& p : ps) views.push_back(p->View());
    ASSERT_TRUE(AdamWStep(views, lr, step, beta1, beta2, eps, wd, scaled ? dscale.as<float>() : nullptr, nullptr).ok());
    for (size_t i = 0; i < ps.size(); ++i) {
      Param& p = *ps[i];
      std::vector<Tensor> in = {p.p, gs[i], p.s0, p.s1, Tensor::Scalar<double>(lr), Tensor::Scalar<int64_t>(step)};
      if (scaled) in.push_back(scale);
      auto out = Eval(MakeNode(OpKind::kAdamWUpdate, static_cast<int>(in.size()), 3, a), in);
      ASSERT_TRUE(out.ok()) << out.status();
      p.p = (*out)[0];
      p.s0 = (*out)[1];
      p.s1 = (*out)[2];
      differ += ExpectStateMatches(p, true, true, "AdamW step " + std::to_string(step));
    }
  }
  EXPECT_EQ(differ, 0) << "elements not bitwise equal to the CPU (within 1e-6 is the requirement)";
}

// An optimizer node's step reads its inputs and writes its outputs elsewhere: the same bits as the
// step in place, the inputs untouched.
TEST_F(OptimizerTest, OutOfPlaceStepEqualsInPlace) {
  const Tensor s0 = Rand(DType::kF32, {5000}, 7, 0, 1), s1 = Rand(DType::kF32, {5000}, 8, 0, 1);
  for (bool adamw : {false, true}) {
    // Same param, gradient and states in `in_place` and `before`; `out` receives the step.
    auto in_place = MakeParams({5000}), before = MakeParams({5000}), out = MakeParams({5000});
    for (auto* ps : {&in_place, &before}) {
      NewGrads(*ps, 1);
      ASSERT_EQ(cudaMemcpy((*ps)[0]->ds0->get(), s0.raw(), s0.num_bytes(), cudaMemcpyHostToDevice), 0);
      ASSERT_EQ(cudaMemcpy((*ps)[0]->ds1->get(), s1.raw(), s1.num_bytes(), cudaMemcpyHostToDevice), 0);
    }
    OptimizerTensor a = in_place[0]->View(), b = out[0]->View();
    b.grad = before[0]->dg->as<float>();
    b.param_in = before[0]->dp->as<float>();
    b.state0_in = before[0]->ds0->as<float>();
    b.state1_in = before[0]->ds1->as<float>();
    for (const OptimizerTensor& t : {a, b}) {
      const absl::Status st = adamw ? AdamWStep({t}, 1e-2, 1, 0.9, 0.99, 1e-8, 0.1, nullptr, nullptr)
                                    : SgdStep({t}, 1e-2, 0.9, 0.01, true, nullptr, nullptr);
      ASSERT_TRUE(st.ok()) << st;
    }
    EXPECT_TRUE(out[0]->dp->ToHost().BitwiseEquals(in_place[0]->dp->ToHost())) << adamw;
    EXPECT_TRUE(out[0]->ds0->ToHost().BitwiseEquals(in_place[0]->ds0->ToHost())) << adamw;
    if (adamw) {
      EXPECT_TRUE(out[0]->ds1->ToHost().BitwiseEquals(in_place[0]->ds1->ToHost()));
    }
    EXPECT_TRUE(out[0]->dbf16->ToHost().BitwiseEquals(in_place[0]->dbf16->ToHost())) << adamw;
    EXPECT_FALSE(out[0]->dp->ToHost().BitwiseEquals(before[0]->p)) << "the step changed nothing";
    EXPECT_TRUE(before[0]->dp->ToHost().BitwiseEquals(before[0]->p)) << "input param written";
    EXPECT_TRUE(before[0]->ds0->ToHost().BitwiseEquals(s0)) << "input state written";
  }
}

TEST_F(OptimizerTest, SgdStepsEqualCpu) {
  struct Config {
    double momentum, wd;
    bool nesterov;
  };
  for (const Config& c : {Config{0.9, 0.01, false}, Config{0.9, 0.0, true}, Config{0.0, 0.05, false}}) {
    auto ps = MakeParams({7, 65536, 100000});
    ir::Attrs a;
    a.Set("momentum", c.momentum);
    a.Set("weight_decay", c.wd);
    a.Set("nesterov", int64_t{c.nesterov});
    int64_t differ = 0;
    for (int step = 1; step <= 5; ++step) {
      const double lr = 0.1 / step;
      const std::vector<Tensor> gs = NewGrads(ps, step);
      const Tensor scale = Tensor::Scalar<float>(0.5f);
      DeviceTensor dscale(scale);
      const bool scaled = step == 2;
      std::vector<OptimizerTensor> views;
      for (const auto& p : ps) views.push_back(p->View());
      ASSERT_TRUE(
          SgdStep(views, lr, c.momentum, c.wd, c.nesterov, scaled ? dscale.as<float>() : nullptr, nullptr).ok());
      for (size_t i = 0; i < ps.size(); ++i) {
        Param& p = *ps[i];
        std::vector<Tensor> in = {p.p, gs[i], Tensor::Scalar<double>(lr)};
        in.push_back(c.momentum != 0 ? p.s0 : Tensor());
        if (scaled) in.push_back(scale);
        ir::Node node = MakeNode(OpKind::kSGDUpdate, static_cast<int>(in.size()), c.momentum != 0 ? 2 : 1, a);
        if (c.momentum == 0) node.inputs[3] = ir::kNoValue;
        auto out = Eval(node, in);
        ASSERT_TRUE(out.ok()) << out.status();
        p.p = (*out)[0];
        if (c.momentum != 0) p.s0 = (*out)[1];
        differ += ExpectStateMatches(p, c.momentum != 0, false, "SGD step " + std::to_string(step));
      }
    }
    EXPECT_EQ(differ, 0) << "momentum " << c.momentum;
  }
}

// One step of the CPU's AdamWUpdate (beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0.01) or
// SGDUpdate (nesterov momentum 0.9, weight decay 0.01) on p's CPU copy; the device state matches it.
void CpuStepMatches(Param& p, const Tensor& g, bool adamw, double lr, int step) {
  ir::Attrs a;
  absl::StatusOr<std::vector<Tensor>> out;
  if (adamw) {
    a.Set("beta1", 0.9);
    a.Set("beta2", 0.999);
    a.Set("eps", 1e-8);
    a.Set("weight_decay", 0.01);
    out = Eval(MakeNode(OpKind::kAdamWUpdate, 6, 3, a),
               {p.p, g, p.s0, p.s1, Tensor::Scalar<double>(lr), Tensor::Scalar<int64_t>(step)});
  } else {
    a.Set("momentum", 0.9);
    a.Set("weight_decay", 0.01);
    a.Set("nesterov", int64_t{1});
    out = Eval(MakeNode(OpKind::kSGDUpdate, 4, 2, a), {p.p, g, Tensor::Scalar<double>(lr), p.s0});
  }
  ASSERT_TRUE(out.ok()) << out.status();
  p.p = (*out)[0];
  p.s0 = (*out)[1];
  if (adamw) p.s1 = (*out)[2];
  EXPECT_EQ(ExpectStateMatches(p, true, adamw, "graph step " + std::to_string(step)), 0) << adamw;
}

using RecordStep = std::function<absl::Status(const std::vector<OptimizerTensor>&, bool adamw, cudaStream_t)>;
using SetScalars = std::function<void(bool adamw, double lr, int step)>;

// Captures `record` (AdamW, then SGD with nesterov momentum, over two parameters) in a CUDA graph and
// replays it for steps 1 to 3 at lr 0.01 * step, after `set` put the step's values in device memory:
// every replay equals the CPU's step.
void ExpectCapturedStepsMatchCpu(const RecordStep& record, const SetScalars& set) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (bool adamw : {true, false}) {
    auto ps = MakeParams({1000, 70001});
    std::vector<OptimizerTensor> views;
    for (const auto& p : ps) views.push_back(p->View());
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status st = record(views, adamw, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(st.ok()) << st;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int step = 1; step <= 3; ++step) {
      const double lr = 0.01 * step;
      set(adamw, lr, step);
      const std::vector<Tensor> gs = NewGrads(ps, step);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads ran on the legacy stream
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (size_t i = 0; i < ps.size(); ++i) CpuStepMatches(*ps[i], gs[i], adamw, lr, step);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// The step's fp32 scalars made on the host and copied to the device before each replay.
TEST_F(OptimizerTest, CapturedStepsReplayWithDeviceScalars) {
  DeviceTensor dscalars(DType::kU8, {64});
  const SgdScalars flags = MakeSgdScalars(0.1, 0.9, 0.01, /*nesterov=*/true);
  ExpectCapturedStepsMatchCpu(
      [&](const std::vector<OptimizerTensor>& views, bool adamw, cudaStream_t stream) {
        return adamw ? AdamWStepWithDeviceScalars(views, dscalars.as<AdamWScalars>(), nullptr, stream)
                     : SgdStepWithDeviceScalars(views, flags, dscalars.as<SgdScalars>(), nullptr, stream);
      },
      [&](bool adamw, double lr, int step) {
        if (adamw) {
          const AdamWScalars s = MakeAdamWScalars(lr, step, 0.9, 0.999, 1e-8, 0.01);
          ASSERT_EQ(cudaMemcpy(dscalars.get(), &s, sizeof(s), cudaMemcpyHostToDevice), cudaSuccess);
        } else {
          const SgdScalars s = MakeSgdScalars(lr, 0.9, 0.01, true);
          ASSERT_EQ(cudaMemcpy(dscalars.get(), &s, sizeof(s), cudaMemcpyHostToDevice), cudaSuccess);
        }
      });
}

// The stage executor's form under graphs: lr (f64) and the step count (i64) in device memory, the
// fp32 scalars made from them on the device inside the captured step.
TEST_F(OptimizerTest, CapturedStepsReadLrAndCountFromTheDevice) {
  DeviceTensor scalars(DType::kU8, {static_cast<int64_t>(kStepScalarsBytes)}), lr(DType::kF64, {}),
      count(DType::kI64, {});
  ExpectCapturedStepsMatchCpu(
      [&](const std::vector<OptimizerTensor>& views, bool adamw, cudaStream_t stream) {
        return adamw ? AdamWStepOnDevice(views, lr.as<double>(), count.as<int64_t>(), 0.9, 0.999, 1e-8, 0.01, nullptr,
                                         scalars.get(), stream)
                     : SgdStepOnDevice(views, lr.as<double>(), 0.9, 0.01, /*nesterov=*/true, nullptr, scalars.get(),
                                       stream);
      },
      [&](bool, double r, int step) {
        const int64_t n = step;
        ASSERT_EQ(cudaMemcpy(lr.get(), &r, sizeof(r), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(count.get(), &n, sizeof(n), cudaMemcpyHostToDevice), cudaSuccess);
      });
}

TEST_F(OptimizerTest, ManyTensorsAndChunksSpanSeveralLaunches) {
  // 150 tensors (> 64 per launch) and one of 600 chunks (> 512 blocks per launch).
  std::vector<int64_t> sizes;
  for (int i = 0; i < 150; ++i) sizes.push_back(1 + 997 * i);
  sizes.push_back(600 * 65536 + 3);
  auto ps = MakeParams(sizes);
  const std::vector<Tensor> gs = NewGrads(ps, 1);
  std::vector<OptimizerTensor> views;
  for (const auto& p : ps) views.push_back(p->View());
  ASSERT_TRUE(SgdStep(views, 0.5, 0.0, 0.0, false, nullptr, nullptr).ok());
  for (size_t i = 0; i < ps.size(); ++i) {
    const Tensor want = Eval1(MakeNode(OpKind::kSGDUpdate, 3), {ps[i]->p, gs[i], Tensor::Scalar<double>(0.5)});
    ASSERT_TRUE(ps[i]->dp->ToHost().BitwiseEquals(want)) << "tensor " << i;
  }
}

// Steps that form their gradients' sums of squares (OptimizerTensor::sum_squares, an update node's optional output)
// over tensors of one chunk, many chunks, none and more than one launch takes: each sum equals LaunchSumSquares'
// one-tensor segment bit for bit and the CPU's SumSquares within double rounding, and the update is the plain one's.
TEST_F(OptimizerTest, StepsFormingSumsOfSquaresEqualSumSquares) {
  std::vector<int64_t> sizes = {7, 0, 3 * 16384 + 5, 1 << 20};
  for (int i = 0; i < 70; ++i) sizes.push_back(1 + 613 * i);
  std::vector<int> ends;
  for (size_t i = 0; i < sizes.size(); ++i) ends.push_back(static_cast<int>(i) + 1);
  for (const bool adamw : {false, true}) {
    auto fused = MakeParams(sizes), plain = MakeParams(sizes);
    const std::vector<Tensor> gs = NewGrads(fused, 1);
    NewGrads(plain, 1);
    int64_t chunks = 0;
    for (int64_t n : sizes) chunks += NormChunks(n);
    DeviceTensor partials(DType::kF64, {chunks}), sums(DType::kF64, {static_cast<int64_t>(sizes.size())});
    DeviceTensor want_sums(DType::kF64, {static_cast<int64_t>(sizes.size())});
    std::vector<OptimizerTensor> fv, pv;
    std::vector<const float*> grads;
    std::vector<void*> outs;
    for (size_t i = 0, at = 0; i < sizes.size(); at += NormChunks(sizes[i++])) {
      fv.push_back(fused[i]->View());
      fv.back().sum_squares = sums.as<double>() + i;
      fv.back().sum_partials = partials.as<double>() + at;
      pv.push_back(plain[i]->View());
      grads.push_back(fused[i]->dg->as<float>());
      outs.push_back(want_sums.as<double>() + i);
    }
    if (adamw) {
      ASSERT_TRUE(AdamWStep(fv, 1e-3, 1, 0.9, 0.999, 1e-8, 0.01, nullptr, nullptr).ok());
      ASSERT_TRUE(AdamWStep(pv, 1e-3, 1, 0.9, 0.999, 1e-8, 0.01, nullptr, nullptr).ok());
    } else {
      ASSERT_TRUE(SgdStep(fv, 0.1, 0.9, 0.01, true, nullptr, nullptr).ok());
      ASSERT_TRUE(SgdStep(pv, 0.1, 0.9, 0.01, true, nullptr, nullptr).ok());
    }
    const size_t ws_bytes = SumSquaresWorkspaceBytes(sizes);
    DeviceTensor ws(DType::kU8, {static_cast<int64_t>(ws_bytes)});
    ASSERT_TRUE(SumSquaresBySegment(grads, sizes, ends, outs, /*f64_out=*/true, ws.get(), ws_bytes, nullptr).ok());
    const Tensor got = sums.ToHost(), want = want_sums.ToHost();
    ir::Attrs to64;
    to64.Set("to", std::string("f64"));
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string what = std::string(adamw ? "adamw" : "sgd") + " tensor " + std::to_string(i);
      EXPECT_EQ(got.data<double>()[i], want.data<double>()[i]) << what;
      const double cpu =
          sizes[i] == 0 ? 0.0 : Eval1(MakeNode(OpKind::kSumSquares, 1, 1, to64), {gs[i]}).data<double>()[0];
      EXPECT_NEAR(got.data<double>()[i], cpu, 1e-12 * cpu) << what;
      EXPECT_TRUE(fused[i]->dp->ToHost().BitwiseEquals(plain[i]->dp->ToHost())) << what;
      EXPECT_TRUE(fused[i]->ds0->ToHost().BitwiseEquals(plain[i]->ds0->ToHost())) << what;
      EXPECT_TRUE(fused[i]->dbf16->ToHost().BitwiseEquals(plain[i]->dbf16->ToHost())) << what;
    }
  }
  // All or none: a step with one tensor asking for its sum and one not is an argument error.
  auto ps = MakeParams({5, 6});
  NewGrads(ps, 1);
  DeviceTensor one(DType::kF64, {1}), part(DType::kF64, {1});
  std::vector<OptimizerTensor> mixed = {ps[0]->View(), ps[1]->View()};
  mixed[0].sum_squares = one.as<double>();
  mixed[0].sum_partials = part.as<double>();
  const absl::Status st = SgdStep(mixed, 0.1, 0.0, 0.0, false, nullptr, nullptr);
  EXPECT_NE(st.message().find("all or none"), std::string::npos) << st;
}

TEST_F(OptimizerTest, GradNormAndClipScaleEqualCpu) {
  const std::vector<int64_t> sizes = {5, 1 << 16, 3 * (1 << 16) + 9, 1000};
  for (double max_norm : {1.0, 1e6}) {
    std::vector<Tensor> gs;
    std::vector<std::unique_ptr<DeviceTensor>> dgs;
    std::vector<const float*> ptrs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      gs.push_back(Rand(DType::kF32, {sizes[i]}, 50 + i));
      dgs.push_back(std::make_unique<DeviceTensor>(gs.back()));
      ptrs.push_back(dgs.back()->as<float>());
    }
    const size_t ws_bytes = SumSquaresWorkspaceBytes(sizes);
    DeviceTensor ws(DType::kU8, {static_cast<int64_t>(ws_bytes)}), sum(DType::kF32, {}), scale(DType::kF32, {});
    ASSERT_TRUE(
        GradNorm(ptrs, sizes, sum.as<float>(), scale.as<float>(), max_norm, 1e-6, ws.get(), ws_bytes, nullptr).ok());
    const Tensor want_sum = Eval1(MakeNode(OpKind::kSumSquares, static_cast<int>(gs.size())), gs);
    const Tensor norm = Eval1(MakeNode(OpKind::kSqrt, 1), {want_sum});
    ir::Attrs a;
    a.Set("max_norm", max_norm);
    a.Set("eps", 1e-6);
    const Tensor want_scale = Eval1(MakeNode(OpKind::kClipScale, 1, 1, a), {norm});
    EXPECT_LT(MaxRelError(sum.ToHost(), want_sum), 1e-6);
    EXPECT_LT(MaxRelError(scale.ToHost(), want_scale), 1e-6) << max_norm;
    // ClipScale alone (the kernel of the op), from the norm.
    DeviceTensor dnorm(norm), alone(DType::kF32, {});
    ASSERT_EQ(LaunchClipScale(dnorm.as<float>(), static_cast<float>(max_norm), 1e-6f, alone.as<float>(), nullptr),
              cudaSuccess);
    EXPECT_TRUE(alone.ToHost().BitwiseEquals(want_scale)) << max_norm;
    EXPECT_EQ(scale.ToHost().GetAsDouble(0) == 1.0, max_norm == 1e6);
  }
  // A NaN gradient makes the sum and the scale NaN (the trainer's skip-step signal).
  Tensor g = Rand(DType::kF32, {100}, 60);
  g.mutable_data<float>()[37] = NAN;
  DeviceTensor dg(g), ws(DType::kU8, {64}), sum(DType::kF32, {}), scale(DType::kF32, {});
  ASSERT_TRUE(
      GradNorm({dg.as<float>()}, {100}, sum.as<float>(), scale.as<float>(), 1.0, 1e-6, ws.get(), 64, nullptr).ok());
  EXPECT_TRUE(std::isnan(sum.ToHost().GetAsDouble(0)));
  EXPECT_TRUE(std::isnan(scale.ToHost().GetAsDouble(0)));
}

// A stage's per-gradient sums of squares (SumSquares to=f64, one segment per node, an empty segment
// included) and their SumScalars over more terms than one launch takes (the carry between launches):
// against the CPU kernels on the same gradients, within double rounding of the partial sums' order.
TEST_F(OptimizerTest, SegmentSumsAndSumScalarsEqualCpu) {
  const std::vector<int64_t> sizes = {5, 1 << 16, 0, 3 * (1 << 16) + 9, 1000, 1};
  const std::vector<int> ends = {1, 2, 2, 4, 6};  // {5}, {65536}, {}, {0, 196617}, {1000, 1}
  std::vector<Tensor> gs;
  std::vector<std::unique_ptr<DeviceTensor>> dgs;
  std::vector<const float*> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    gs.push_back(Rand(DType::kF32, {sizes[i]}, 70 + i));
    dgs.push_back(std::make_unique<DeviceTensor>(gs.back()));
    ptrs.push_back(dgs.back()->as<float>());
  }
  const size_t ws_bytes = SumSquaresWorkspaceBytes(sizes);
  DeviceTensor ws(DType::kU8, {static_cast<int64_t>(ws_bytes) + 8}), sums(DType::kF64, {5});
  std::vector<void*> outs;
  for (int j = 0; j < 5; ++j) outs.push_back(sums.as<double>() + j);
  ASSERT_TRUE(SumSquaresBySegment(ptrs, sizes, ends, outs, /*f64_out=*/true, ws.get(), ws_bytes, nullptr).ok());
  const Tensor got = sums.ToHost();
  ir::Attrs to64;
  to64.Set("to", std::string("f64"));
  std::vector<Tensor> want;
  for (int j = 0, begin = 0; j < 5; begin = ends[j++]) {
    const std::vector<Tensor> seg(gs.begin() + begin, gs.begin() + ends[j]);
    want.push_back(seg.empty() ? Tensor::Scalar<double>(0)
                               : Eval1(MakeNode(OpKind::kSumSquares, static_cast<int>(seg.size()), 1, to64), seg));
    EXPECT_NEAR(got.data<double>()[j], want.back().data<double>()[0], 1e-12 * want.back().data<double>()[0]) << j;
  }
  EXPECT_EQ(got.data<double>()[2], 0.0);
  // 150 terms: three launches of SumScalars chained through the carry, added in order as the CPU does.
  std::vector<Tensor> terms;
  std::vector<std::unique_ptr<DeviceTensor>> dterms;
  std::vector<const double*> term_ptrs;
  for (int i = 0; i < 150; ++i) {
    terms.push_back(Tensor::Scalar<double>(std::ldexp(1.0, (i * 37) % 70 - 20) * (1 + i % 3)));
    dterms.push_back(std::make_unique<DeviceTensor>(terms.back()));
    term_ptrs.push_back(dterms.back()->as<double>());
  }
  for (bool f64_out : {true, false}) {
    DeviceTensor out(f64_out ? DType::kF64 : DType::kF32, {});
    ASSERT_EQ(LaunchSumScalars(term_ptrs.data(), 150, out.get(), f64_out, ws.as<double>(), nullptr), cudaSuccess);
    ir::Attrs to;
    to.Set("to", std::string(f64_out ? "f64" : "f32"));
    EXPECT_TRUE(out.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kSumScalars, 150, 1, to), terms))) << f64_out;
  }
}

TEST_F(OptimizerTest, BadArgumentsAreErrors) {
  Param p(10, 1);
  OptimizerTensor t = p.View();
  EXPECT_FALSE(AdamWStep({t}, 1e-3, 0, 0.9, 0.999, 1e-8, 0.0, nullptr, nullptr).ok());
  EXPECT_FALSE(SgdStep({t}, 0.1, 0.0, 0.0, true, nullptr, nullptr).ok());
  OptimizerTensor no_state = t;
  no_state.state1 = nullptr;
  EXPECT_FALSE(AdamWStep({no_state}, 1e-3, 1, 0.9, 0.999, 1e-8, 0.0, nullptr, nullptr).ok());
  no_state.state0 = nullptr;
  EXPECT_FALSE(SgdStep({no_state}, 0.1, 0.9, 0.0, false, nullptr, nullptr).ok());
  EXPECT_TRUE(SgdStep({no_state}, 0.1, 0.0, 0.0, false, nullptr, nullptr).ok());  // no momentum, no buffer
  DeviceTensor ws(DType::kU8, {8}), out(DType::kF32, {});
  EXPECT_FALSE(
      GradNorm({p.dg->as<float>()}, {10}, out.as<float>(), out.as<float>(), 0.0, 1e-6, ws.get(), 8, nullptr).ok());
  EXPECT_FALSE(GradNorm({p.dg->as<float>()}, {10, 5}, out.as<float>(), nullptr, 1.0, 1e-6, ws.get(), 8, nullptr).ok());
  EXPECT_FALSE(GradNorm({p.dg->as<float>()}, {10}, out.as<float>(), nullptr, 1.0, 1e-6, ws.get(), 4, nullptr).ok());
  EXPECT_FALSE(SumSquaresBySegment({p.dg->as<float>()}, {10}, {2}, {out.get()}, false, ws.get(), 8, nullptr).ok());
  EXPECT_FALSE(SumSquaresBySegment({p.dg->as<float>()}, {10}, {1, 1}, {out.get()}, false, ws.get(), 8, nullptr).ok());
  EXPECT_FALSE(AdamWStepWithDeviceScalars({t}, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(
      SgdStepWithDeviceScalars({no_state}, MakeSgdScalars(0.1, 0.9, 0, false), ws.as<SgdScalars>(), nullptr, nullptr)
          .ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
