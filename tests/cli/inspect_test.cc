// `onnxpipe inspect` on the shipped models: parameters counted against onnx's own view of the file,
// fused op histograms against the models' configs (sidecars), and the error/exit-code contract.
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"

namespace onnxpipe::testing {
namespace {

using nlohmann::json;

// Independent reference, with onnx's shape inference for value types: distinct float initializers
// that a float graph output depends on through float values only (mask buffers compared with
// Equal are not parameters), less the module's buffers the sidecar lists (from PyTorch: the
// trainable-parameter rule freezes them, e.g. tiny_classifier's sinusoidal pos.table).
json PythonParameterCount(const std::string& model, const json& buffers) {
  const std::string script =
      "import json,sys,onnx,numpy as np\n"
      "m=onnx.shape_inference.infer_shapes(onnx.load(sys.argv[1]))\n"
      "fl={1,10,11,16}\n"
      "ty={v.name:v.type.tensor_type.elem_type for v in list(m.graph.value_info)+list(m.graph.input)+list(m.graph.output)}\n"
      "ty.update({t.name:t.data_type for t in m.graph.initializer})\n"
      "prod={o:n for n in m.graph.node for o in n.output}\n"
      "seen=set(); st=[o.name for o in m.graph.output if ty.get(o.name) in fl]\n"
      "while st:\n"
      "  v=st.pop()\n"
      "  if v in seen: continue\n"
      "  seen.add(v)\n"
      "  if v in prod: st+=[i for i in prod[v].input if i and ty.get(i) in fl]\n"
      "bufs=set(json.loads(sys.argv[2]))\n"
      "ps=[t for t in m.graph.initializer if t.name in seen and t.name not in bufs]\n"
      "uses={t.name:sum(1 for n in m.graph.node for i in n.input if i==t.name) for t in ps}\n"
      "print(json.dumps({'count':int(sum(np.prod(t.dims,dtype=np.int64) for t in ps)),"
      "'tensors':len(ps),'shared':sum(1 for v in uses.values() if v>1)}))\n";
  const std::filesystem::path dir = MakeTempDir("pycount");
  const std::string py = (dir / "count.py").string();
  std::ofstream(py) << script;
  CommandResult r = RunCommand(Python() + " " + py + " " + model + " '" + buffers.dump() + "'");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

json Sidecar(const std::string& name) { return json::parse(ReadAll(SourcePath("models/" + name + ".json"))); }

json InspectJson(const std::string& args) {
  CommandResult r = RunCommand(Onnxpipe() + " inspect " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

class ShippedModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShippedModelTest, ReportsIoAndParametersLikeOnnx) {
  const std::string model = SourcePath("models/" + GetParam() + ".onnx");
  const json side = Sidecar(GetParam());
  const json j = InspectJson(model);
  EXPECT_EQ(j["opset"], side["opset"]);
  ASSERT_EQ(j["inputs"].size(), side["inputs"].size());
  for (size_t i = 0; i < side["inputs"].size(); ++i) {
    EXPECT_EQ(j["inputs"][i]["name"], side["inputs"][i]["name"]);
    EXPECT_EQ(j["inputs"][i]["dims"], side["inputs"][i]["shape"]);  // symbolic "B", "S"
  }
  EXPECT_EQ(j["outputs"][0]["name"], side["outputs"][0]["name"]);
  const json ref = PythonParameterCount(model, side.value("buffers", json::array()));
  EXPECT_EQ(j["parameters"]["count"], ref["count"]);
  EXPECT_EQ(j["parameters"]["bytes"], ref["count"].get<int64_t>() * 4);
  EXPECT_EQ(j["parameters"]["tensors"], ref["tensors"]);
  EXPECT_EQ(j["parameters"]["shared_tensors"], ref["shared"]);
  int64_t per_scope = 0;
  for (const json& s : j["parameters"]["per_scope"]) per_scope += s["count"].get<int64_t>();
  EXPECT_EQ(per_scope, ref["count"]);
  EXPECT_TRUE(j["unsupported_ops"].empty());
  EXPECT_EQ(j["op_histogram"].size() > 5, true);
  // The trainable-parameter rule froze exactly the module's buffers (tiny_gpt's causal masks,
  // tiny_classifier's sinusoidal table), without a --freeze regex.
  std::set<std::string> frozen, buffers;
  for (const json& f : j["trainable"]["frozen"]) frozen.insert(f["name"].get<std::string>());
  for (const json& b : side.value("buffers", json::array())) buffers.insert(b.get<std::string>());
  EXPECT_EQ(frozen, buffers);
}

TEST_P(ShippedModelTest, BoundDimsFoldShapeArithmeticAndFuseEveryLayer) {
  const json side = Sidecar(GetParam());
  const int64_t layers = side["layers"];
  const json j = InspectJson(SourcePath("models/" + GetParam() + ".onnx") + " --batch 3 --seq " +
                             std::to_string(side["seq"].get<int64_t>()));
  const json& h = j["fused_op_histogram"];
  auto count = [&](const char* op) { return h.contains(op) ? h[op].get<int64_t>() : 0; };
  EXPECT_EQ(count("Attention"), layers);
  EXPECT_EQ(count("Gelu"), layers);
  // Every LayerNormalization of the (opset 17) file, i.e. two per layer plus any final norm.
  EXPECT_EQ(count("LayerNorm"), side["op_histogram"]["LayerNormalization"].get<int64_t>());
  EXPECT_GE(count("LayerNorm"), 2 * layers);
  EXPECT_GE(count("Linear"), 4 * layers);  // q/k/v (or packed qkv), out, two FFN
  for (const char* gone : {"Shape", "ConstantOfShape", "Concat", "Softmax", "Erf"})
    EXPECT_EQ(count(gone), 0) << gone << " should have been folded or fused";
  // Only a mask input's (B, S) -> (B, 1, 1, S) unsqueezes may remain.
  EXPECT_LE(count("Unsqueeze"), 2 * (static_cast<int64_t>(side["inputs"].size()) - 1));
  EXPECT_LT(j["nodes_after_fusion"].get<int64_t>(), j["nodes"].get<int64_t>() / 3);
  EXPECT_EQ(j["inputs"][0]["dims"], json({3, side["seq"]}));
}

INSTANTIATE_TEST_SUITE_P(Models, ShippedModelTest,
                         ::testing::Values("tiny_classifier", "tiny_gpt", "tiny_bert"));

TEST(InspectCliTest, CheckFailsOnUnsupportedOpsAndNamesThem) {
  const std::filesystem::path dir = MakeTempDir("unsupported");
  const std::string model = (dir / "atan.onnx").string();
  const std::string script = (dir / "make.py").string();
  std::ofstream(script)
      << "import onnx,sys\nfrom onnx import helper as h, TensorProto as T\n"
         "g=h.make_graph([h.make_node('Atan',['x'],['y'],name='/block/the_atan'),"
         "h.make_node('Relu',['y'],['z'],name='/block/relu')],'g',"
         "[h.make_tensor_value_info('x',T.FLOAT,[2])],[h.make_tensor_value_info('z',T.FLOAT,[2])])\n"
         "onnx.save(h.make_model(g,opset_imports=[h.make_opsetid('',17)]),sys.argv[1])\n";
  ASSERT_EQ(RunCommand(Python() + " " + script + " " + model).exit_code, 0);
  CommandResult plain = RunCommand(Onnxpipe() + " inspect " + model);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("/block/the_atan"), std::string::npos) << plain.out;
  CommandResult checked = RunCommand(Onnxpipe() + " inspect " + model + " --check --json");
  EXPECT_EQ(checked.exit_code, 1);
  const json j = json::parse(checked.out);
  ASSERT_EQ(j["unsupported_ops"].size(), 1u);
  EXPECT_EQ(j["unsupported_ops"][0]["op"], "Atan");
  EXPECT_EQ(j["unsupported_ops"][0]["node"], "/block/the_atan");
  std::filesystem::remove_all(dir);
}

TEST(InspectCliTest, BadFlagsAndFilesGetClearErrors) {
  CommandResult unknown = RunCommand(Onnxpipe() + " inspect x.onnx --bogus 3");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;
  CommandResult badint = RunCommand(Onnxpipe() + " inspect x.onnx --batch many");
  EXPECT_EQ(badint.exit_code, 2);
  EXPECT_NE(badint.err.find("--batch"), std::string::npos) << badint.err;
  CommandResult missing = RunCommand(Onnxpipe() + " inspect /nonexistent/model.onnx");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model.onnx"), std::string::npos) << missing.err;
  CommandResult help = RunCommand(Onnxpipe() + " inspect --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--batch"), std::string::npos);
  CommandResult top = RunCommand(Onnxpipe() + " frobnicate");
  EXPECT_EQ(top.exit_code, 2);
  EXPECT_NE(top.err.find("frobnicate"), std::string::npos);
}

}  // namespace
}  // namespace onnxpipe::testing
