// x @ W^T on the CPU for weights kept as GGUF's 4-bit blocks (Q4_0 / Q4_1, 32 weights sharing a
// scale d and a value of code 0 m: w = d * q + m), with AVX-512 VNNI integer dot products, the
// way llama.cpp runs them: each 32-value group of an activation row is quantized to int8 with its
// own scale (dx = max|x| / 127), then
//
//     y[n] = sum_g  d[n,g] * dx[g] * sum_j q[n,g,j] * qx[g,j]   +   m[n,g] * sum_j x[g,j]
//
// Layout (packed once at load by inference/models/gguf_cpu_linear.py), per weight row:
//     codes  [G * 16] bytes     group g: byte i = q[i] | q[16 + i] << 4 (GGUF's own order)
//     d, m   [G] fp16           the file's scale and minimum
// Four groups (64 bytes) are one vector: the low nibbles are the groups' first 16 values, the high
// nibbles the last 16; VPDPBUSD sums 4 products per int32 lane, so lane L holds group L / 4. A
// last chunk of fewer groups is read with masked loads.
//
// Every output row is computed by the same instruction sequence whatever the number of rows and
// whichever thread runs it: results do not depend on the batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "bf16.h"
#include "spin_pool.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_MATMUL_VNNI 1
#endif

namespace {

constexpr int64_t GROUP = 32, CHUNK = 4;   // values per group, groups per vector
constexpr int64_t TILE = 8;                // activation rows sharing one unpacked chunk

inline float bf16_to_f32(uint16_t x) { return bf16conv::to_f32(x); }
inline uint16_t f32_to_bf16(float f) { return bf16conv::from_f32(f); }

// One activation row, quantized per group and laid out as the kernel reads it.
struct QuantizedRow {
  std::vector<int8_t> lo, hi;     // [chunks * 64]: per chunk, the 4 groups' first / last 16 values
  std::vector<float> scale;       // [chunks * 16]: dx of the lane's group
  std::vector<float> sum;         // [chunks * 4]: sum of the group's quantized x (the m term)
};

void quantize_row(const uint16_t* x, int64_t k, QuantizedRow& q) {
  const int64_t groups = k / GROUP, chunks = (groups + CHUNK - 1) / CHUNK;
  q.lo.assign(chunks * 64, 0);
  q.hi.assign(chunks * 64, 0);
  q.scale.assign(chunks * 16, 0.f);
  q.sum.assign(chunks * CHUNK, 0.f);
  float v[GROUP];
  for (int64_t g = 0; g < k / GROUP; ++g) {
    float amax = 0.f;
    for (int64_t j = 0; j < GROUP; ++j) {
      v[j] = bf16_to_f32(x[g * GROUP + j]);
      amax = std::max(amax, std::fabs(v[j]));
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    const int64_t c = g / CHUNK, slot = g % CHUNK;
    int32_t codes = 0;
    for (int64_t j = 0; j < 16; ++j) {
      const int8_t a = static_cast<int8_t>(std::nearbyint(v[j] * inv));
      const int8_t b = static_cast<int8_t>(std::nearbyint(v[16 + j] * inv));
      q.lo[c * 64 + slot * 16 + j] = a;
      q.hi[c * 64 + slot * 16 + j] = b;
      codes += a + b;
    }
    for (int64_t lane = 0; lane < 4; ++lane) q.scale[c * 16 + slot * 4 + lane] = amax / 127.f;
    // the m term over the same quantized x as the d term: the product is then exactly that of
    // the dequantized weights with the quantized row (as llama.cpp's q8_1 sums)
    q.sum[g] = static_cast<float>(codes) * (amax / 127.f);
  }
}

#ifdef GGUF_MATMUL_VNNI
// T activation rows against one weight row: each chunk of weights is unpacked once for the T rows.
// A row's arithmetic is the same sequence for any T (the result does not depend on the batch).
template <int64_t T>
inline void q4_rows(const uint8_t* w, const uint16_t* dr, const uint16_t* mr, const QuantizedRow* qx,
                    int64_t chunks, int64_t groups, uint16_t* out, int64_t out_stride) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[T];
  for (int64_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    // the last chunk may hold fewer than 4 groups: masked loads (the row's x there is 0)
    const int64_t have = std::min(CHUNK, groups - c * CHUNK);
    const __mmask64 bytes = have == CHUNK ? ~0ull : (1ull << (have * 16)) - 1;
    const __m512i packed = _mm512_maskz_loadu_epi8(bytes, w + c * 64);
    const __m512i lo = _mm512_and_si512(packed, nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    const __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << have) - 1), dr + c * CHUNK));
    const __m512 dl = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
    for (int64_t t = 0; t < T; ++t) {
      const QuantizedRow& q = qx[t];
      __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(q.lo.data() + c * 64));
      dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(q.hi.data() + c * 64));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dl, _mm512_loadu_ps(q.scale.data() + c * 16)),
                               acc[t]);
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const QuantizedRow& q = qx[t];
    float y = _mm512_reduce_add_ps(acc[t]);
    __m512 macc = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 16 <= groups; g += 16)
      macc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mr + g))),
                             _mm512_loadu_ps(q.sum.data() + g), macc);
    if (g < groups) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (groups - g)) - 1);
      macc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, mr + g)),
                             _mm512_maskz_loadu_ps(tail, q.sum.data() + g), macc);
    }
    out[t * out_stride] = f32_to_bf16(y + _mm512_reduce_add_ps(macc));
  }
}
#endif

}  // namespace

bool gguf_matmul_available() {
#ifdef GGUF_MATMUL_VNNI
  return true;
#else
  return false;
#endif
}

// x [M, K] bf16; codes uint8 [N, G * 16]; d, m fp16 [N, G] (G = K / 32) -> [M, N] bf16
torch::Tensor q4_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d, torch::Tensor m) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x: a 2-D bf16 CPU tensor");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 2, "codes: uint8 [N, G * 16]");
  TORCH_CHECK(d.scalar_type() == at::kHalf && m.scalar_type() == at::kHalf && d.is_contiguous() && m.is_contiguous(),
              "d, m: contiguous fp16 [N, G]");
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0), groups = d.size(1);
  TORCH_CHECK(k == groups * GROUP && codes.size(1) == groups * 16 && d.size(0) == n && m.sizes() == d.sizes(),
              "q4_matmul: x [M, ", k, "] does not fit the packed weight [", n, ", ", groups * GROUP, "]");
  auto xc = x.contiguous();
  auto out = torch::empty({rows, n}, x.options());
#ifdef GGUF_MATMUL_VNNI
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  std::vector<QuantizedRow> qx(rows);
  spin_pool::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize_row(xp + r * k, k, qx[r]);
  });
  const uint8_t* wp = codes.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  const uint16_t* mp = reinterpret_cast<const uint16_t*>(m.data_ptr<at::Half>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t chunks = (groups + CHUNK - 1) / CHUNK;
  spin_pool::parallel_for(0, n, 32, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const uint8_t* w = wp + row * groups * 16;
      const uint16_t* dr = dp + row * groups;
      const uint16_t* mr = mp + row * groups;
      int64_t r0 = 0;
      for (; r0 + TILE <= rows; r0 += TILE) q4_rows<TILE>(w, dr, mr, qx.data() + r0, chunks, groups, op + r0 * n + row, n);
      for (; r0 < rows; ++r0) q4_rows<1>(w, dr, mr, qx.data() + r0, chunks, groups, op + r0 * n + row, n);
    }
  });
#else
  TORCH_CHECK(false, "q4_matmul: this build has no AVX-512 VNNI");
#endif
  return out;
}

// Q8_0: codes int8 [N, K] (w = d * q per 32 columns), d fp16 [N, G]. Two groups (64 bytes) per
// vector; VPDPBUSD multiplies unsigned by signed bytes, so the codes go in as q + 128 and each
// lane takes back 128 * (its four x codes), computed once per activation row.
torch::Tensor q8_matmul(torch::Tensor x, torch::Tensor codes, torch::Tensor d) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x: a 2-D bf16 CPU tensor");
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.dim() == 2, "codes: int8 [N, K]");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous(), "d: contiguous fp16 [N, G]");
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0), groups = d.size(1);
  TORCH_CHECK(k == groups * GROUP && codes.size(1) == k && d.size(0) == n,
              "q8_matmul: x [M, ", k, "] does not fit the weight [", n, ", ", codes.size(1), "]");
  auto xc = x.contiguous();
  auto out = torch::empty({rows, n}, x.options());
#ifdef GGUF_MATMUL_VNNI
  const int64_t chunks = (groups + 1) / 2;
  std::vector<int8_t> qx(rows * chunks * 64, 0);
  std::vector<float> dx(rows * chunks * 16, 0.f);
  std::vector<int32_t> corr(rows * chunks * 16, 0);
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float v[GROUP], amax = 0.f;
      for (int64_t j = 0; j < GROUP; ++j) {
        v[j] = bf16_to_f32(xp[r * k + g * GROUP + j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int8_t* q = qx.data() + r * chunks * 64 + g * GROUP;
      for (int64_t j = 0; j < GROUP; ++j) q[j] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
      for (int64_t lane = 0; lane < 8; ++lane) {
        const int64_t at = r * chunks * 16 + g * 8 + lane;
        dx[at] = amax / 127.f;
        corr[at] = 128 * (q[4 * lane] + q[4 * lane + 1] + q[4 * lane + 2] + q[4 * lane + 3]);
      }
    }
  }
  const int8_t* wp = codes.data_ptr<int8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  spin_pool::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int64_t row = begin; row < end; ++row) {
      const int8_t* w = wp + row * k;
      const uint16_t* dr = dp + row * groups;
      for (int64_t r = 0; r < rows; ++r) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t have = std::min<int64_t>(2, groups - 2 * c);
          const __mmask64 bytes = have == 2 ? ~0ull : (1ull << 32) - 1;
          const __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, w + c * 64), flip);
          const int64_t at = (r * chunks + c) * 16;
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(qx.data() + r * chunks * 64 + c * 64));
          dot = _mm512_sub_epi32(dot, _mm512_loadu_si512(corr.data() + at));
          const __m128 d2 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << have) - 1), dr + 2 * c));
          const __m512 dl = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d2));
          acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dl, _mm512_loadu_ps(dx.data() + at)), acc);
        }
        op[r * n + row] = f32_to_bf16(_mm512_reduce_add_ps(acc));
      }
    }
  });
#else
  TORCH_CHECK(false, "q8_matmul: this build has no AVX-512 VNNI");
#endif
  return out;
}
