// What a Metal kernel body needs of Metal, for running it on CPU threads
// (tests/core/metal_emulation.py): one POSIX thread per Metal thread, threadgroups one at a
// time, SIMD-group shuffles through an exchange buffer and a barrier per SIMD group.
// Threadgroup arrays become function statics, which the group's threads share.
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct uint3 {
  unsigned x, y, z;
};
typedef _Float16 half;
typedef _Float16 float16_t;
typedef unsigned short ushort;
typedef unsigned int uint;

// Metal's bfloat: float in, rounded to nearest even; float out, exactly.
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
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

struct Threadgroup {
  pthread_barrier_t barrier;
  pthread_barrier_t simd_barriers[32];
  uint64_t exchange[1024];
  int threads;
  explicit Threadgroup(int threads) : threads(threads) {
    pthread_barrier_init(&barrier, nullptr, threads);
    for (int s = 0; s * 32 < threads; ++s) {
      const int lanes = threads - s * 32 < 32 ? threads - s * 32 : 32;
      pthread_barrier_init(&simd_barriers[s], nullptr, lanes);
    }
  }
  ~Threadgroup() {
    pthread_barrier_destroy(&barrier);
    for (int s = 0; s * 32 < threads; ++s) pthread_barrier_destroy(&simd_barriers[s]);
  }
};
inline thread_local Threadgroup* current_group = nullptr;
inline thread_local int current_thread = 0;

namespace metal {
template <class T> T min(T a, T b) { return a < b ? a : b; }
template <class T> T max(T a, T b) { return a > b ? a : b; }
inline float exp2(float x) { return ::exp2f(x); }
inline float rsqrt(float x) { return 1.0f / ::sqrtf(x); }
inline float sqrt(float x) { return ::sqrtf(x); }
inline float abs(float x) { return ::fabsf(x); }
inline float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
inline int popcount(int x) { return __builtin_popcount(static_cast<unsigned>(x)); }
enum class mem_flags { mem_none, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) { pthread_barrier_wait(&current_group->barrier); }

template <class T> T simd_shuffle_xor(T x, ushort mask) {
  const int simd = current_thread / 32;
  uint64_t bits = 0;
  memcpy(&bits, &x, sizeof(T));
  current_group->exchange[current_thread] = bits;
  pthread_barrier_wait(&current_group->simd_barriers[simd]);
  bits = current_group->exchange[simd * 32 + ((current_thread % 32) ^ mask)];
  pthread_barrier_wait(&current_group->simd_barriers[simd]);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}

template <class T> T simd_sum(T x) {
  for (int offset = 16; offset > 0; offset /= 2) x += simd_shuffle_xor(x, offset);
  return x;
}

template <class T, class U> T as_type(U u) {
  T t;
  memcpy(&t, &u, sizeof t);
  return t;
}
}  // namespace metal
using namespace metal;

template <class F> struct Worker {
  F* body;
  Threadgroup* group;
  int thread;
  uint3 local, at, groups, global;
};

template <class F> void* run_worker(void* argument) {
  auto* worker = static_cast<Worker<F>*>(argument);
  current_group = worker->group;
  current_thread = worker->thread;
  (*worker->body)(worker->local, worker->at, worker->groups, worker->global);
  return nullptr;
}

// Runs `body(thread_position_in_threadgroup, threadgroup_position_in_grid,
// threadgroups_per_grid, thread_position_in_grid)` for every thread of a dispatch of
// `grid` threads in threadgroups of `group` (one-dimensional, at most 1024 threads), as
// Metal's dispatchThreads does: the last threadgroup may be partial.
template <class F> void dispatch(uint3 grid, uint3 group, F body) {
  const uint3 groups{(grid.x + group.x - 1) / group.x, grid.y, grid.z};
  static pthread_t handles[1024];
  static Worker<F> workers[1024];
  for (unsigned gz = 0; gz < groups.z; ++gz) {
    for (unsigned gy = 0; gy < groups.y; ++gy) {
      for (unsigned gx = 0; gx < groups.x; ++gx) {
        const int threads = grid.x - gx * group.x < group.x ? grid.x - gx * group.x : group.x;
        Threadgroup threadgroup_state(threads);
        for (int t = 0; t < threads; ++t) {
          workers[t] = Worker<F>{&body, &threadgroup_state, t, uint3{unsigned(t), 0, 0},
                                 uint3{gx, gy, gz}, groups, uint3{gx * group.x + t, gy, gz}};
          pthread_create(&handles[t], nullptr, run_worker<F>, &workers[t]);
        }
        for (int t = 0; t < threads; ++t) pthread_join(handles[t], nullptr);
      }
    }
  }
}

// Metal's address spaces: one memory here.
#define device
#define constant
#define thread
