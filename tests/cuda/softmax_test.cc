// Softmax / LogSoftmax and fused softmax + cross-entropy kernels against the CPU backend's
// Softmax, LogSoftmax, SoftmaxGrad, LogSoftmaxGrad, SoftmaxCrossEntropyLoss and
// SoftmaxCrossEntropyLossGrad on the same inputs; fp32 within 1e-5 relative (to the tensor's
// scale), bf16 outputs by normalised error (losses are fp32 for both).
#include "executor/cuda/softmax.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "tests/cuda/cuda_test_util.h"

namespace onnxpipe::cuda {
namespace {

using testing::AllClose;
using testing::CpuEval;
using testing::DeviceBuffer;
using testing::Download;
using testing::F32;
using testing::Floats;
using testing::NormalisedError;
using testing::Representable;
using testing::Uniform;
using testing::Upload;
using testing::UploadRaw;

template <typename T>
void ExpectMatch(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    EXPECT_LT(NormalisedError(got, want), 1e-2) << what;
  } else {
    EXPECT_TRUE(AllClose(got, want, 1e-5)) << what;
  }
}

struct Shape {
  int64_t rows, n;
};
// Vocabulary-sized and small rows, lengths off the vector width, one row and many.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {{1, 1000}, {64, 1024}, {300, 7}, {33, 50257}, {8, 4096}, {129, 33}};
  return shapes;
}
std::string Name(const Shape& s, bool log) {
  return std::string(log ? "LogSoftmax" : "Softmax") + " (" + std::to_string(s.rows) + ", " + std::to_string(s.n) + ")";
}

ir::Attrs LastAxis() {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  return attrs;
}

template <typename T>
class SoftmaxCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};
using ElementTypes = ::testing::Types<float, __nv_bfloat16>;
TYPED_TEST_SUITE(SoftmaxCudaTest, ElementTypes);

TYPED_TEST(SoftmaxCudaTest, ForwardMatchesCpu) {
  using T = TypeParam;
  uint32_t seed = 1;
  for (const Shape& s : Shapes()) {
    for (bool log : {false, true}) {
      const std::vector<float> x = Representable<T>(Uniform(s.rows * s.n, seed++, -8.f, 8.f));
      DeviceBuffer<T> xd(x.size()), yd(x.size());
      Upload(x, xd);
      ASSERT_TRUE(SoftmaxForward(xd.get(), yd.get(), s.rows, s.n, log, nullptr).ok());
      const auto want =
          CpuEval(log ? ir::OpKind::kLogSoftmax : ir::OpKind::kSoftmax, {F32({s.rows, s.n}, x)}, 1, LastAxis());
      ExpectMatch<T>(Download(yd), Floats(want[0]), Name(s, log));
    }
  }
}

TYPED_TEST(SoftmaxCudaTest, ForwardInPlace) {
  using T = TypeParam;
  const Shape s{16, 1000};
  const std::vector<float> x = Representable<T>(Uniform(s.rows * s.n, 5, -8.f, 8.f));
  DeviceBuffer<T> xd(x.size());
  Upload(x, xd);
  ASSERT_TRUE(SoftmaxForward(xd.get(), xd.get(), s.rows, s.n, /*log=*/false, nullptr).ok());
  const auto want = CpuEval(ir::OpKind::kSoftmax, {F32({s.rows, s.n}, x)}, 1, LastAxis());
  ExpectMatch<T>(Download(xd), Floats(want[0]), "in place");
}

// Rows with -inf entries (masks), some whole 16-byte packs of them at the start of a thread's share.
TYPED_TEST(SoftmaxCudaTest, NegativeInfinityGetsZeroProbability) {
  using T = TypeParam;
  const Shape s{8, 1000};
  std::vector<float> x = Representable<T>(Uniform(s.rows * s.n, 6, -8.f, 8.f));
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t i = 0; i < s.n; ++i) {
      if (i < 24 || i >= s.n - 5 || i % 7 == 3) x[r * s.n + i] = -INFINITY;
    }
  }
  DeviceBuffer<T> xd(x.size()), yd(x.size());
  Upload(x, xd);
  ASSERT_TRUE(SoftmaxForward(xd.get(), yd.get(), s.rows, s.n, /*log=*/false, nullptr).ok());
  const auto want = CpuEval(ir::OpKind::kSoftmax, {F32({s.rows, s.n}, x)}, 1, LastAxis());
  const std::vector<float> got = Download(yd);
  ExpectMatch<T>(got, Floats(want[0]), "masked softmax");
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == -INFINITY) {
      ASSERT_EQ(got[i], 0.f) << i;
    }
  }
}

// Output buffers misaligned against the input (offset by one element): element-wise access.
TYPED_TEST(SoftmaxCudaTest, MismatchedAlignmentFallsBackToElementwise) {
  using T = TypeParam;
  const Shape s{12, 1024};
  const int64_t n = s.rows * s.n;
  const std::vector<float> x = Representable<T>(Uniform(n, 7, -8.f, 8.f));
  const std::vector<float> dy = Representable<T>(Uniform(n, 8, -1.f, 1.f));
  DeviceBuffer<T> xd(n), yd(n + 1), dyd(n), dxd(n + 1);
  Upload(x, xd);
  Upload(dy, dyd);
  ASSERT_TRUE(SoftmaxForward(xd.get(), yd.get() + 1, s.rows, s.n, /*log=*/false, nullptr).ok());
  ASSERT_TRUE(SoftmaxBackward(dyd.get(), xd.get(), dxd.get() + 1, s.rows, s.n, /*log=*/false, nullptr).ok());
  const auto y_want = CpuEval(ir::OpKind::kSoftmax, {F32({s.rows, s.n}, x)}, 1, LastAxis());
  // The backward read x as its "y" input.
  const auto dx_want =
      CpuEval(ir::OpKind::kSoftmaxGrad, {F32({s.rows, s.n}, dy), F32({s.rows, s.n}, x)}, 1, LastAxis());
  std::vector<float> y = Download(yd), dx = Download(dxd);
  ExpectMatch<T>(std::vector<float>(y.begin() + 1, y.end()), Floats(y_want[0]), "softmax, y misaligned");
  ExpectMatch<T>(std::vector<float>(dx.begin() + 1, dx.end()), Floats(dx_want[0]), "gradient, dx misaligned");
}

TYPED_TEST(SoftmaxCudaTest, BackwardMatchesCpu) {
  using T = TypeParam;
  uint32_t seed = 50;
  for (const Shape& s : Shapes()) {
    for (bool log : {false, true}) {
      const ir::Tensor x = F32({s.rows, s.n}, Uniform(s.rows * s.n, seed++, -8.f, 8.f));
      const auto fwd = CpuEval(log ? ir::OpKind::kLogSoftmax : ir::OpKind::kSoftmax, {x}, 1, LastAxis());
      const std::vector<float> y = Representable<T>(Floats(fwd[0]));
      const std::vector<float> dy = Representable<T>(Uniform(y.size(), seed++, -1.f, 1.f));
      DeviceBuffer<T> yd(y.size()), dyd(y.size()), dxd(y.size());
      Upload(y, yd);
      Upload(dy, dyd);
      ASSERT_TRUE(SoftmaxBackward(dyd.get(), yd.get(), dxd.get(), s.rows, s.n, log, nullptr).ok());
      const auto want = CpuEval(log ? ir::OpKind::kLogSoftmaxGrad : ir::OpKind::kSoftmaxGrad,
                                {F32({s.rows, s.n}, dy), F32({s.rows, s.n}, y)}, 1, LastAxis());
      ExpectMatch<T>(Download(dxd), Floats(want[0]), "gradient of " + Name(s, log));
    }
  }
}

// --- cross-entropy ----------------------------------------------------------------------------

struct CeCase {
  int64_t rows, classes;
  LossReduction reduction;
  bool weights;
  float smoothing;
  bool ignore;           // every 5th row labelled ignore_index
  int64_t ignore_index;  // also a valid class in one case: only the attribute decides
  bool int32_labels;
  float dloss;  // kMean/kSum; kNone uses per-row values
};

std::string Name(const CeCase& c) {
  const char* red[] = {"mean", "sum", "none"};
  return "(" + std::to_string(c.rows) + ", " + std::to_string(c.classes) + ") " + red[static_cast<int>(c.reduction)] +
         (c.weights ? " weights" : "") + (c.smoothing != 0 ? " smoothing" : "") + (c.ignore ? " ignore" : "") +
         (c.int32_labels ? " i32" : " i64");
}

const std::vector<CeCase>& CeCases() {
  static const std::vector<CeCase> cases = {
      {256, 10, LossReduction::kMean, false, 0.f, true, -100, false, 1.f},
      {64, 1000, LossReduction::kMean, true, 0.f, true, -100, false, 0.5f},
      {16, 50257, LossReduction::kMean, false, 0.f, true, -100, false, 1.f},
      {100, 1001, LossReduction::kSum, false, 0.1f, false, 0, true, 2.f},
      {50, 37, LossReduction::kNone, true, 0.2f, true, 3, true, 0.f},
      {1, 4096, LossReduction::kMean, false, 0.f, false, 0, false, 1.f},
  };
  return cases;
}

struct CeResult {
  std::vector<float> loss, dlogits;
};

// A case on the device: its inputs uploaded, a buffer for every output (dlogits over the logits' buffer when
// `in_place`) and the kernel arguments every call shares; callers point loss, stats, dloss and dlogits.
template <typename T, typename L>
struct CeOnDevice {
  CeOnDevice(const CeCase& c, const std::vector<float>& logits, const std::vector<L>& labels,
             const std::vector<float>& weights, const std::vector<float>& dloss, bool in_place)
      : logits_d(c.rows * c.classes),
        dlogits_d(in_place ? 0 : c.rows * c.classes),
        weights_d(c.weights ? c.classes : 0),
        dloss_d(dloss.size()),
        loss_d(c.reduction == LossReduction::kNone ? c.rows : 1),
        stats_d(2 * c.rows),
        ws((CrossEntropyWorkspaceBytes(c.rows) + 3) / 4),
        labels_d(c.rows),
        in_place(in_place) {
    Upload(logits, logits_d);
    UploadRaw(labels, labels_d);
    if (c.weights) Upload(weights, weights_d);
    UploadRaw(dloss, dloss_d);
    args.rows = c.rows;
    args.classes = c.classes;
    args.logits = logits_d.get();
    args.labels = labels_d.get();
    args.weights = weights_d.get();
    args.has_ignore_index = c.ignore;
    args.ignore_index = c.ignore_index;
    args.label_smoothing = c.smoothing;
    args.reduction = c.reduction;
    args.workspace = ws.get();
  }
  T* dlogits() { return in_place ? logits_d.get() : dlogits_d.get(); }
  std::vector<float> DownloadDlogits() { return in_place ? Download(logits_d) : Download(dlogits_d); }

  DeviceBuffer<T> logits_d, dlogits_d;
  DeviceBuffer<float> weights_d, dloss_d, loss_d, stats_d, ws;
  DeviceBuffer<L> labels_d;
  bool in_place;
  CrossEntropyArgs<T, L> args;
};

// Runs the fused kernel; dlogits written over the logits' buffer when `in_place`.
template <typename T, typename L>
CeResult RunCrossEntropy(const CeCase& c, const std::vector<float>& logits, const std::vector<L>& labels,
                         const std::vector<float>& weights, const std::vector<float>& dloss, bool in_place) {
  CeOnDevice<T, L> d(c, logits, labels, weights, dloss, in_place);
  d.args.dloss = d.dloss_d.get();
  d.args.loss = d.loss_d.get();
  d.args.dlogits = d.dlogits();
  const absl::Status st = CrossEntropy(d.args, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return {Download(d.loss_d), d.DownloadDlogits()};
}

template <typename L>
std::vector<L> Labels(const CeCase& c, uint32_t seed) {
  std::vector<L> labels(c.rows);
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < c.rows; ++i) {
    labels[i] = static_cast<L>(c.ignore && i % 5 == 2 ? c.ignore_index : gen() % c.classes);
  }
  return labels;
}

template <typename T, typename L>
void CheckCrossEntropyAgainstCpu(const CeCase& c, bool in_place) {
  const std::vector<float> logits = Representable<T>(Uniform(c.rows * c.classes, 70, -6.f, 6.f));
  const std::vector<float> weights = Representable<T>(Uniform(c.classes, 71, 0.2f, 2.f));
  const std::vector<L> labels = Labels<L>(c, 72);
  const bool per_row = c.reduction == LossReduction::kNone;
  const std::vector<float> dloss = per_row ? Uniform(c.rows, 73, -1.f, 1.f) : std::vector<float>{c.dloss};

  ir::Attrs attrs;
  const char* red[] = {"mean", "sum", "none"};
  attrs.Set("reduction", std::string(red[static_cast<int>(c.reduction)]));
  if (c.ignore) attrs.Set("ignore_index", c.ignore_index);
  attrs.Set("label_smoothing", static_cast<double>(c.smoothing));
  const ir::Tensor labels_t = ir::Tensor::FromVector<L>({c.rows}, labels);
  std::vector<ir::Tensor> in = {F32({c.rows, c.classes}, logits), labels_t};
  if (c.weights) in.push_back(F32({c.classes}, weights));
  const auto fwd = CpuEval(ir::OpKind::kSoftmaxCrossEntropyLoss, in, 2, attrs);
  std::vector<ir::Tensor> grad_in = {per_row ? F32({c.rows}, dloss) : ir::Tensor::Scalar<float>(c.dloss), fwd[1],
                                     labels_t};
  if (c.weights) grad_in.push_back(F32({c.classes}, weights));
  const auto grad = CpuEval(ir::OpKind::kSoftmaxCrossEntropyLossGrad, grad_in, 1, attrs);

  const CeResult got = RunCrossEntropy<T, L>(c, logits, labels, weights, dloss, in_place);
  const std::string what = Name(c) + (in_place ? " in place" : "");
  EXPECT_TRUE(AllClose(got.loss, Floats(fwd[0]), 1e-5)) << "loss " << what;
  ExpectMatch<T>(got.dlogits, Floats(grad[0]), "dlogits " + what);
}

TYPED_TEST(SoftmaxCudaTest, CrossEntropyMatchesCpuLossAndGradient) {
  using T = TypeParam;
  for (const CeCase& c : CeCases()) {
    if (c.int32_labels) {
      CheckCrossEntropyAgainstCpu<T, int32_t>(c, /*in_place=*/false);
    } else {
      CheckCrossEntropyAgainstCpu<T, int64_t>(c, /*in_place=*/false);
    }
  }
  CheckCrossEntropyAgainstCpu<T, int64_t>(CeCases()[1], /*in_place=*/true);
}

// The IR's path: the forward writes the loss and Stats (m, s per row) and no log_prob; the backward reads the
// logits (f32 or bf16, as they are) and Stats once and writes dlogits in the logits' type. Each against the
// CPU kernels on the same values: SoftmaxCrossEntropyLoss with Stats, SoftmaxCrossEntropyLossGrad from them.
template <typename T, typename L>
void CheckCrossEntropyStatsPathAgainstCpu(const CeCase& c, bool in_place) {
  const std::vector<float> logits = Representable<T>(Uniform(c.rows * c.classes, 90, -6.f, 6.f));
  const std::vector<float> weights = Uniform(c.classes, 91, 0.2f, 2.f);
  const std::vector<L> labels = Labels<L>(c, 92);
  const bool per_row = c.reduction == LossReduction::kNone;
  const std::vector<float> dloss = per_row ? Uniform(c.rows, 93, -1.f, 1.f) : std::vector<float>{c.dloss};
  ir::Attrs attrs;
  const char* red[] = {"mean", "sum", "none"};
  attrs.Set("reduction", std::string(red[static_cast<int>(c.reduction)]));
  if (c.ignore) attrs.Set("ignore_index", c.ignore_index);
  attrs.Set("label_smoothing", static_cast<double>(c.smoothing));
  const ir::Tensor labels_t = ir::Tensor::FromVector<L>({c.rows}, labels);
  const ir::Tensor logits_t = F32({c.rows, c.classes}, logits);
  const ir::Tensor weights_t = c.weights ? F32({c.classes}, weights) : ir::Tensor();
  const auto fwd = CpuEval(ir::OpKind::kSoftmaxCrossEntropyLoss, {logits_t, labels_t, weights_t}, 3, attrs);
  const ir::Tensor dloss_t = per_row ? F32({c.rows}, dloss) : ir::Tensor::Scalar<float>(c.dloss);
  const auto grad =
      CpuEval(ir::OpKind::kSoftmaxCrossEntropyLossGrad, {dloss_t, logits_t, labels_t, weights_t, fwd[2]}, 1, attrs);

  CeOnDevice<T, L> d(c, logits, labels, weights, dloss, in_place);
  d.args.loss = d.loss_d.get();
  d.args.stats = d.stats_d.get();
  const std::string what = Name(c) + (in_place ? " in place" : "");
  ASSERT_TRUE(CrossEntropy(d.args, nullptr).ok()) << what;
  EXPECT_TRUE(AllClose(Download(d.loss_d), Floats(fwd[0]), 1e-5)) << "loss " << what;
  EXPECT_TRUE(AllClose(Download(d.stats_d), Floats(fwd[2]), 1e-5)) << "stats " << what;
  // The backward from the CPU's Stats, so that both sides compute the same dlogits.
  UploadRaw(Floats(fwd[2]), d.stats_d);
  d.args.loss = nullptr;
  d.args.dloss = d.dloss_d.get();
  d.args.dlogits = d.dlogits();
  ASSERT_TRUE(CrossEntropyGrad(d.args, nullptr).ok()) << what;
  ExpectMatch<T>(d.DownloadDlogits(), Floats(grad[0]), "dlogits " + what);
}

TYPED_TEST(SoftmaxCudaTest, CrossEntropyStatsAndGradientFromStatsMatchCpu) {
  using T = TypeParam;
  for (const CeCase& c : CeCases()) {
    if (c.int32_labels) {
      CheckCrossEntropyStatsPathAgainstCpu<T, int32_t>(c, /*in_place=*/false);
    } else {
      CheckCrossEntropyStatsPathAgainstCpu<T, int64_t>(c, /*in_place=*/false);
    }
  }
  CheckCrossEntropyStatsPathAgainstCpu<T, int64_t>(CeCases()[2], /*in_place=*/true);
}

TYPED_TEST(SoftmaxCudaTest, CrossEntropyWithoutGradientAndOutOfRangeLabels) {
  using T = TypeParam;
  const CeCase c{8, 100, LossReduction::kNone, false, 0.f, true, -100, false, 0.f};
  const std::vector<float> logits = Representable<T>(Uniform(c.rows * c.classes, 80, -6.f, 6.f));
  std::vector<int64_t> labels = Labels<int64_t>(c, 81);
  labels[3] = 100;  // out of range and not ignore_index
  labels[5] = -1;
  const int64_t n = c.rows * c.classes;
  DeviceBuffer<T> logits_d(n), dlogits_d(n);
  DeviceBuffer<int64_t> labels_d(c.rows);
  DeviceBuffer<float> loss_d(c.rows), ws((CrossEntropyWorkspaceBytes(c.rows) + 3) / 4);
  Upload(logits, logits_d);
  UploadRaw(labels, labels_d);
  CrossEntropyArgs<T, int64_t> a;
  a.rows = c.rows;
  a.classes = c.classes;
  a.logits = logits_d.get();
  a.labels = labels_d.get();
  a.has_ignore_index = true;
  a.ignore_index = -100;
  a.reduction = LossReduction::kNone;
  a.loss = loss_d.get();
  a.workspace = ws.get();
  ASSERT_TRUE(CrossEntropy(a, nullptr).ok());  // loss only
  const std::vector<float> loss_only = Download(loss_d);
  a.dlogits = dlogits_d.get();
  ASSERT_TRUE(CrossEntropy(a, nullptr).ok());
  const std::vector<float> loss = Download(loss_d), dlogits = Download(dlogits_d);
  EXPECT_EQ(std::memcmp(loss_only.data(), loss.data(), loss.size() * 4), 0) << "the loss does not depend on dlogits";
  for (int64_t r = 0; r < c.rows; ++r) {
    const bool bad = r == 3 || r == 5;
    const bool ignored = labels[r] == -100;
    if (bad) {
      EXPECT_TRUE(std::isnan(loss[r])) << "row " << r;
    }
    if (ignored) {
      EXPECT_EQ(loss[r], 0.f) << "row " << r;
    }
    if (!bad && !ignored) {
      // -log softmax at the label, in double.
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < c.classes; ++k) mx = std::max<double>(mx, logits[r * c.classes + k]);
      for (int64_t k = 0; k < c.classes; ++k) sum += std::exp(logits[r * c.classes + k] - mx);
      EXPECT_NEAR(loss[r], mx + std::log(sum) - logits[r * c.classes + labels[r]], 1e-5) << "row " << r;
    }
    if (bad || ignored) {
      for (int64_t k = 0; k < c.classes; ++k) ASSERT_EQ(dlogits[r * c.classes + k], 0.f) << "row " << r;
    }
  }
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(SoftmaxArgumentsTest, BadArgumentsAreRejectedWithAMessage) {
  auto expect_error = [](const absl::Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st;
  };
  float buf[8] = {};
  int64_t labels[2] = {};
  expect_error(SoftmaxForward<float>(nullptr, buf, 2, 4, false, nullptr), "got null");
  expect_error(SoftmaxForward<float>(buf, buf, -1, 4, false, nullptr), "rows is -1");
  expect_error(SoftmaxBackward<float>(buf, buf, nullptr, 2, 4, true, nullptr), "got null");
  expect_error(SoftmaxBackward<float>(buf, buf, buf, 2, -4, true, nullptr), "n is -4");

  CrossEntropyArgs<float, int64_t> ok;
  ok.rows = 2;
  ok.classes = 4;
  ok.logits = buf;
  ok.labels = labels;
  ok.loss = buf;
  ok.workspace = buf;
  auto bad = ok;
  bad.classes = 0;
  expect_error(CrossEntropy(bad, nullptr), "classes is 0");
  bad = ok;
  bad.labels = nullptr;
  expect_error(CrossEntropy(bad, nullptr), "got null");
  bad = ok;
  bad.loss = nullptr;
  expect_error(CrossEntropy(bad, nullptr), "loss");
  bad = ok;
  bad.workspace = nullptr;
  expect_error(CrossEntropy(bad, nullptr), "workspace");
  bad = ok;
  bad.label_smoothing = 1.5f;
  expect_error(CrossEntropy(bad, nullptr), "label_smoothing");

  // The gradient from Stats needs them, dlogits and dloss.
  CrossEntropyArgs<__nv_bfloat16, int64_t> grad;
  __nv_bfloat16 half[8] = {};
  grad.rows = 2;
  grad.classes = 4;
  grad.logits = half;
  grad.labels = labels;
  grad.dlogits = half;
  grad.dloss = buf;
  grad.stats = buf;
  grad.workspace = buf;
  auto bad_grad = grad;
  bad_grad.stats = nullptr;
  expect_error(CrossEntropyGrad(bad_grad, nullptr), "stats");
  bad_grad = grad;
  bad_grad.dlogits = nullptr;
  expect_error(CrossEntropyGrad(bad_grad, nullptr), "got null");
  bad_grad = grad;
  bad_grad.dloss = nullptr;
  expect_error(CrossEntropyGrad(bad_grad, nullptr), "dloss");
}

}  // namespace
}  // namespace onnxpipe::cuda
