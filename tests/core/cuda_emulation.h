// What a CUDA kernel body needs of CUDA, for running it on CPU threads
// (tests/core/cuda_emulation.py): one POSIX thread per CUDA thread, thread blocks one at a
// time, warp shuffles through an exchange buffer and a barrier per warp. `__shared__`
// arrays become function statics, which the block's threads share.
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <limits>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

namespace cuda {
namespace std {
using ::std::numeric_limits;
}
}  // namespace cuda

struct dim3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

typedef _Float16 __half;

// bfloat16 as CUDA's __nv_bfloat16 behaves in these kernels: float in, rounded to
// nearest even; float out, exactly.
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
};

template <class T> T min(T a, T b) { return a < b ? a : b; }
template <class T> T max(T a, T b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  memcpy(&i, &f, 4);
  return i;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <class T> T __ldg(const T* p) { return *p; }

struct Block {
  pthread_barrier_t barrier;
  pthread_barrier_t warp_barriers[32];
  uint64_t exchange[1024];
  int threads;
  explicit Block(int threads) : threads(threads) {
    pthread_barrier_init(&barrier, nullptr, threads);
    for (int w = 0; w * 32 < threads; ++w) {
      const int lanes = threads - w * 32 < 32 ? threads - w * 32 : 32;
      pthread_barrier_init(&warp_barriers[w], nullptr, lanes);
    }
  }
  ~Block() {
    pthread_barrier_destroy(&barrier);
    for (int w = 0; w * 32 < threads; ++w) pthread_barrier_destroy(&warp_barriers[w]);
  }
};
inline thread_local Block* current_block = nullptr;
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { pthread_barrier_wait(&current_block->barrier); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  pthread_barrier_wait(&current_block->warp_barriers[threadIdx.x / 32]);
}

// Every lane of the warp writes its value, then reads lane `source(lane)`'s.
template <class T, class F> T warp_exchange(T x, F source) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint64_t bits = 0;
  memcpy(&bits, &x, sizeof(T));
  current_block->exchange[threadIdx.x] = bits;
  pthread_barrier_wait(&current_block->warp_barriers[warp]);
  bits = current_block->exchange[warp * 32 + source(lane)];
  pthread_barrier_wait(&current_block->warp_barriers[warp]);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
template <class T> T __shfl_xor_sync(unsigned, T x, int mask, int width = 32) {
  return warp_exchange(x, [&](int lane) { return lane ^ mask; });
}
template <class T> T __shfl_sync(unsigned, T x, int source, int width = 32) {
  return warp_exchange(x, [&](int lane) { return (lane / width) * width + source % width; });
}
template <class T> T __shfl_down_sync(unsigned, T x, int delta, int width = 32) {
  return warp_exchange(x, [&](int lane) { return lane % width + delta < width ? lane + delta : lane; });
}

template <class F> struct Worker {
  F* body;
  Block* block;
  dim3 thread, block_index, block_dim, grid_dim;
};

template <class F> void* run_worker(void* argument) {
  auto* worker = static_cast<Worker<F>*>(argument);
  current_block = worker->block;
  threadIdx = worker->thread;
  blockIdx = worker->block_index;
  blockDim = worker->block_dim;
  gridDim = worker->grid_dim;
  (*worker->body)();
  return nullptr;
}

// Runs `body()` for every thread of a launch of `grid` blocks of `block` threads
// (one-dimensional blocks of at most 1024 threads), one block at a time.
template <class F> void launch(dim3 grid, dim3 block, F body) {
  static pthread_t handles[1024];
  static Worker<F> workers[1024];
  for (unsigned gz = 0; gz < grid.z; ++gz) {
    for (unsigned gy = 0; gy < grid.y; ++gy) {
      for (unsigned gx = 0; gx < grid.x; ++gx) {
        Block state(block.x);
        for (unsigned t = 0; t < block.x; ++t) {
          workers[t] = Worker<F>{&body, &state, dim3{t, 0, 0}, dim3{gx, gy, gz}, block, grid};
          pthread_create(&handles[t], nullptr, run_worker<F>, &workers[t]);
        }
        for (unsigned t = 0; t < block.x; ++t) pthread_join(handles[t], nullptr);
      }
    }
  }
}
