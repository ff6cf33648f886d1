// What a Metal kernel body needs of Metal, for running it on CPU threads
// (tests/core/metal_emulation.py): one std::thread per Metal thread, threadgroups one at a
// time, SIMD-group shuffles through an exchange buffer and a barrier per SIMD group.
// Threadgroup arrays become function statics, which the group's threads share.
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct uint3 {
  unsigned x, y, z;
};
typedef _Float16 half;
typedef _Float16 float16_t;
typedef unsigned short ushort;
typedef unsigned int uint;

struct Threadgroup {
  std::barrier<> barrier;
  std::vector<std::unique_ptr<std::barrier<>>> simd_barriers;
  uint64_t exchange[1024];
  explicit Threadgroup(int threads) : barrier(threads) {
    for (int first = 0; first < threads; first += 32) {
      simd_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - first)));
    }
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
inline int popcount(int x) { return __builtin_popcount(static_cast<unsigned>(x)); }
enum class mem_flags { mem_none, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) { current_group->barrier.arrive_and_wait(); }

template <class T> T simd_shuffle_xor(T x, ushort mask) {
  const int simd = current_thread / 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof(T));
  current_group->exchange[current_thread] = bits;
  current_group->simd_barriers[simd]->arrive_and_wait();
  bits = current_group->exchange[simd * 32 + ((current_thread % 32) ^ mask)];
  current_group->simd_barriers[simd]->arrive_and_wait();
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

template <class T> T simd_sum(T x) {
  for (int offset = 16; offset > 0; offset /= 2) x += simd_shuffle_xor(x, offset);
  return x;
}

template <class T, class U> T as_type(U u) {
  T t;
  std::memcpy(&t, &u, sizeof t);
  return t;
}
}  // namespace metal
using namespace metal;

// Runs `body(thread_position_in_threadgroup, threadgroup_position_in_grid,
// threadgroups_per_grid, thread_position_in_grid)` for every thread of a dispatch of
// `grid` threads in threadgroups of `group` (one-dimensional), as Metal's dispatchThreads
// does: the last threadgroup may be partial.
template <class F> void dispatch(uint3 grid, uint3 group, F body) {
  const uint3 groups{(grid.x + group.x - 1) / group.x, grid.y, grid.z};
  for (unsigned gz = 0; gz < groups.z; ++gz) {
    for (unsigned gy = 0; gy < groups.y; ++gy) {
      for (unsigned gx = 0; gx < groups.x; ++gx) {
        const int threads = std::min(group.x, grid.x - gx * group.x);
        Threadgroup threadgroup_state(threads);
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
          workers.emplace_back([&, t] {
            current_group = &threadgroup_state;
            current_thread = t;
            body(uint3{unsigned(t), 0, 0}, uint3{gx, gy, gz}, groups,
                 uint3{gx * group.x + t, gy, gz});
          });
        }
        for (auto& worker : workers) worker.join();
      }
    }
  }
}

// Metal's address spaces: one memory here.
#define device
#define constant
#define thread
