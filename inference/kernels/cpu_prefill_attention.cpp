// Prefill attention over the paged bf16 KV cache on the CPU (built into cpu_ops by cpu_ops.py), with
// AVX-512 or AVX2 + FMA vectors; both levels (and the scalar code of other builds) give the same bits.
//
// A chunk's query rows attend causally to the context's keys, read from the cache's blocks in
// place (no gather). Work is split into tasks of (KV head, up to ROWS query rows): per key block the
// task converts K (transposed) and V to fp32 once, and every query head of the KV head, for every
// row of the tile, takes its scores, an online softmax and its weighted sum of V from them.
//
// Each (row, head) is computed from its own query and keys 0..its position, in key order, with a
// fixed order of arithmetic: a row's bits do not depend on how the prompt was cut into chunks (a
// prefix-cache hit, chunked prefill) nor on the other rows of its tile, which is what greedy
// determinism rests on (inference/models/invariant_attention.py states the same property of the
// PyTorch path this replaces for bf16 caches).
#include <torch/extension.h>

#include "bf16.h"
#include "lanes.h"
#include "spin_pool.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define PREFILL_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define PREFILL_AVX2 1
#endif

namespace {

using bf16 = uint16_t;
constexpr int64_t KEYS = 16;     // keys per step: one fp32 vector of scores
constexpr int64_t ROWS = 8;      // query rows per task: they share each block's fp32 K and V

#if defined(__AVX512F__)
// e^x for x <= 0 (scores minus their running max), fp32: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
// p a degree-6 Taylor polynomial (relative error < 2e-7). Lanes below -87 give 0.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
}
#elif defined(PREFILL_AVX2)
// The same e^x, 8 lanes. n >= -126 (x >= -87), so 2^n is a normal float built from its exponent
// bits, and p * 2^n is one rounding of the exact product, as VSCALEFPS gives.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.f);
  const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, two_n));
}
#endif

// The same e^x, one lane (the fallback of builds without AVX-512 gives the same bits).
inline float exp_nonpositive(float x) {
  if (x < -87.f) return 0.f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693145751953125f, x);
  r = std::fma(-n, 1.428606765330187045e-06f, r);
  float p = 1.f / 720;
  for (float c : {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = std::fma(p, r, c);
  return std::ldexp(p, static_cast<int>(n));
}

// One (row, query head) over one block: scores of its `valid` keys (kt [d][KEYS] fp32), the online
// softmax update of (m, l, acc [d]) and acc += p @ v (vf [KEYS][d] fp32). D > 0: the head size known
// at compile time (its accumulators stay in registers); D == 0: any multiple of 16, read from d.
template <int D>
inline void attend_block(const float* q, const float* kt, const float* vf, int64_t d, int64_t valid, float& m,
                         float& l, float* acc) {
  if (D > 0) d = D;
  alignas(64) float s[KEYS];
#if defined(PREFILL_AVX512)
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 4) {        // four chains over the dimensions, summed in a fixed order
    s0 = _mm512_fmadd_ps(_mm512_set1_ps(q[i]), _mm512_load_ps(kt + i * KEYS), s0);
    s1 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 1]), _mm512_load_ps(kt + (i + 1) * KEYS), s1);
    s2 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 2]), _mm512_load_ps(kt + (i + 2) * KEYS), s2);
    s3 = _mm512_fmadd_ps(_mm512_set1_ps(q[i + 3]), _mm512_load_ps(kt + (i + 3) * KEYS), s3);
  }
  __m512 sv = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
  const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1u);
  sv = _mm512_mask_blend_ps(live, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sv);
  const float mx = std::max(m, _mm512_reduce_max_ps(sv));
  const __m512 p = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(sv, _mm512_set1_ps(mx))));
  _mm512_store_ps(s, p);
  const float alpha = std::exp(m - mx);
  l = std::fma(l, alpha, _mm512_reduce_add_ps(p));
  m = mx;
  const __m512 av = _mm512_set1_ps(alpha);
  if constexpr (D > 0) {                      // keys outer, the D / 16 accumulators independent chains
    __m512 a[D / 16];
    for (int c = 0; c < D / 16; ++c) a[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), av);
    for (int64_t j = 0; j < valid; ++j) {
      const __m512 pj = _mm512_set1_ps(s[j]);
      for (int c = 0; c < D / 16; ++c) a[c] = _mm512_fmadd_ps(pj, _mm512_load_ps(vf + j * D + 16 * c), a[c]);
    }
    for (int c = 0; c < D / 16; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
  } else {
    for (int64_t c = 0; c < d; c += 16) {
      __m512 a = _mm512_mul_ps(_mm512_loadu_ps(acc + c), av);
      for (int64_t j = 0; j < valid; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), _mm512_load_ps(vf + j * d + c), a);
      _mm512_storeu_ps(acc + c, a);
    }
  }
#elif defined(PREFILL_AVX2)
  // the AVX-512 arithmetic on two 8-lane halves: the same operations per lane, the same bits
  __m256 t[4][2];
  for (auto& c : t) c[0] = c[1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 4)
    for (int c = 0; c < 4; ++c) {
      const __m256 qv = _mm256_set1_ps(q[i + c]);
      t[c][0] = _mm256_fmadd_ps(qv, _mm256_load_ps(kt + (i + c) * KEYS), t[c][0]);
      t[c][1] = _mm256_fmadd_ps(qv, _mm256_load_ps(kt + (i + c) * KEYS + 8), t[c][1]);
    }
  _mm256_store_ps(s, _mm256_add_ps(_mm256_add_ps(t[0][0], t[1][0]), _mm256_add_ps(t[2][0], t[3][0])));
  _mm256_store_ps(s + 8, _mm256_add_ps(_mm256_add_ps(t[0][1], t[1][1]), _mm256_add_ps(t[2][1], t[3][1])));
  float mx = m;
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
  const __m256 mv = _mm256_set1_ps(mx);
  _mm256_store_ps(s, exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(s), mv)));
  _mm256_store_ps(s + 8, exp_nonpositive(_mm256_sub_ps(_mm256_load_ps(s + 8), mv)));
  for (int64_t j = valid; j < KEYS; ++j) s[j] = 0.f;
  const float alpha = std::exp(m - mx);
  l = std::fma(l, alpha, lanes::sum16(s));
  m = mx;
  const __m256 av = _mm256_set1_ps(alpha);
  if constexpr (D > 0) {
    __m256 a[D / 8];
    for (int c = 0; c < D / 8; ++c) a[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * c), av);
    for (int64_t j = 0; j < valid; ++j) {
      const __m256 pj = _mm256_set1_ps(s[j]);
      for (int c = 0; c < D / 8; ++c) a[c] = _mm256_fmadd_ps(pj, _mm256_load_ps(vf + j * D + 8 * c), a[c]);
    }
    for (int c = 0; c < D / 8; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
  } else {
    for (int64_t c = 0; c < d; c += 8) {
      __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + c), av);
      for (int64_t j = 0; j < valid; ++j) a = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_load_ps(vf + j * d + c), a);
      _mm256_storeu_ps(acc + c, a);
    }
  }
#else
  // the same arithmetic lane by lane, so that both ISA levels give the same bits
  float t[4][KEYS] = {};
  for (int64_t i = 0; i < d; i += 4)
    for (int c = 0; c < 4; ++c)
      for (int64_t j = 0; j < KEYS; ++j) t[c][j] = std::fma(q[i + c], kt[(i + c) * KEYS + j], t[c][j]);
  float mx = m;
  for (int64_t j = 0; j < valid; ++j) {
    s[j] = (t[0][j] + t[1][j]) + (t[2][j] + t[3][j]);
    mx = std::max(mx, s[j]);
  }
  for (int64_t j = 0; j < KEYS; ++j) s[j] = j < valid ? exp_nonpositive(s[j] - mx) : 0.f;
  const float alpha = std::exp(m - mx);
  l = std::fma(l, alpha, lanes::sum16(s));
  m = mx;
  for (int64_t c = 0; c < d; ++c) {
    float a = acc[c] * alpha;
    for (int64_t j = 0; j < valid; ++j) a = std::fma(s[j], vf[j * d + c], a);
    acc[c] = a;
  }
#endif
}

// A block's keys and values as fp32: kt [d][KEYS] (transposed: a dimension's 16 keys are one
// vector) and vf [KEYS][d]; keys at or past `len` are zeros.
inline void load_block(const bf16* k, const bf16* v, int64_t stride, int64_t d, int64_t len, float* kt, float* vf) {
  for (int64_t j = 0; j < KEYS; ++j) {
    const bf16* kj = k + j * stride;
    const bf16* vj = v + j * stride;
    if (j >= len) {
      for (int64_t i = 0; i < d; ++i) kt[i * KEYS + j] = vf[j * d + i] = 0.f;
      continue;
    }
#if defined(PREFILL_AVX512)
    for (int64_t i = 0; i < d; i += 16) {
      const __m512 kv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kj + i))), 16));
      _mm512_i32scatter_ps(kt + i * KEYS + j, _mm512_mullo_epi32(_mm512_set1_epi32(KEYS),
                           _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)), kv, 4);
      _mm512_store_ps(vf + j * d + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vj + i))), 16)));
    }
#elif defined(PREFILL_AVX2)
    alignas(32) float kv[8];
    for (int64_t i = 0; i < d; i += 8) {
      const __m128i kb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kj + i));
      _mm256_store_ps(kv, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(kb), 16)));
      for (int c = 0; c < 8; ++c) kt[(i + c) * KEYS + j] = kv[c];
      _mm256_store_ps(vf + j * d + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(vj + i))), 16)));
    }
#else
    for (int64_t i = 0; i < d; ++i) {
      kt[i * KEYS + j] = bf16conv::to_f32(kj[i]);
      vf[j * d + i] = bf16conv::to_f32(vj[i]);
    }
#endif
  }
}

}  // namespace

// q [n, H, D] bf16: the chunk's rows, the last n of context_len tokens (their K/V already in the
// cache); caches [blocks, block_size, Hkv, D] bf16; table [>= ceil(context_len / block_size)]
// int64 -> [n, H, D] bf16. D a multiple of 16, block_size a multiple of 16.
torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor table,
                                      int64_t context_len, double scale) {
  for (const auto* t : {&q, &k_cache, &v_cache})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kBFloat16 && t->is_contiguous(),
                "paged_prefill_attention: contiguous bf16 CPU tensors are needed");
  TORCH_CHECK(table.scalar_type() == at::kLong, "table: int64");
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t block = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  TORCH_CHECK(k_cache.size(3) == d && heads % kv_heads == 0, "q and the caches disagree on heads or head_dim");
  TORCH_CHECK(d % 16 == 0 && block % KEYS == 0, "head_dim and block_size must be multiples of 16");
  TORCH_CHECK(n >= 1 && n <= context_len, "context_len: ", context_len, " is shorter than the chunk (", n, ")");
  auto tab = table.contiguous();
  const int64_t used = (context_len + block - 1) / block;
  TORCH_CHECK(tab.numel() >= used, "table: ", tab.numel(), " blocks for ", context_len, " tokens");
  const int64_t* tp = tab.data_ptr<int64_t>();
  for (int64_t j = 0; j < used; ++j) TORCH_CHECK(tp[j] >= 0 && tp[j] < k_cache.size(0), "table: block outside the cache");
  auto out = torch::empty_like(q);
  const bf16* qp = reinterpret_cast<const bf16*>(q.data_ptr<at::BFloat16>());
  const bf16* kp = reinterpret_cast<const bf16*>(k_cache.data_ptr<at::BFloat16>());
  const bf16* vp = reinterpret_cast<const bf16*>(v_cache.data_ptr<at::BFloat16>());
  bf16* op = reinterpret_cast<bf16*>(out.data_ptr<at::BFloat16>());
  const float sc = static_cast<float>(scale);
  const int64_t tiles = (n + ROWS - 1) / ROWS, first_pos = context_len - n;
  spin_pool::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(ROWS * group * d), acc(ROWS * group * d), m(ROWS * group),
        l(ROWS * group);
    std::vector<float> kbuf(KEYS * d + 16), vbuf(KEYS * d + 16);
    float* kt = kbuf.data() + (16 - reinterpret_cast<uintptr_t>(kbuf.data()) / 4 % 16) % 16;   // 64-byte aligned
    float* vf = vbuf.data() + (16 - reinterpret_cast<uintptr_t>(vbuf.data()) / 4 % 16) % 16;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / tiles, r0 = task % tiles * ROWS, rows = std::min(ROWS, n - r0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < group; ++g)
          for (int64_t i = 0; i < d; ++i)
            qf[(r * group + g) * d + i] = bf16conv::to_f32(qp[((r0 + r) * heads + h * group + g) * d + i]) * sc;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      const int64_t last_key = first_pos + r0 + rows - 1;          // the tile's last row sees keys 0..last_key
      for (int64_t start = 0; start <= last_key; start += KEYS) {
        const int64_t len = std::min(KEYS, last_key + 1 - start);
        const int64_t slot0 = tp[start / block] * block + start % block;
        load_block(kp + (slot0 * kv_heads + h) * d, vp + (slot0 * kv_heads + h) * d, kv_heads * d, d, len, kt, vf);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t valid = std::min(len, first_pos + r0 + r + 1 - start);    // causal: keys <= the row's position
          if (valid <= 0) continue;
          for (int64_t g = 0; g < group; ++g) {
            const int64_t x = r * group + g;
            float* qx = qf.data() + x * d;
            float* ax = acc.data() + x * d;
            if (d == 64) attend_block<64>(qx, kt, vf, d, valid, m[x], l[x], ax);
            else if (d == 128) attend_block<128>(qx, kt, vf, d, valid, m[x], l[x], ax);
            else attend_block<0>(qx, kt, vf, d, valid, m[x], l[x], ax);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < group; ++g) {
          const int64_t x = r * group + g;
          const float inv = 1.f / l[x];
          bf16* o = op + ((r0 + r) * heads + h * group + g) * d;
          for (int64_t i = 0; i < d; ++i) o[i] = bf16conv::from_f32(acc[x * d + i] * inv);
        }
    }
  });
  return out;
}
