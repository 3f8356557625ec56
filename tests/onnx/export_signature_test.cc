// torch.export's graph signature in an ONNX graph's metadata (frontend/onnx/export_signature.h):
// parsing the text, and the loader copying it onto the initializers (ir::Value::exported_as) from
// a file whose GraphProto carries metadata_props, which libonnx 1.12 only knows as an unknown field.
#include "frontend/onnx/export_signature.h"

#include <string>

#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {
namespace {

constexpr char kSignature[] =
    "\n# inputs\n"
    "p_fc_weight: PARAMETER target='fc.weight'\n"
    "b_final_bias: BUFFER target='final_bias' persistent=True\n"
    "c_lifted_tensor_0: CONSTANT_TENSOR target='lifted_tensor_0'\n"
    "x: USER_INPUT\n"
    "broken: PARAMETER target=\n"
    "\n# outputs\nadd: USER_OUTPUT\n";

TEST(ExportSignatureTest, ParsesParametersBuffersAndConstants) {
  const std::map<std::string, ir::ExportedAs> roles = ParseTorchExportSignature(kSignature);
  EXPECT_EQ(roles, (std::map<std::string, ir::ExportedAs>{{"fc.weight", ir::ExportedAs::kParameter},
                                                          {"final_bias", ir::ExportedAs::kBuffer},
                                                          {"lifted_tensor_0", ir::ExportedAs::kBuffer}}));
  EXPECT_TRUE(ParseTorchExportSignature("").empty());
  EXPECT_TRUE(ParseTorchExportSignature("no signature here").empty());
}

void AddInitializer(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) t->add_float_data(0.25f * static_cast<float>(i + 1));
}

// y = (x @ fc.weight + final_bias) @ val_3 + embedding_1, at opset 18 / IR 10 as the dynamo exporter
// writes; `signature` goes into the graph's metadata_props (field 16) when not empty.
std::string DynamoLikeModel(const std::string& signature) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.set_producer_name("pytorch");
  m.add_opset_import()->set_version(18);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("main_graph");
  auto value_info = [](onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value_info(g->add_input(), "x", {2, 4});
  value_info(g->add_output(), "y", {2, 4});
  AddInitializer(g, "fc.weight", {4, 3});
  AddInitializer(g, "final_bias", {1, 3});
  AddInitializer(g, "val_3", {3, 4});
  AddInitializer(g, "embedding_1", {1, 4});
  auto node = [&](const char* op, std::vector<std::string> ins, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(op);
    n->set_name("/" + out);
    for (const std::string& in : ins) n->add_input(in);
    n->add_output(out);
  };
  node("MatMul", {"x", "fc.weight"}, "h");
  node("Add", {"h", "final_bias"}, "hb");
  node("MatMul", {"hb", "val_3"}, "o");
  node("Add", {"o", "embedding_1"}, "y");
  if (!signature.empty()) {
    onnx::StringStringEntryProto e;
    e.set_key(std::string(kTorchExportSignatureKey));
    e.set_value(signature);
    g->mutable_unknown_fields()->AddLengthDelimited(16, e.SerializeAsString());
  }
  return m.SerializeAsString();
}

ir::ExportedAs RoleOf(const ir::Graph& g, const std::string& name) {
  const ir::ValueId v = g.FindValue(name);
  EXPECT_NE(v, ir::kNoValue) << name;
  return v == ir::kNoValue ? ir::ExportedAs::kUnrecorded : g.value(v).exported_as;
}

TEST(ExportSignatureTest, LoaderMarksInitializersFromTheGraphMetadata) {
  absl::StatusOr<LoadedModel> m = LoadOnnxModelFromBytes(DynamoLikeModel(kSignature), "dynamo-like", "");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->graph);
  EXPECT_EQ(RoleOf(*m->graph, "fc.weight"), ir::ExportedAs::kParameter);
  EXPECT_EQ(RoleOf(*m->graph, "final_bias"), ir::ExportedAs::kBuffer);
  EXPECT_EQ(RoleOf(*m->graph, "val_3"), ir::ExportedAs::kExporterMade);
  EXPECT_EQ(RoleOf(*m->graph, "embedding_1"), ir::ExportedAs::kExporterMade);
  EXPECT_EQ(RoleOf(*m->graph, "x"), ir::ExportedAs::kUnrecorded);  // not an initializer
}

TEST(ExportSignatureTest, NoSignatureOrOneThatNamesNoInitializerRecordsNothing) {
  for (const std::string& sig :
       {std::string(),
        std::string("p_other: PARAMETER target='renamed.weight'\nb_final_bias: BUFFER target='final_bias'\n")}) {
    absl::StatusOr<LoadedModel> m = LoadOnnxModelFromBytes(DynamoLikeModel(sig), "dynamo-like", "");
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->graph);
    for (const char* name : {"fc.weight", "final_bias", "val_3", "embedding_1"})
      EXPECT_EQ(RoleOf(*m->graph, name), ir::ExportedAs::kUnrecorded) << name << " with '" << sig << "'";
  }
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
