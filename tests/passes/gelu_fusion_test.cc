#include "frontend/passes/gelu_fusion.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::Histogram;
using Hist = std::map<std::string, int>;

void ExpectFused(const GeluOptions& o, const std::string& approximate) {
  GraphBuilder b;
  auto [x, y] = BuildGelu(b, o);
  ir::Graph& g = b.graph();
  GeluFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r) << testing::HistogramString(g);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  Hist expected = {{"Gelu", 1}, {"Relu", 1}};
  if (o.x_from_add) expected["Add"] = 1;
  EXPECT_EQ(Histogram(g), expected);
  const ir::Node* gelu = testing::NodesOf(g, OpKind::kGelu)[0];
  EXPECT_EQ(gelu->inputs, (std::vector<ValueId>{x}));
  EXPECT_EQ(gelu->outputs[0], y);
  EXPECT_EQ(gelu->attrs.Get<std::string>("approximate"), approximate);
}

TEST(GeluFusionTest, ErfExporterForm) { ExpectFused({}, "none"); }
TEST(GeluFusionTest, ErfHalfFirst) { ExpectFused({.form = GeluForm::kErfHalfFirst}, "none"); }
TEST(GeluFusionTest, ErfMulByRsqrt2) { ExpectFused({.form = GeluForm::kErfMulRsqrt2}, "none"); }
TEST(GeluFusionTest, ErfOnBiasAddOutput) { ExpectFused({.x_from_add = true}, "none"); }
TEST(GeluFusionTest, TanhExporterForm) { ExpectFused({.form = GeluForm::kTanhExporter}, "tanh"); }
TEST(GeluFusionTest, TanhWithPow) { ExpectFused({.form = GeluForm::kTanhPow}, "tanh"); }
TEST(GeluFusionTest, TanhOnBiasAddOutput) { ExpectFused({.form = GeluForm::kTanhPow, .x_from_add = true}, "tanh"); }

void ExpectNotFused(const GeluOptions& o) {
  GraphBuilder b;
  BuildGelu(b, o);
  testing::ExpectUnchangedBy<GeluFusion>(b.graph());
}

TEST(GeluFusionTest, WrongHalfIsNotFused) { ExpectNotFused({.half = 0.6f}); }
TEST(GeluFusionTest, ErfWithAnotherConsumerIsNotFused) { ExpectNotFused({.extra_use = true}); }
TEST(GeluFusionTest, TanhWithAnotherConsumerIsNotFused) {
  ExpectNotFused({.form = GeluForm::kTanhExporter, .extra_use = true});
}

}  // namespace
}  // namespace onnxpipe::passes
