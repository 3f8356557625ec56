// libFuzzer target for the ONNX loader: arbitrary bytes must give OK or an error status, never a
// crash, hang or sanitizer report. No base directory is given, so external data is refused
// rather than read from wherever the bytes point.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "frontend/onnx/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool allow_unsupported : {false, true}) {
    onnxpipe::onnx_frontend::LoadOptions options;
    options.allow_unsupported = allow_unsupported;
    auto m = onnxpipe::onnx_frontend::LoadOnnxModelFromBytes(bytes, "fuzz.onnx", "", options);
    if (m.ok() && m->graph) {
      // Touch the result so that a graph with dangling ids would trip ASan.
      const auto& g = *m->graph;
      for (auto id : g.LiveNodes()) {
        for (auto v : g.node(id).inputs) {
          if (v != onnxpipe::ir::kNoValue) (void)g.value(v).name.size();
        }
      }
    }
  }
  return 0;
}
