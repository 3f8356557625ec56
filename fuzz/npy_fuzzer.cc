// libFuzzer target for the .npy reader (executor/data/npy.h).
// Properties: any input either parses or fails with InvalidArgument (no crash, no other code, no
// allocation driven by an unchecked shape), and whatever parses survives a write/read round trip
// bit for bit. Seeds: fuzz/corpus/npy (small files written by numpy, valid and malformed).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "executor/data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using onnxpipe::data::ParseNpy;
  using onnxpipe::data::SerializeNpy;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto t = ParseNpy(bytes, "fuzz-input.npy");
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  auto again = SerializeNpy(*t);
  if (!again.ok()) std::abort();
  auto t2 = ParseNpy(*again, "round-trip.npy");
  if (!t2.ok() || !t2->BitwiseEquals(*t)) std::abort();
  return 0;
}
