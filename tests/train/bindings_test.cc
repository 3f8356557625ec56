// tools::NonBatchBindings: what `onnxpipe train` binds from the data besides --batch.
#include "frontend/ir/graph.h"
#include "gtest/gtest.h"
#include "tools/model.h"

namespace onnxpipe::tools {
namespace {

// Inputs (B, S) and (B, T, 4): B is the batch symbol (leading), S the sequence, T another symbol.
TEST(NonBatchBindings, KeepsEverySymbolButTheBatch) {
  ir::Graph g;
  g.inputs().push_back(
      g.AddValue("tokens", ir::DType::kI64, {ir::Dim::Symbol("B"), ir::Dim::Symbol("S")}));
  g.inputs().push_back(g.AddValue("extra", ir::DType::kF32,
                                  {ir::Dim::Symbol("B"), ir::Dim::Symbol("T"), ir::Dim(4)}));
  const std::map<std::string, int64_t> got = NonBatchBindings(g, {{"B", 8}, {"S", 16}, {"T", 3}});
  EXPECT_EQ(got, (std::map<std::string, int64_t>{{"S", 16}, {"T", 3}}));
  EXPECT_TRUE(NonBatchBindings(g, {{"B", 8}}).empty());
}

}  // namespace
}  // namespace onnxpipe::tools
