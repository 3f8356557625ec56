// Byte alignment: every planned buffer, arena part and workspace part starts at a multiple of
// kBufferAlignment (one cache line; enough for vector loads and cuBLAS/cuDNN operands).
#pragma once

#include <cstdint>

namespace onnxpipe::ir {

inline constexpr int64_t kBufferAlignment = 64;

// x rounded up to a multiple of a (a > 0).
constexpr int64_t AlignUp(int64_t x, int64_t a = kBufferAlignment) { return (x + a - 1) / a * a; }

}  // namespace onnxpipe::ir
