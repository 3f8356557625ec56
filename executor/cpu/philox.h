// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind curand's and PyTorch's dropout. Header-only and free of library
// dependencies so that a CUDA kernel can include it and draw bit-identical numbers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ONNXPIPE_HOST_DEVICE __host__ __device__
#else
#define ONNXPIPE_HOST_DEVICE
#endif

namespace onnxpipe::cpu {

struct Philox4x32 {
  uint32_t v[4];
};

// Ten rounds of Philox4x32 on `counter` under `key` (Random123's philox4x32_R(10, ...)).
ONNXPIPE_HOST_DEVICE inline Philox4x32 Philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
    key0 += kW0;
    key1 += kW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// SplitMix64 finaliser: mixes 64-bit keys (seed, node key) into a Philox key.
ONNXPIPE_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 64-bit FNV-1a of a byte string: the per-node key of a random op (stable across platforms).
ONNXPIPE_HOST_DEVICE inline uint64_t Fnv1a64(const char* s, uint64_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(s[i]);
    h *= 0x100000001B3ull;
  }
  return h;
}

// The dropout stream of one node: element i is kept iff its 16-bit draw is >= threshold,
// threshold = ceil(ratio * 2^16), so P(keep) = 1 - ratio up to 2^-16 (FlashAttention draws 8 bits
// per element; 16 keep the ratio's error below 1.6e-5 while one Philox block serves eight elements,
// which halves the draws that bound the fused dropout kernels). Draw i is half i % 2 (0: the low
// 16 bits) of word (i / 2) % 4 of
//   Philox4x32_10(counter = {lo(i / 8), hi(i / 8), lo(offset), hi(offset)},
//                 key = SplitMix64(seed ^ SplitMix64(node_key))).
struct DropoutStream {
  static constexpr int kPerBlock = 8;  // elements one Philox block decides
  uint32_t key0, key1;
  uint32_t off_lo, off_hi;
  uint32_t threshold;  // 0: keep all; 2^16: drop all

  ONNXPIPE_HOST_DEVICE static DropoutStream Make(uint64_t seed, uint64_t node_key, uint64_t offset,
                                                 double ratio) {
    const uint64_t k = SplitMix64(seed ^ SplitMix64(node_key));
    DropoutStream s;
    s.key0 = static_cast<uint32_t>(k);
    s.key1 = static_cast<uint32_t>(k >> 32);
    s.off_lo = static_cast<uint32_t>(offset);
    s.off_hi = static_cast<uint32_t>(offset >> 32);
    const double t = ratio * 65536.0;
    uint32_t ti = static_cast<uint32_t>(t);
    if (static_cast<double>(ti) < t) ++ti;  // ceil
    s.threshold = ratio <= 0 ? 0 : (ratio >= 1 ? 65536u : ti);
    return s;
  }
  // The draws of block b (elements 8b .. 8b+7).
  ONNXPIPE_HOST_DEVICE Philox4x32 Block(uint64_t b) const {
    return Philox4x32_10(Philox4x32{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), off_lo, off_hi}},
                         key0, key1);
  }
  // The keep decisions of a block's eight elements (bit k: element 8b + k).
  ONNXPIPE_HOST_DEVICE uint32_t Kept8(const Philox4x32& r) const {
    uint32_t bits = 0;
    for (int w = 0; w < 4; ++w) {
      bits |= static_cast<uint32_t>((r.v[w] & 0xFFFFu) >= threshold) << (2 * w);
      bits |= static_cast<uint32_t>((r.v[w] >> 16) >= threshold) << (2 * w + 1);
    }
    return bits;
  }
  ONNXPIPE_HOST_DEVICE bool Keep(uint64_t i) const { return (Kept8(Block(i >> 3)) >> (i & 7)) & 1u; }
};

}  // namespace onnxpipe::cpu
