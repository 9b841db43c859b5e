// Sums over 16 fp32 lanes in the order of the AVX-512 builds, for the builds without AVX-512: the
// kernels' results are then the same bits at every ISA level (tests/inference/test_deterministic_greedy.py).
#pragma once

namespace lanes {

// x[0] + ... + x[15] in _mm512_reduce_add_ps's order (GCC's and clang's): halves, quarters, then
// (0 + 2) + (1 + 3).
inline float sum16(const float* x) {
  float h[8];
  for (int i = 0; i < 8; ++i) h[i] = x[i] + x[i + 8];
  for (int i = 0; i < 4; ++i) h[i] += h[i + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

}  // namespace lanes
