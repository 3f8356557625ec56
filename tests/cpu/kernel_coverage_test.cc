// Kernel coverage generated from the op list (frontend/ir/op.h's ONNXPIPE_OP_LIST): every op the IR
// can hold, forward, gradient or optimizer, has a CPU kernel, so any graph the importers, passes and
// autodiff build runs on the reference backend.
#include "executor/cpu/kernel.h"
#include "frontend/ir/op.h"
#include "gtest/gtest.h"

namespace onnxpipe::cpu {
namespace {

TEST(KernelCoverage, EveryOpOfTheOpListHasACpuKernel) {
  std::vector<std::string> missing;
#define V(e, name, min_in, max_in, min_out, max_out, props) \
  if (FindCpuKernel(ir::OpKind::k##e) == nullptr) missing.push_back(name);
  ONNXPIPE_OP_LIST(V)
#undef V
  EXPECT_TRUE(missing.empty()) << "ops without a CPU kernel: " << testing::PrintToString(missing);
}

}  // namespace
}  // namespace onnxpipe::cpu
