// bf16 <-> fp32 for the CPU kernels (cpu_ops.cpp, gguf_matmul.cpp): bf16 is the top half of an
// fp32; rounding to bf16 is to nearest even, as torch does, and a NaN stays a NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace bf16conv {

inline float to_f32(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace bf16conv
