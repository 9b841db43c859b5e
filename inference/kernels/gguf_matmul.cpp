// x @ W^T on the CPU for weights kept as GGUF blocks (Q4_0 / Q4_1: 32 weights sharing a scale d
// and a value of code 0 m, w = d * q + m; Q8_0: w = d * q), with AVX-512 VNNI integer dot
// products, as llama.cpp runs them: each 32-value group of an activation row is quantized to int8
// with its own scale (dx = max|x| / 127), then, per output n,
//
//     y[n] = sum_g  (d[n,g] * dx[g]) * sum_j q[n,g,j] * qx[g,j]   +   sum_g m[n,g] * dx[g] * sum_j qx[g,j]
//
// Weights are packed once at load (inference/models/gguf_cpu_linear.py) in blocks of 16 output
// rows, so that one vector holds 16 outputs and no result needs a horizontal sum:
//     Q4  codes [N / 16, G * 256] bytes: per group, 4 vectors; vector i, byte 4 * n + t holds row n's
//         code 4i + t in its low nibble and code 16 + 4i + t in its high nibble (GGUF's byte 4i + t)
//     Q8  codes [N / 16, G * 512] int8: per group, 8 vectors; vector i, byte 4 * n + t: code 4i + t
//     d, m [N / 16, G, 16] fp16: the file's scales and minimums, 16 rows of a group side by side
// VPDPBUSD multiplies the 4 bytes of a lane (one row's 4 codes) by 4 activation codes broadcast to
// every lane. A group's dot product is exact in int32; its float sum runs over the groups in order.
//
// Every output is computed by the same instruction sequence whatever the number of rows and
// whichever thread runs it: results do not depend on the batch.
#include <torch/extension.h>

#include "spin_pool.h"

#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_MATMUL_VNNI 1
#endif

namespace {

constexpr int64_t GROUP = 32;   // values per group
constexpr int64_t BLOCK = 16;   // output rows per packed block (one fp32 vector)
constexpr int64_t TILE = 6;     // activation rows sharing one unpacked group of a block

#ifdef GGUF_MATMUL_VNNI
// Activation rows quantized per group: codes [rows, k], and per (row, group) the scale dx, the
// sum of the codes and that sum times dx (the m term).
struct QuantizedActs {
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  std::vector<int32_t> qs;
};

inline __m512 bf16x16_to_f32(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// to nearest even, a NaN stays a NaN (bf16conv::from_f32, 16 at a time)
inline __m256i f32x16_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

void quantize_acts(const uint16_t* x, int64_t rows, int64_t k, QuantizedActs& a) {
  const int64_t groups = k / GROUP;
  a.q.resize(rows * k);
  a.dx.resize(rows * groups);
  a.sx.resize(rows * groups);
  a.qs.resize(rows * groups);
  spin_pool::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t* xg = x + r * k + g * GROUP;
        const __m512 v0 = bf16x16_to_f32(xg), v1 = bf16x16_to_f32(xg + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        const __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));   // to nearest even
        const __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
        int8_t* q = a.q.data() + r * k + g * GROUP;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(c0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(c1));
        const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1));
        const int64_t at = r * groups + g;
        a.dx[at] = amax / 127.f;
        a.qs[at] = s;
        // the m term over the same quantized x as the d term (as llama.cpp's q8_1 sums)
        a.sx[at] = static_cast<float>(s) * (amax / 127.f);
      }
    }
  });
}

// One group's dot products of 8 vectors of 16 rows' codes (unsigned) with a row's 32 activation
// codes: exact int32, one per output row.
inline __m512i group_dot(const __m512i* u, const int8_t* xg) {
  const int32_t* xq = reinterpret_cast<const int32_t*>(xg);
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_set1_epi32(xq[0]));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[4], _mm512_set1_epi32(xq[4]));
  s0 = _mm512_dpbusd_epi32(s0, u[1], _mm512_set1_epi32(xq[1]));
  s1 = _mm512_dpbusd_epi32(s1, u[5], _mm512_set1_epi32(xq[5]));
  s0 = _mm512_dpbusd_epi32(s0, u[2], _mm512_set1_epi32(xq[2]));
  s1 = _mm512_dpbusd_epi32(s1, u[6], _mm512_set1_epi32(xq[6]));
  s0 = _mm512_dpbusd_epi32(s0, u[3], _mm512_set1_epi32(xq[3]));
  s1 = _mm512_dpbusd_epi32(s1, u[7], _mm512_set1_epi32(xq[7]));
  return _mm512_add_epi32(s0, s1);
}

// T activation rows (from r0) against one block of 16 output rows; the block's group is unpacked
// once for the T rows. A row's arithmetic is the same sequence for any T.
template <int64_t T>
inline void q4_block(const uint8_t* w, const uint16_t* d, const uint16_t* m, const QuantizedActs& a,
                     int64_t r0, int64_t k, int64_t groups, uint16_t* out, int64_t out_stride) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[T], macc[T];
  for (int64_t t = 0; t < T; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i u[8];
    for (int i = 0; i < 4; ++i) {
      const __m512i p = _mm512_loadu_si512(w + g * 256 + i * 64);
      u[i] = _mm512_and_si512(p, nibble);
      u[4 + i] = _mm512_and_si512(_mm512_srli_epi16(p, 4), nibble);
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + g * BLOCK)));
    const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + g * BLOCK)));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = (r0 + t) * groups + g;
      const __m512i s = group_dot(u, a.q.data() + (r0 + t) * k + g * GROUP);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, _mm512_set1_ps(a.dx[at])), acc[t]);
      macc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.sx[at]), macc[t]);
    }
  }
  for (int64_t t = 0; t < T; ++t)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * out_stride), f32x16_to_bf16(_mm512_add_ps(acc[t], macc[t])));
}

// Q8_0: VPDPBUSD wants unsigned weights, so the codes go in as q + 128 and each row gives back
// 128 * (the sum of its group's activation codes).
template <int64_t T>
inline void q8_block(const int8_t* w, const uint16_t* d, const QuantizedActs& a, int64_t r0, int64_t k,
                     int64_t groups, uint16_t* out, int64_t out_stride) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[T];
  for (int64_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i u[8];
    for (int i = 0; i < 8; ++i) u[i] = _mm512_xor_si512(_mm512_loadu_si512(w + g * 512 + i * 64), flip);
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + g * BLOCK)));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = (r0 + t) * groups + g;
      const __m512i s = _mm512_sub_epi32(group_dot(u, a.q.data() + (r0 + t) * k + g * GROUP),
                                         _mm512_set1_epi32(128 * a.qs[at]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, _mm512_set1_ps(a.dx[at])), acc[t]);
    }
  }
  for (int64_t t = 0; t < T; ++t)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * out_stride), f32x16_to_bf16(acc[t]));
}

// Rows in tiles of TILE, the rest one tile of fewer rows; each block a task of the pool.
template <typename Block>
void run_blocks(int64_t rows, int64_t blocks, int64_t n, uint16_t* out, const Block& block) {
  spin_pool::parallel_for(0, blocks, 2, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      uint16_t* ob = out + b * BLOCK;
      int64_t r0 = 0;
      for (; r0 + TILE <= rows; r0 += TILE) block(std::integral_constant<int64_t, TILE>{}, b, r0, ob + r0 * n);
      switch (rows - r0) {
        case 5: block(std::integral_constant<int64_t, 5>{}, b, r0, ob + r0 * n); break;
        case 4: block(std::integral_constant<int64_t, 4>{}, b, r0, ob + r0 * n); break;
        case 3: block(std::integral_constant<int64_t, 3>{}, b, r0, ob + r0 * n); break;
        case 2: block(std::integral_constant<int64_t, 2>{}, b, r0, ob + r0 * n); break;
        case 1: block(std::integral_constant<int64_t, 1>{}, b, r0, ob + r0 * n); break;
        default: break;
      }
    }
  });
}
static_assert(TILE == 6, "run_blocks handles a rest of up to 5 rows");
#endif

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x: a 2-D bf16 CPU tensor");
}

}  // namespace

bool gguf_matmul_available() {
#ifdef GGUF_MATMUL_VNNI
  return true;
#else
  return false;
#endif
}

// x [M, K] bf16; codes uint8 [N / 16, G * 256]; d, m fp16 [N / 16, G, 16] (G = K / 32) -> [M, N] bf16
torch::Tensor q4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d, torch::Tensor m) {
  check_x(x);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2, "codes: uint8 [N / 16, G * 256]");
  TORCH_CHECK(d.scalar_type() == at::kHalf && m.scalar_type() == at::kHalf && d.is_contiguous() && m.is_contiguous()
                  && d.dim() == 3 && d.size(2) == BLOCK && m.sizes() == d.sizes(),
              "d, m: contiguous fp16 [N / 16, G, 16]");
  const int64_t rows = x.size(0), k = x.size(1), blocks = codes.size(0), groups = d.size(1), n = blocks * BLOCK;
  TORCH_CHECK(k == groups * GROUP && codes.size(1) == groups * 256 && d.size(0) == blocks,
              "q4_matmul: x [M, ", k, "] does not fit the packed weight [", n, ", ", groups * GROUP, "]");
  auto xc = x.contiguous();
  auto out = torch::empty({rows, n}, x.options());
#ifdef GGUF_MATMUL_VNNI
  QuantizedActs a;
  quantize_acts(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), rows, k, a);
  const uint8_t* wp = codes.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  const uint16_t* mp = reinterpret_cast<const uint16_t*>(m.data_ptr<at::Half>());
  run_blocks(rows, blocks, n, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()),
             [&](auto tile, int64_t b, int64_t r0, uint16_t* o) {
               q4_block<decltype(tile)::value>(wp + b * groups * 256, dp + b * groups * BLOCK, mp + b * groups * BLOCK,
                                               a, r0, k, groups, o, n);
             });
#else
  TORCH_CHECK(false, "q4_matmul: this build has no AVX-512 VNNI");
#endif
  return out;
}

// Q8_0: codes int8 [N / 16, G * 512], d fp16 [N / 16, G, 16] -> [M, N] bf16
torch::Tensor q8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d) {
  check_x(x);
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.dim() == 2, "codes: int8 [N / 16, G * 512]");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 3 && d.size(2) == BLOCK,
              "d: contiguous fp16 [N / 16, G, 16]");
  const int64_t rows = x.size(0), k = x.size(1), blocks = codes.size(0), groups = d.size(1), n = blocks * BLOCK;
  TORCH_CHECK(k == groups * GROUP && codes.size(1) == groups * 512 && d.size(0) == blocks,
              "q8_matmul: x [M, ", k, "] does not fit the weight [", n, ", ", groups * GROUP, "]");
  auto xc = x.contiguous();
  auto out = torch::empty({rows, n}, x.options());
#ifdef GGUF_MATMUL_VNNI
  QuantizedActs a;
  quantize_acts(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), rows, k, a);
  const int8_t* wp = codes.data_ptr<int8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  run_blocks(rows, blocks, n, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()),
             [&](auto tile, int64_t b, int64_t r0, uint16_t* o) {
               q8_block<decltype(tile)::value>(wp + b * groups * 512, dp + b * groups * BLOCK, a, r0, k, groups, o, n);
             });
#else
  TORCH_CHECK(false, "q8_matmul: this build has no AVX-512 VNNI");
#endif
  return out;
}
