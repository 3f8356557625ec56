// The module scopes torch's dynamo exporter records per node (NodeProto.metadata_props, field 9,
// "pkg.torch.onnx.name_scopes"; libonnx 1.12 keeps it as an unknown field): parsed into the
// TorchScript exporter's scope form (frontend/onnx/proto_metadata.h), and the loader naming each
// node's IR nodes under that scope, so that the node, its helpers and what passes later derive from
// its name carry the layer.
#include <string>

#include "frontend/ir/graph.h"
#include "frontend/onnx/loader.h"
#include "frontend/onnx/proto_metadata.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {
namespace {

TEST(NameScopesTest, ModulePathsBecomeAScopeOfChildNames) {
  EXPECT_EQ(ScopeOfNameScopes("['', 'm', 'm.model', 'm.model.layers.0', 'm.model.layers.0.self_attn', 'linear_3']"),
            "/m/model/layers.0/self_attn");
  EXPECT_EQ(ScopeOfNameScopes(R"(["", "encoder", "encoder.block.1", "add_7"])"), "/encoder/block.1");
  // A path that does not extend its parent is kept whole.
  EXPECT_EQ(ScopeOfNameScopes("['', 'a.b', 'c.d', 'mul']"), "/a.b/c.d");
  EXPECT_EQ(ScopeOfNameScopes("['', 'index_1']"), "");  // made at the root module
  EXPECT_EQ(ScopeOfNameScopes("['add']"), "");
  EXPECT_EQ(ScopeOfNameScopes(""), "");
  EXPECT_EQ(ScopeOfNameScopes("['', 'm', 'unterminated"), "");  // one complete string: the op's own
}

// y = Relu(x @ w) with name_scopes on both nodes (as unknown field 9 of NodeProto), or without.
std::string ModelWithScopes(bool scopes) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(18);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("main_graph");
  auto value_info = [](onnx::ValueInfoProto* v, const std::string& name) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : {2, 2}) tt->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value_info(g->add_input(), "x");
  value_info(g->add_output(), "y");
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("val_0");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {2, 2}) w->add_dims(d);
  for (float f : {1.0f, 2.0f, 3.0f, 4.0f}) w->add_float_data(f);
  auto node = [&](const char* op, const std::string& name, const std::string& in1, const std::string& in2,
                  const std::string& out, const std::string& name_scopes) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->add_input(in1);
    if (!in2.empty()) n->add_input(in2);
    n->add_output(out);
    if (!scopes) return;
    onnx::StringStringEntryProto e;
    e.set_key("pkg.torch.onnx.name_scopes");
    e.set_value(name_scopes);
    n->mutable_unknown_fields()->AddLengthDelimited(kNodeMetadataField, e.SerializeAsString());
  };
  node("MatMul", "node_linear", "x", "val_0", "h", "['', 'm', 'm.layers.1', 'm.layers.1.fc', 'linear']");
  node("Relu", "node_relu", "h", "", "y", "['', 'm', 'relu']");
  return m.SerializeAsString();
}

TEST(NameScopesTest, LoaderNamesNodesUnderTheirModuleScope) {
  absl::StatusOr<LoadedModel> with = LoadOnnxModelFromBytes(ModelWithScopes(true), "scoped", "");
  ASSERT_TRUE(with.ok()) << with.status();
  const ir::Graph& g = *with->graph;
  ASSERT_EQ(g.LiveNodes().size(), 2u);
  const ir::Node& matmul = g.node(g.LiveNodes()[0]);
  const ir::Node& relu = g.node(g.LiveNodes()[1]);
  EXPECT_EQ(matmul.name, "/m/layers.1/fc/node_linear");
  EXPECT_EQ(matmul.scope, "/m/layers.1/fc");
  EXPECT_EQ(relu.name, "/m/node_relu");
  EXPECT_EQ(relu.scope, "/m");

  absl::StatusOr<LoadedModel> without = LoadOnnxModelFromBytes(ModelWithScopes(false), "plain", "");
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->graph->node(without->graph->LiveNodes()[0]).name, "node_linear");
  EXPECT_EQ(without->graph->node(without->graph->LiveNodes()[0]).scope, "");
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
