// Multi-tensor optimizer kernels. A launch takes a batch of tensors and a table mapping each block
// to (tensor, chunk), passed by value as a kernel parameter, so one launch updates many small
// tensors. Arithmetic uses the _rn intrinsics so that nvcc cannot contract a*b + c into an FMA:
// each operation rounds exactly as the CPU kernel's.
#include <algorithm>

#include "executor/cuda/device_util.cuh"
#include "executor/cuda/optimizer.h"

namespace onnxpipe::cuda {
namespace {

// Elements per block of an update: 16 per thread, so that one large tensor spreads over the whole
// GPU (a 4M element weight is 1024 blocks, one launch). The gradient norm's blocks take 64 per thread
// (16 loads of 16 bytes each, enough in flight to keep the memory busy), so that the finishing blocks
// add few partial sums.
constexpr int64_t kChunk = 1 << 12;
constexpr int64_t kNormChunk = 1 << 14;
constexpr int kMaxTensors = 64;
constexpr int kMaxBlocks = 1024;

struct Batch {
  OptimizerTensor t[kMaxTensors];
  int16_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
};

// Fills batches covering every `chunk` of every tensor and calls launch(batch, num_blocks) for each.
template <typename L>
cudaError_t ForEachBatch(const OptimizerTensor* tensors, int num_tensors, int64_t chunk, L&& launch) {
  Batch b;
  int nt = 0, nb = 0;
  auto flush = [&]() {
    const cudaError_t e = launch(b, nb);
    nt = nb = 0;
    return e;
  };
  for (int i = 0; i < num_tensors; ++i) {
    if (tensors[i].n == 0) continue;
    if (nt == kMaxTensors) {
      if (cudaError_t e = flush(); e != cudaSuccess) return e;
    }
    b.t[nt++] = tensors[i];
    const int64_t chunks = (tensors[i].n + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      b.block_tensor[nb] = static_cast<int16_t>(nt - 1);
      b.block_chunk[nb] = static_cast<int32_t>(c);
      if (++nb < kMaxBlocks) continue;
      if (cudaError_t e = flush(); e != cudaSuccess) return e;
      if (c + 1 < chunks) b.t[nt++] = tensors[i];  // the rest of this tensor starts the next batch
    }
  }
  return nb > 0 ? flush() : cudaSuccess;
}

// Where the values before the step are read from.
__device__ __forceinline__ const float* Before(const float* in, const float* out) { return in != nullptr ? in : out; }

__device__ __forceinline__ bool Aligned(const void* p, uintptr_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// W consecutive floats from p[i] (one 16-byte access for W = 4), and back.
template <int W>
__device__ __forceinline__ void LoadW(const float* p, int64_t i, float (&v)[W]) {
  if constexpr (W == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    v[0] = p[i];
  }
}
template <int W>
__device__ __forceinline__ void StoreW(float* p, int64_t i, const float (&v)[W]) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    p[i] = v[0];
  }
}
// The bf16 compute copy: W values rounded to nearest even (one 8-byte store for W = 4).
template <int W>
__device__ __forceinline__ void StoreBf16W(void* p, int64_t i, const float (&v)[W]) {
  auto* out = static_cast<__nv_bfloat16*>(p) + i;
  if constexpr (W == 4) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out) = packed;
  } else {
    out[0] = __float2bfloat16_rn(v[0]);
  }
}

// This block's [begin, end) of its tensor, for chunks of `chunk` elements.
struct BlockRange {
  const OptimizerTensor& t;
  int64_t begin, end;
};
__device__ __forceinline__ BlockRange RangeOf(const Batch& b, int64_t chunk) {
  const OptimizerTensor& t = b.t[b.block_tensor[blockIdx.x]];
  const int64_t begin = int64_t{b.block_chunk[blockIdx.x]} * chunk;
  return {t, begin, begin + chunk < t.n ? begin + chunk : t.n};
}

// Runs step.template Run<4>(i) over the range's whole groups of 4 (where every pointer the step touches is
// 16-byte aligned: chunks start at multiples of 4) and step.template Run<1>(i) over the rest.
template <typename Step>
__device__ __forceinline__ void ForRange(const BlockRange& r, bool aligned, const Step& step) {
  int64_t scalar_begin = r.begin;
  if (aligned) {
    scalar_begin = r.begin + (r.end - r.begin) / 4 * 4;
#pragma unroll 4
    for (int64_t i = r.begin + 4 * int64_t{threadIdx.x}; i < scalar_begin; i += 4 * int64_t{blockDim.x}) {
      step.template Run<4>(i);
    }
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < r.end; i += blockDim.x) step.template Run<1>(i);
}

// Adds the squares of W gradient elements into the W accumulators (independent chains, in double).
template <int W>
__device__ __forceinline__ void AddSquares(const float (&g)[W], double* acc) {
#pragma unroll
  for (int j = 0; j < W; ++j) acc[j] += static_cast<double>(g[j]) * g[j];
}

// The block's sum of every thread's v by a fixed tree (the same bits for the same values); valid in every thread.
__device__ __forceinline__ double BlockSum(double v) {
  __shared__ double red[kThreads];
  red[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  return red[0];
}

// The block's sum of squares of its chunk (each thread's 4 accumulators) into *out.
__device__ __forceinline__ void WritePartial(const double (&acc)[4], double* out) {
  const double total = BlockSum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  if (threadIdx.x == 0) *out = total;
}

__device__ __forceinline__ float ScaledGrad(float g, const float* scale) {
  return scale != nullptr ? __fmul_rn(g, *scale) : g;
}

// The update steps: with `acc` set (4 doubles), they also add the squares of the gradient they read.
struct SgdStep {
  const OptimizerTensor& t;
  const float *param_in, *state0_in, *scale;
  SgdScalars s;
  double* acc;

  template <int W>
  __device__ __forceinline__ void Run(int64_t i) const {
    float p[W], g[W], buf[W];
    LoadW<W>(param_in, i, p);
    LoadW<W>(t.grad, i, g);
    if (acc != nullptr) AddSquares<W>(g, acc);
    if (s.use_momentum) LoadW<W>(state0_in, i, buf);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      float d = ScaledGrad(g[j], scale);
      if (s.use_weight_decay) d = __fadd_rn(d, __fmul_rn(s.weight_decay, p[j]));
      if (s.use_momentum) {
        buf[j] = __fadd_rn(__fmul_rn(buf[j], s.momentum), d);
        d = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, buf[j])) : buf[j];
      }
      p[j] = __fadd_rn(p[j], __fmul_rn(s.neg_lr, d));
    }
    if (s.use_momentum) StoreW<W>(t.state0, i, buf);
    StoreW<W>(t.param, i, p);
    if (t.param_bf16 != nullptr) StoreBf16W<W>(t.param_bf16, i, p);
  }
};

struct AdamWStep {
  const OptimizerTensor& t;
  const float *param_in, *state0_in, *state1_in, *scale;
  AdamWScalars s;
  double* acc;

  template <int W>
  __device__ __forceinline__ void Run(int64_t i) const {
    float p[W], g[W], m[W], v[W];
    LoadW<W>(param_in, i, p);
    LoadW<W>(t.grad, i, g);
    if (acc != nullptr) AddSquares<W>(g, acc);
    LoadW<W>(state0_in, i, m);
    LoadW<W>(state1_in, i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float gj = ScaledGrad(g[j], scale);
      const float pd = __fmul_rn(p[j], s.decay);
      m[j] = __fadd_rn(__fmul_rn(m[j], s.beta1), __fmul_rn(s.one_minus_beta1, gj));
      v[j] = __fadd_rn(__fmul_rn(v[j], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gj), gj));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[j]), s.bias_correction2_sqrt), s.eps);
      p[j] = __fadd_rn(pd, __fmul_rn(s.neg_step_size, __fdiv_rn(m[j], denom)));
    }
    StoreW<W>(t.state0, i, m);
    StoreW<W>(t.state1, i, v);
    StoreW<W>(t.param, i, p);
    if (t.param_bf16 != nullptr) StoreBf16W<W>(t.param_bf16, i, p);
  }
};

// The chunk of an update block: the sum of squares' when the step forms it, so that its partials are LaunchSumSquares'.
template <bool kSquares>
constexpr int64_t kUpdateChunk = kSquares ? kNormChunk : kChunk;

// Runs `step` (made by make(tensor, acc)) over the block's chunk; with kSquares, writes the chunk's sum of squares
// into the tensor's partials.
template <bool kSquares, typename MakeStep>
__device__ __forceinline__ void RunUpdate(const Batch& b, bool aligned, MakeStep&& make) {
  const BlockRange r = RangeOf(b, kUpdateChunk<kSquares>);
  double acc[4] = {0, 0, 0, 0};
  ForRange(r, aligned, make(r.t, kSquares ? acc : nullptr));
  if constexpr (kSquares) WritePartial(acc, r.t.sum_partials + b.block_chunk[blockIdx.x]);
}

// Flags from `s`; values from `dev` when set (read at run time: CUDA graph replays).
template <bool kSquares>
__global__ void SgdKernel(Batch b, SgdScalars s, const SgdScalars* dev, const float* scale) {
  if (dev != nullptr) {
    s.neg_lr = dev->neg_lr;
    s.weight_decay = dev->weight_decay;
    s.momentum = dev->momentum;
  }
  const OptimizerTensor& t = b.t[b.block_tensor[blockIdx.x]];
  const float *param_in = Before(t.param_in, t.param), *state0_in = Before(t.state0_in, t.state0);
  const bool aligned = Aligned(param_in, 16) && Aligned(t.param, 16) && Aligned(t.grad, 16) &&
                       (!s.use_momentum || (Aligned(state0_in, 16) && Aligned(t.state0, 16))) &&
                       Aligned(t.param_bf16, 8);
  RunUpdate<kSquares>(b, aligned, [&](const OptimizerTensor& rt, double* acc) {
    return SgdStep{rt, param_in, state0_in, scale, s, acc};
  });
}

template <bool kSquares>
__global__ void AdamWKernel(Batch b, AdamWScalars s, const AdamWScalars* dev, const float* scale) {
  if (dev != nullptr) s = *dev;
  const OptimizerTensor& t = b.t[b.block_tensor[blockIdx.x]];
  const float *param_in = Before(t.param_in, t.param), *state0_in = Before(t.state0_in, t.state0),
              *state1_in = Before(t.state1_in, t.state1);
  const bool aligned = Aligned(param_in, 16) && Aligned(t.param, 16) && Aligned(t.grad, 16) &&
                       Aligned(state0_in, 16) && Aligned(t.state0, 16) && Aligned(state1_in, 16) &&
                       Aligned(t.state1, 16) && Aligned(t.param_bf16, 8);
  RunUpdate<kSquares>(b, aligned, [&](const OptimizerTensor& rt, double* acc) {
    return AdamWStep{rt, param_in, state0_in, state1_in, scale, s, acc};
  });
}

struct SquaresStep {
  const float* grad;
  double* acc;  // [4]

  template <int W>
  __device__ __forceinline__ void Run(int64_t i) const {
    float g[W];
    LoadW<W>(grad, i, g);
    AddSquares<W>(g, acc);
  }
};

// Block sum of squares of one chunk into partials[first_partial + blockIdx.x].
__global__ void SumSquaresChunksKernel(Batch b, double* partials, int64_t first_partial) {
  const BlockRange r = RangeOf(b, kNormChunk);
  double acc[4] = {0, 0, 0, 0};
  ForRange(r, Aligned(r.t.grad, 16), SquaresStep{r.t.grad, acc});
  WritePartial(acc, partials + first_partial + blockIdx.x);
}

// The finishing launches' table: block j adds partials[j][0, count[j]) and writes out[j].
struct Segments {
  const double* partials[kMaxTensors];
  int64_t count[kMaxTensors];
  void* out[kMaxTensors];
};

// Block j: the sum of its segment's partials (strided per thread, then a fixed tree), written to
// out[j] as double (f64_out) or rounded to float; with clip_scale (one segment), the clipping factor.
__global__ void FinishSegmentsKernel(Segments s, bool f64_out, float* clip_scale, float max_norm, float eps) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < s.count[blockIdx.x]; i += blockDim.x) sum += s.partials[blockIdx.x][i];
  const double total = BlockSum(sum);
  if (threadIdx.x != 0) return;
  if (f64_out) {
    *static_cast<double*>(s.out[blockIdx.x]) = total;
    return;
  }
  const float rounded = static_cast<float>(total);
  *static_cast<float*>(s.out[blockIdx.x]) = rounded;
  if (clip_scale != nullptr) {
    const float coef = __fdiv_rn(max_norm, __fadd_rn(__fsqrt_rn(rounded), eps));
    *clip_scale = coef < 1.f ? coef : (isnan(coef) ? coef : 1.f);
  }
}

// Adds up segments given by add(segments, j) (which fills entry j) for j < num_segments, kMaxTensors per launch.
template <typename Add>
cudaError_t FinishSegments(int num_segments, bool f64_out, float* clip_scale, float max_norm, float eps,
                           cudaStream_t stream, Add&& add) {
  Segments seg;
  for (int first = 0; first < num_segments; first += kMaxTensors) {
    const int n = std::min(kMaxTensors, num_segments - first);
    for (int j = 0; j < n; ++j) add(seg, j, first + j);
    FinishSegmentsKernel<<<n, kThreads, 0, stream>>>(seg, f64_out, clip_scale, max_norm, eps);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// An update launch over every tensor (kSquares: the tensors' sums of squares too, from their partials).
template <typename Launch>
cudaError_t LaunchUpdate(const OptimizerTensor* tensors, int num_tensors, cudaStream_t stream, Launch&& launch) {
  const bool squares = num_tensors > 0 && tensors[0].sum_squares != nullptr;
  const cudaError_t err = ForEachBatch(tensors, num_tensors, squares ? kNormChunk : kChunk,
                                       [&](const Batch& b, int blocks) { return launch(b, blocks, squares); });
  if (err != cudaSuccess || !squares) return err;
  return FinishSegments(num_tensors, /*f64_out=*/true, nullptr, 0.f, 0.f, stream,
                        [&](Segments& seg, int j, int i) {
                          seg.partials[j] = tensors[i].sum_partials;
                          seg.count[j] = NormChunks(tensors[i].n);
                          seg.out[j] = tensors[i].sum_squares;
                        });
}

// *out = ((carry or 0) + terms[0]) + terms[1] + ... in double, then written as double or float; a
// later launch continues from `carry_out` when the terms do not fit one launch.
struct Terms {
  const double* t[kMaxTensors];
};

__global__ void SumScalarsKernel(Terms terms, int n, const double* carry_in, double* carry_out, void* out,
                                 bool f64_out) {
  double total = carry_in != nullptr ? *carry_in : 0.0;
  for (int i = 0; i < n; ++i) total += *terms.t[i];
  if (carry_out != nullptr) *carry_out = total;
  if (out == nullptr) return;
  if (f64_out) {
    *static_cast<double*>(out) = total;
  } else {
    *static_cast<float*>(out) = static_cast<float>(total);
  }
}

__global__ void SgdScalarsKernel(const double* lr, SgdScalars s, SgdScalars* out) {
  s.neg_lr = static_cast<float>(-*lr);
  *out = s;
}

__global__ void AdamWScalarsKernel(const double* lr, const int64_t* step, double beta1, double beta2, double eps,
                                   double weight_decay, AdamWScalars* out) {
  *out = MakeAdamWScalars(*lr, *step, beta1, beta2, eps, weight_decay);
}

__global__ void ClipScaleKernel(const float* norm, float max_norm, float eps, float* out) {
  const float coef = __fdiv_rn(max_norm, __fadd_rn(*norm, eps));
  *out = coef < 1.f ? coef : (isnan(coef) ? coef : 1.f);
}

int64_t NumNormChunks(const int64_t* sizes, int num_tensors) {
  int64_t chunks = 0;
  for (int i = 0; i < num_tensors; ++i) chunks += NormChunks(sizes[i]);
  return chunks;
}

}  // namespace

int64_t NormChunks(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

cudaError_t LaunchSgdStep(const OptimizerTensor* tensors, int num_tensors, const SgdScalars& s,
                          const SgdScalars* device_scalars, const float* scale, cudaStream_t stream) {
  return LaunchUpdate(tensors, num_tensors, stream, [&](const Batch& b, int blocks, bool squares) {
    (squares ? SgdKernel<true> : SgdKernel<false>)<<<blocks, kThreads, 0, stream>>>(b, s, device_scalars, scale);
    return cudaGetLastError();
  });
}

cudaError_t LaunchAdamWStep(const OptimizerTensor* tensors, int num_tensors, const AdamWScalars& s,
                            const AdamWScalars* device_scalars, const float* scale, cudaStream_t stream) {
  return LaunchUpdate(tensors, num_tensors, stream, [&](const Batch& b, int blocks, bool squares) {
    (squares ? AdamWKernel<true> : AdamWKernel<false>)<<<blocks, kThreads, 0, stream>>>(b, s, device_scalars, scale);
    return cudaGetLastError();
  });
}

cudaError_t LaunchSgdScalars(const double* lr, const SgdScalars& flags, SgdScalars* out, cudaStream_t stream) {
  SgdScalarsKernel<<<1, 1, 0, stream>>>(lr, flags, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdamWScalars(const double* lr, const int64_t* step, double beta1, double beta2, double eps,
                               double weight_decay, AdamWScalars* out, cudaStream_t stream) {
  AdamWScalarsKernel<<<1, 1, 0, stream>>>(lr, step, beta1, beta2, eps, weight_decay, out);
  return cudaGetLastError();
}

cudaError_t LaunchClipScale(const float* norm, float max_norm, float eps, float* out, cudaStream_t stream) {
  ClipScaleKernel<<<1, 1, 0, stream>>>(norm, max_norm, eps, out);
  return cudaGetLastError();
}

size_t SumSquaresWorkspaceBytes(const std::vector<int64_t>& sizes) {
  return static_cast<size_t>(std::max<int64_t>(1, NumNormChunks(sizes.data(), static_cast<int>(sizes.size())))) *
         sizeof(double);
}

cudaError_t LaunchSumSquares(const float* const* grads, const int64_t* sizes, int num_tensors, const int* segment_ends,
                             void* const* outs, int num_segments, bool f64_out, float* clip_scale, float max_norm,
                             float eps, void* workspace, cudaStream_t stream) {
  std::vector<OptimizerTensor> tensors(num_tensors);
  for (int i = 0; i < num_tensors; ++i) {
    tensors[i].grad = grads[i];
    tensors[i].n = sizes[i];
  }
  auto* partials = static_cast<double*>(workspace);
  int64_t done = 0;
  const cudaError_t err = ForEachBatch(tensors.data(), num_tensors, kNormChunk, [&](const Batch& b, int blocks) {
    SumSquaresChunksKernel<<<blocks, kThreads, 0, stream>>>(b, partials, done);
    done += blocks;
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  // The chunks are issued tensor after tensor, so a segment's partials are one range.
  std::vector<int64_t> begin(num_segments + 1, 0);
  for (int j = 0, tensor = 0; j < num_segments; ++j) {
    begin[j + 1] = begin[j];
    for (; tensor < segment_ends[j]; ++tensor) begin[j + 1] += NormChunks(sizes[tensor]);
  }
  return FinishSegments(num_segments, f64_out, clip_scale, max_norm, eps, stream, [&](Segments& seg, int j, int i) {
    seg.partials[j] = partials + begin[i];
    seg.count[j] = begin[i + 1] - begin[i];
    seg.out[j] = outs[i];
  });
}

cudaError_t LaunchSumScalars(const double* const* terms, int num_terms, void* out, bool f64_out, double* carry,
                             cudaStream_t stream) {
  Terms t;
  for (int first = 0; first < num_terms || first == 0; first += kMaxTensors) {
    const int n = std::min(kMaxTensors, num_terms - first);
    for (int i = 0; i < n; ++i) t.t[i] = terms[first + i];
    const bool last = first + n >= num_terms;
    SumScalarsKernel<<<1, 1, 0, stream>>>(t, n, first > 0 ? carry : nullptr, last ? nullptr : carry,
                                          last ? out : nullptr, f64_out);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess || last) return e;
  }
  return cudaSuccess;
}

}  // namespace onnxpipe::cuda
