// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing and of onnxpipe
// checkpoints. Software, table-driven (slicing-by-8); no third-party dependency.
//   Crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace onnxpipe::io {

// Continues a CRC: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b). Start from 0 for a fresh checksum.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::string_view s) { return Crc32c(s.data(), s.size()); }

// TFRecord's masking, which keeps a CRC of data that itself contains CRCs from looking degenerate.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace onnxpipe::io
