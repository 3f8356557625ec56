#include "frontend/passes/gelu_fusion.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::Histogram;
using Hist = std::map<std::string, int>;

const ir::Shape kShape = {Dim::Symbol("B"), Dim(8)};

enum class Form {
  kErfExporter,       // 0.5 * (x * (1 + erf(x / 1.4142135)))     torch 1.13 nn.GELU()
  kErfHalfFirst,      // (x * 0.5) * (1 + erf(x / 1.4142))
  kErfMulRsqrt2,      // x * (0.5 * (erf(x * 0.70710678) + 1))
  kTanhExporter,      // F.gelu(approximate='tanh'): x*x*x products, constants on the left
  kTanhPow,           // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
};

struct Options {
  Form form = Form::kErfExporter;
  bool x_from_add = false;   // x is a bias Add's output (an Add leaf besides 1 + erf)
  float half = 0.5f;
  bool extra_use = false;    // the Erf/Tanh output has another consumer
};

// Builds y = gelu(x) in the requested form; returns {x, y}.
std::pair<ValueId, ValueId> BuildGelu(GraphBuilder& b, const Options& o) {
  ValueId in = b.Input("in", kShape);
  ValueId x = o.x_from_add ? b.Op(OpKind::kAdd, {b.Param("bias", {8}), in}, kShape) : in;
  auto mul = [&](ValueId a, ValueId c) { return b.Op(OpKind::kMul, {a, c}, kShape); };
  auto add = [&](ValueId a, ValueId c) { return b.Op(OpKind::kAdd, {a, c}, kShape); };
  ValueId f, y;
  switch (o.form) {
    case Form::kErfExporter:
    case Form::kErfHalfFirst:
    case Form::kErfMulRsqrt2: {
      ValueId arg = o.form == Form::kErfMulRsqrt2 ? mul(x, b.Scalar(0.70710678f))
                    : b.Op(OpKind::kDiv, {x, b.Scalar(o.form == Form::kErfExporter ? 1.4142135f : 1.4142f)}, kShape);
      f = b.Op(OpKind::kErf, {arg}, kShape);
      if (o.form == Form::kErfExporter) {
        y = mul(mul(x, add(f, b.Scalar(1.0f))), b.Scalar(o.half));
      } else if (o.form == Form::kErfHalfFirst) {
        y = mul(mul(x, b.Scalar(o.half)), add(b.Scalar(1.0f), f));
      } else {
        y = mul(x, mul(b.Scalar(o.half), add(f, b.Scalar(1.0f))));
      }
      break;
    }
    case Form::kTanhExporter:
    case Form::kTanhPow: {
      ValueId cube = o.form == Form::kTanhExporter
                         ? mul(x, mul(x, x))
                         : b.Op(OpKind::kPow, {x, b.Scalar(3.0f)}, kShape);
      ValueId inner = o.form == Form::kTanhExporter ? mul(b.Scalar(0.044715f), cube) : mul(cube, b.Scalar(0.044715f));
      ValueId arg = o.form == Form::kTanhExporter ? mul(b.Scalar(0.7978845834732056f), add(x, inner))
                                                  : mul(add(x, inner), b.Scalar(0.7978846f));
      f = b.Op(OpKind::kTanh, {arg}, kShape);
      y = o.form == Form::kTanhExporter ? mul(b.Scalar(o.half), mul(x, add(b.Scalar(1.0f), f)))
                                        : mul(mul(x, b.Scalar(o.half)), add(f, b.Scalar(1.0f)));
      break;
    }
  }
  if (o.extra_use) b.Output(f);
  b.Output(b.Op(OpKind::kRelu, {y}, kShape));
  return {x, y};
}

void ExpectFused(const Options& o, const std::string& approximate) {
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
TEST(GeluFusionTest, ErfHalfFirst) { ExpectFused({.form = Form::kErfHalfFirst}, "none"); }
TEST(GeluFusionTest, ErfMulByRsqrt2) { ExpectFused({.form = Form::kErfMulRsqrt2}, "none"); }
TEST(GeluFusionTest, ErfOnBiasAddOutput) { ExpectFused({.x_from_add = true}, "none"); }
TEST(GeluFusionTest, TanhExporterForm) { ExpectFused({.form = Form::kTanhExporter}, "tanh"); }
TEST(GeluFusionTest, TanhWithPow) { ExpectFused({.form = Form::kTanhPow}, "tanh"); }
TEST(GeluFusionTest, TanhOnBiasAddOutput) { ExpectFused({.form = Form::kTanhPow, .x_from_add = true}, "tanh"); }

void ExpectNotFused(const Options& o) {
  GraphBuilder b;
  BuildGelu(b, o);
  ir::Graph& g = b.graph();
  const Hist before = Histogram(g);
  GeluFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  EXPECT_EQ(Histogram(g), before);
}

TEST(GeluFusionTest, WrongHalfIsNotFused) { ExpectNotFused({.half = 0.6f}); }
TEST(GeluFusionTest, ErfWithAnotherConsumerIsNotFused) { ExpectNotFused({.extra_use = true}); }
TEST(GeluFusionTest, TanhWithAnotherConsumerIsNotFused) {
  ExpectNotFused({.form = Form::kTanhExporter, .extra_use = true});
}

}  // namespace
}  // namespace onnxpipe::passes
