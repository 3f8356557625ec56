// Dropout on the GPU against the CPU backend: masks and outputs bit for bit over seeds, step
// offsets and micro-batch row offsets (element counts not a multiple of 8, so micro-batches start
// mid Philox block); backward from the mask and regenerated; bf16; argument errors.
#include "executor/cuda/dropout.h"

#include "executor/cpu/kernel.h"
#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::EvalContext;
using cpu::testing::Eval;
using cpu::testing::Eval1;
using cpu::testing::MakeNode;
using cpu::testing::Rand;
using ir::DType;
using ir::OpKind;
using ir::Tensor;

class DropoutTest : public CudaTest {};

ir::Node DropoutNode(double ratio, const std::string& name = "/layers.0/mlp/dropout/Dropout") {
  ir::Attrs a;
  a.Set("ratio", ratio);
  return MakeNode(OpKind::kDropout, 1, 2, a, name);
}

struct GpuDropout {
  Tensor y, mask;
};

GpuDropout RunForward(const ir::Node& node, const EvalContext& ctx, const Tensor& x) {
  auto p = DropoutParamsFor(node, ctx.training, ctx.seed, ctx.offset, ctx.row_offset, ctx.rows, x.num_elements());
  EXPECT_TRUE(p.ok()) << p.status();
  DeviceTensor dx(x), dy(x.dtype(), x.dims()), dm(DType::kBool, x.dims());
  const absl::Status st =
      DropoutForward(*p, x.dtype(), dx.get(), dy.get(), dm.as<uint8_t>(), x.num_elements(), nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return {dy.ToHost(), dm.ToHost()};
}

TEST_F(DropoutTest, MaskAndOutputEqualCpuBitwise) {
  const Tensor x = Rand(DType::kF32, {4, 7, 33}, 1, -2, 2);  // 924 elements, 231 per row
  int cases = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, (uint64_t{1} << 40) + 7}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 33) + 1}) {
      for (int64_t row_offset : {0, 1, 3, 12}) {
        for (double ratio : {0.1, 0.5, 0.9}) {
          const EvalContext ctx{true, seed, offset, row_offset, row_offset ? 4 : 0};
          const ir::Node node = DropoutNode(ratio);
          auto want = Eval(node, {x}, ctx);
          ASSERT_TRUE(want.ok()) << want.status();
          const GpuDropout got = RunForward(node, ctx, x);
          ASSERT_TRUE(got.mask.BitwiseEquals((*want)[1]))
              << "seed " << seed << " offset " << offset << " row_offset " << row_offset << " ratio " << ratio;
          ASSERT_TRUE(got.y.BitwiseEquals((*want)[0]));
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 108);
}

TEST_F(DropoutTest, MicroBatchMasksAreRowsOfTheFullBatchMask) {
  // 8 rows of 231 elements; micro-batches of 2 rows at row offsets 0, 2, 4, 6.
  const Tensor full = Rand(DType::kF32, {8, 231}, 2);
  const EvalContext ctx{true, 7, 5};
  const ir::Node node = DropoutNode(0.3);
  const Tensor whole = RunForward(node, ctx, full).mask;
  for (int64_t r = 0; r < 8; r += 2) {
    const Tensor part = Rand(DType::kF32, {2, 231}, 3);
    const Tensor mask = RunForward(node, EvalContext{true, 7, 5, r, 2}, part).mask;
    for (int64_t i = 0; i < part.num_elements(); ++i) {
      ASSERT_EQ(mask.data<uint8_t>()[i], whole.data<uint8_t>()[r * 231 + i]) << r << " " << i;
    }
  }
}

TEST_F(DropoutTest, RngKeyCloneReplaysTheMask) {
  const Tensor x = Rand(DType::kF32, {1001}, 4);
  const EvalContext ctx{true, 9, 2};
  ir::Node clone = DropoutNode(0.4, "/layers.0/mlp/dropout/Dropout_recompute");
  clone.attrs.Set("rng_key", std::string("/layers.0/mlp/dropout/Dropout"));
  EXPECT_TRUE(RunForward(clone, ctx, x).mask.BitwiseEquals(RunForward(DropoutNode(0.4), ctx, x).mask));
  EXPECT_FALSE(RunForward(DropoutNode(0.4, "/layers.1/mlp/dropout/Dropout"), ctx, x)
                   .mask.BitwiseEquals(RunForward(DropoutNode(0.4), ctx, x).mask));
}

TEST_F(DropoutTest, BackwardEqualsCpuFromMaskAndRegenerated) {
  const Tensor x = Rand(DType::kF32, {6, 77}, 5), dy = Rand(DType::kF32, {6, 77}, 6);
  for (const EvalContext& ctx : {EvalContext{true, 11, 4}, EvalContext{true, 11, 4, 3, 6}, EvalContext{false, 11, 4}}) {
    const double ratio = 0.25;
    const ir::Node node = DropoutNode(ratio);
    const GpuDropout fwd = RunForward(node, ctx, x);
    ir::Attrs a;
    a.Set("ratio", ratio);
    auto want = Eval(MakeNode(OpKind::kDropoutGrad, 2, 1, a), {dy, fwd.mask}, ctx);
    ASSERT_TRUE(want.ok()) << want.status();
    auto p = DropoutParamsFor(node, ctx.training, ctx.seed, ctx.offset, ctx.row_offset, ctx.rows, x.num_elements());
    ASSERT_TRUE(p.ok());
    DeviceTensor ddy(dy), dmask(fwd.mask), dx1(DType::kF32, dy.dims()), dx2(DType::kF32, dy.dims());
    ASSERT_TRUE(
        DropoutBackward(*p, DType::kF32, ddy.get(), dmask.as<uint8_t>(), dx1.get(), dy.num_elements(), nullptr).ok());
    ASSERT_TRUE(DropoutBackward(*p, DType::kF32, ddy.get(), nullptr, dx2.get(), dy.num_elements(), nullptr).ok());
    EXPECT_TRUE(dx1.ToHost().BitwiseEquals((*want)[0])) << "training " << ctx.training;
    EXPECT_TRUE(dx2.ToHost().BitwiseEquals((*want)[0])) << "training " << ctx.training;
  }
}

TEST_F(DropoutTest, HalfTypesShareTheMaskAndRoundTheScaledValue) {
  const Tensor x32 = Rand(DType::kF32, {3, 333}, 7);
  const EvalContext ctx{true, 21, 8};
  const ir::Node node = DropoutNode(0.2);
  auto want = Eval(node, {x32}, ctx);
  ASSERT_TRUE(want.ok());
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Tensor x = x32.CastTo(dt);
    const GpuDropout got = RunForward(node, ctx, x);
    EXPECT_TRUE(got.mask.BitwiseEquals((*want)[1]));
    const float scale = static_cast<float>(1.0 / 0.8);
    Tensor expect(DType::kF32, x.dims());
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      expect.mutable_data<float>()[i] = got.mask.data<uint8_t>()[i] ? static_cast<float>(x.GetAsDouble(i)) * scale : 0;
    }
    EXPECT_TRUE(got.y.BitwiseEquals(expect.CastTo(dt))) << ir::DTypeName(dt);
  }
}

TEST_F(DropoutTest, InferenceRatioZeroAndRatioOne) {
  const Tensor x = Rand(DType::kF32, {257}, 8);
  for (const auto& [ctx, ratio] : {std::pair{EvalContext{false, 1, 1}, 0.5}, std::pair{EvalContext{true, 1, 1}, 0.0}}) {
    const GpuDropout got = RunForward(DropoutNode(ratio), ctx, x);
    EXPECT_TRUE(got.y.BitwiseEquals(x));
    EXPECT_EQ(got.mask.ToInt64Vector(), std::vector<int64_t>(257, 1));
  }
  auto want = Eval(DropoutNode(1.0), {x}, EvalContext{true, 1, 1});
  ASSERT_TRUE(want.ok());
  const GpuDropout all = RunForward(DropoutNode(1.0), EvalContext{true, 1, 1}, x);
  EXPECT_TRUE(all.y.BitwiseEquals((*want)[0]));
  EXPECT_EQ(all.mask.ToInt64Vector(), std::vector<int64_t>(257, 0));
}

// Captured once in a CUDA graph with the step offset in device memory, replays draw each step's
// CPU mask (forward and the regenerated backward).
TEST_F(DropoutTest, CapturedGraphReadsTheOffsetFromDeviceMemory) {
  const Tensor x = Rand(DType::kF32, {5, 123}, 9), dy = Rand(DType::kF32, {5, 123}, 10);
  const ir::Node node = DropoutNode(0.35);
  DeviceTensor dx(x), ddy(dy), y(DType::kF32, x.dims()), mask(DType::kBool, x.dims()), dgrad(DType::kF32, x.dims());
  DeviceTensor offset(DType::kI64, {1});
  auto p = DropoutParamsFor(node, true, 77, 0, 2, 5, x.num_elements());
  ASSERT_TRUE(p.ok());
  p->device_offset = offset.as<uint64_t>();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status f =
      DropoutForward(*p, DType::kF32, dx.get(), y.get(), mask.as<uint8_t>(), x.num_elements(), stream);
  const absl::Status b = DropoutBackward(*p, DType::kF32, ddy.get(), nullptr, dgrad.get(), x.num_elements(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(f.ok() && b.ok()) << f << b;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint64_t step : {uint64_t{1}, uint64_t{2}, (uint64_t{1} << 35) + 3}) {
    ASSERT_EQ(cudaMemcpy(offset.get(), &step, 8, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads above ran on the legacy stream
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const EvalContext ctx{true, 77, step, 2, 5};
    auto want = Eval(node, {x}, ctx);
    ASSERT_TRUE(want.ok());
    EXPECT_TRUE(mask.ToHost().BitwiseEquals((*want)[1])) << step;
    EXPECT_TRUE(y.ToHost().BitwiseEquals((*want)[0])) << step;
    ir::Attrs a;
    a.Set("ratio", 0.35);
    EXPECT_TRUE(dgrad.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kDropoutGrad, 2, 1, a), {dy, (*want)[1]}, ctx)))
        << step;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(DropoutTest, BadArgumentsAreErrors) {
  EXPECT_FALSE(DropoutParamsFor(DropoutNode(1.5), true, 0, 0, 0, 0, 10).ok());
  EXPECT_FALSE(DropoutParamsFor(DropoutNode(0.5), true, 0, 0, 1, 3, 10).ok());  // 10 elements, 3 rows
  DeviceTensor a(DType::kF32, {4}), b(DType::kF32, {4});
  DropoutParams p;
  EXPECT_FALSE(DropoutForward(p, DType::kI64, a.get(), b.get(), nullptr, 4, nullptr).ok());
  EXPECT_FALSE(DropoutForward(p, DType::kF32, nullptr, b.get(), nullptr, 4, nullptr).ok());
  p.ratio = -0.1;
  EXPECT_FALSE(DropoutBackward(p, DType::kF32, a.get(), nullptr, b.get(), 4, nullptr).ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
