// ConvertComputePrecision on hand-built graphs: the model's arithmetic becomes f64 (activations, constants, a
// table of constant angles, Cast targets), while index arithmetic (positions cast to float, a log and a scale,
// cast back to int, as T5's relative-position buckets) keeps f32; a chain that reads a value the model also reads
// is converted whole (no node mixes f32 and f64 operands).
#include "frontend/ir/precision.h"

#include "gtest/gtest.h"

namespace onnxpipe::ir {
namespace {

TEST(ConvertComputePrecision, IndexArithmeticKeepsItsFloats) {
  Graph g;
  const ValueId x = g.AddValue("x", DType::kF32, {Dim(4)});
  const ValueId positions = g.AddValue("positions", DType::kI64, {Dim(4)});
  g.inputs() = {x, positions};
  auto value = [&](const char* name, DType t) { return g.AddValue(name, t, {Dim(4)}); };
  // Index arithmetic: bucket = int(log(float(positions) + 1) * 3).
  const ValueId pi = value("pi", DType::kF32), lifted = value("lifted", DType::kF32), logs = value("logs", DType::kF32),
                scaled = value("scaled", DType::kF32), bucket = value("bucket", DType::kI64);
  const ValueId one = g.AddConstant("one", Tensor::FromVector<float>({}, {1.0f}));
  const ValueId three = g.AddConstant("three", Tensor::FromVector<float>({}, {3.0f}));
  Attrs to_f32, to_i64;
  to_f32.Set("to", std::string(DTypeName(DType::kF32)));
  to_i64.Set("to", std::string(DTypeName(DType::kI64)));
  g.AddNode(OpKind::kCast, "pi", {positions}, {pi}, to_f32);
  g.AddNode(OpKind::kAdd, "lifted", {pi, one}, {lifted});
  g.AddNode(OpKind::kLog, "logs", {lifted}, {logs});
  g.AddNode(OpKind::kMul, "scaled", {logs, three}, {scaled});
  g.AddNode(OpKind::kCast, "bucket", {scaled}, {bucket}, to_i64);
  // Model arithmetic: y = x * cos(float(positions) * 2) + float(bucket).
  const ValueId pf = value("pf", DType::kF32), angle = value("angle", DType::kF32),
                table = value("table", DType::kF32), scaled_x = value("scaled_x", DType::kF32),
                bf = value("bf", DType::kF32), y = value("y", DType::kF32);
  const ValueId two = g.AddConstant("two", Tensor::FromVector<float>({}, {2.0f}));
  g.AddNode(OpKind::kCast, "pf", {positions}, {pf}, to_f32);
  g.AddNode(OpKind::kMul, "angle", {pf, two}, {angle});
  g.AddNode(OpKind::kCos, "table", {angle}, {table});
  g.AddNode(OpKind::kMul, "scaled_x", {x, table}, {scaled_x});
  g.AddNode(OpKind::kCast, "bf", {bucket}, {bf}, to_f32);
  g.AddNode(OpKind::kAdd, "y", {scaled_x, bf}, {y});
  g.outputs() = {y};

  const std::vector<ValueId> model = {pf, two, angle, table, scaled_x, bf, y, x};
  const std::vector<bool> index = IndexArithmetic(g, DType::kF32);
  for (const ValueId v : {pi, lifted, logs, scaled, one, three}) EXPECT_TRUE(index[v]) << g.value(v).name;
  for (const ValueId v : model) EXPECT_FALSE(index[v]) << g.value(v).name;

  Graph shared = g;  // the model reads the chain's log too: the chain is model arithmetic then
  const ValueId logs2 = shared.AddValue("logs2", DType::kF32, {Dim(4)});
  shared.AddNode(OpKind::kNeg, "read_log", {logs}, {logs2});
  shared.outputs().push_back(logs2);
  const std::vector<bool> none = IndexArithmetic(shared, DType::kF32);
  for (ValueId v = 0; v < shared.num_values(); ++v) EXPECT_FALSE(none[v]) << shared.value(v).name;

  ASSERT_TRUE(ConvertComputePrecision(g, DType::kF32, DType::kF64).ok());
  for (const ValueId v : {pi, lifted, logs, scaled, one, three}) {
    EXPECT_EQ(g.value(v).dtype, DType::kF32) << g.value(v).name;
  }
  for (const ValueId v : model) EXPECT_EQ(g.value(v).dtype, DType::kF64) << g.value(v).name;
  EXPECT_EQ(g.value(two).constant->dtype(), DType::kF64);
  EXPECT_EQ(g.value(three).constant->dtype(), DType::kF32);
  EXPECT_EQ(g.node(g.value(pi).producer).attrs.Get<std::string>("to", ""), DTypeName(DType::kF32));
  EXPECT_EQ(g.node(g.value(pf).producer).attrs.Get<std::string>("to", ""), DTypeName(DType::kF64));
  EXPECT_EQ(g.node(g.value(bucket).producer).attrs.Get<std::string>("to", ""), DTypeName(DType::kI64));
}

}  // namespace
}  // namespace onnxpipe::ir
