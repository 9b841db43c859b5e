// x @ W^T on the CPU for weights kept as GGUF's quantized blocks, with AVX-512 VNNI integer dot
// products, as llama.cpp runs them: each 32-value group of an activation row is quantized to int8
// with its own scale (dx = max|x| / 127), and per output n and 32-column group g
//
//     y[n] += (s[n,g] * dx[g]) * sum_j q[n,g,j] * qx[g,j]  (- OFF * sum_j qx[g,j])  +  m[n,g] * dx[g] * sum_j qx[g,j]
//
// Kinds (inference/models/gguf_cpu_linear.py packs them from the file's bytes, codes unchanged):
//     Q4   4-bit codes, fp16 s and m per group           Q4_0 (m = -8 s), Q4_1
//     Q5   5-bit codes, fp16 s and m per group           Q5_0 (m = -16 s), Q5_1
//     Q4K  4-bit codes, fp32 s = d * sc, m = -dmin * mn  Q4_K (exact products of the file's fields)
//     Q5K  5-bit codes, as Q4K                           Q5_K
//     Q6K  6-bit codes, fp32 s = d * sc per 16 values, OFF = 32, no m      Q6_K
//     Q8   signed 8-bit codes, fp16 s per group, no m    Q8_0
//
// Weights are packed in blocks of 16 output rows, so one vector holds 16 outputs:
//     nibble kinds, per block and group: 4 vectors (256 bytes); vector i, byte 4 * n + t holds row n's
//         code 4i + t in its low nibble and code 16 + 4i + t in its high nibble; then, for 5- and
//         6-bit codes, 1 or 2 bit planes of 64 bytes: byte 4 * n + t, bit j = bit 4 (+1) of row n's
//         code 4j + t, so one shift and one AND put vector j's top bits in place
//     Q8, per block and group: 8 vectors; vector i, byte 4 * n + t: code 4i + t
//     s, m [N / 16, G (x 2 for Q6K), 16]: 16 rows of a group side by side
// A group's dot product is exact in int32; its float sum runs over the groups in order.
//
// Every output is computed by the same instruction sequence whatever the number of rows and
// whichever thread runs it: results do not depend on the batch.
#include <torch/extension.h>

#include "bf16.h"
#include "spin_pool.h"

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// The ISA level this build runs (inference/kernels/cpu_ops.py builds one module per level): AVX-512
// with VNNI, or AVX2 + FMA + F16C (gguf_blocks_avx2.h). Both compute the same integers and the same
// fp32 operations in the same order: their results are bit-identical.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_MATMUL_VNNI 1
#define GGUF_MATMUL_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_MATMUL_AVX2 1
#define GGUF_MATMUL_SIMD 1
#endif

namespace {

constexpr int64_t GROUP = 32;   // values per group
constexpr int64_t BLOCK = 16;   // output rows per packed block (one fp32 vector)
constexpr int64_t TILE = 6;     // activation rows sharing one unpacked group of a block

enum Kind : int64_t { Q4 = 0, Q5 = 1, Q4K = 2, Q5K = 3, Q6K = 4, Q8 = 5 };

int64_t group_bytes(int64_t kind) {
  switch (kind) {
    case Q4: case Q4K: return 256;
    case Q5: case Q5K: return 256 + 64;
    case Q6K: return 256 + 128;
    case Q8: return 512;
    default: TORCH_CHECK(false, "gguf_linear: unknown kind ", kind);
  }
}
bool f32_scales(int64_t kind) { return kind == Q4K || kind == Q5K || kind == Q6K; }
bool has_min(int64_t kind) { return kind != Q6K && kind != Q8; }
int64_t scales_per_group(int64_t kind) { return kind == Q6K ? 2 : 1; }

#ifdef GGUF_MATMUL_SIMD
// Activation rows quantized per group: codes [rows, k], and per (row, group) the scale dx, the
// sum of the codes times dx (the m term), the sum of the codes and of each half's codes.
struct QuantizedActs {
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  std::vector<int32_t> qs, qh;   // qh [rows * groups * 2]: codes 0..15, 16..31

  void resize(int64_t rows, int64_t k) {
    const int64_t groups = k / GROUP;
    q.resize(rows * k);
    dx.resize(rows * groups);
    sx.resize(rows * groups);
    qs.resize(rows * groups);
    qh.resize(rows * groups * 2);
  }
};
#endif

// A thread streams its blocks' codes from memory; the hardware prefetcher alone left a decode pass
// of the 0.5B at ~60% of the read bandwidth on a Zen 3 VM. Asking for the lines ~1.5 KB ahead took the
// AVX2 pass from 15.1-15.8 to 13.2-14.5 ms there (bench/cpu/gguf_layers.py); both levels prefetch
// (a prefetch past the end of the codes is harmless: it never faults).
constexpr int64_t PREFETCH_NIBBLE = 1536, PREFETCH_Q8 = 1024;

template <int64_t BYTES>
inline void prefetch(const void* p) {
  for (int64_t l = 0; l < BYTES; l += 64) _mm_prefetch(static_cast<const char*>(p) + l, _MM_HINT_T0);
}

// Where a block's output rows go: bf16 (the activations' dtype) or fp32 (logits: bf16 keeps 8
// mantissa bits, so near-equal logits tie and the argmax takes the lowest id).
struct OutRows {
  void* p;
  bool f32;
  OutRows at(int64_t i) const {
    return {f32 ? static_cast<void*>(static_cast<float*>(p) + i) : static_cast<void*>(static_cast<uint16_t*>(p) + i), f32};
  }
};

#ifdef GGUF_MATMUL_AVX2
#include "gguf_blocks_avx2.h"
#endif

#ifdef GGUF_MATMUL_VNNI

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
  a.resize(rows, k);
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
        const int32_t lo = _mm512_reduce_add_epi32(c0), hi = _mm512_reduce_add_epi32(c1);
        const int64_t at = r * groups + g;
        a.dx[at] = amax / 127.f;
        a.qs[at] = lo + hi;
        a.qh[2 * at] = lo;
        a.qh[2 * at + 1] = hi;
        // the m term over the same quantized x as the d term (as llama.cpp's q8_1 sums)
        a.sx[at] = static_cast<float>(lo + hi) * (amax / 127.f);
      }
    }
  });
}

// One group's dot products of 8 vectors of 16 rows' codes (unsigned) with a row's 32 activation
// codes: exact int32 per output row, for codes 0..15 (lo) and 16..31 (hi).
inline void group_dot(const __m512i* u, const int8_t* xg, __m512i& lo, __m512i& hi) {
  const int32_t* xq = reinterpret_cast<const int32_t*>(xg);
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_set1_epi32(xq[0]));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[4], _mm512_set1_epi32(xq[4]));
  s0 = _mm512_dpbusd_epi32(s0, u[1], _mm512_set1_epi32(xq[1]));
  s1 = _mm512_dpbusd_epi32(s1, u[5], _mm512_set1_epi32(xq[5]));
  s0 = _mm512_dpbusd_epi32(s0, u[2], _mm512_set1_epi32(xq[2]));
  s1 = _mm512_dpbusd_epi32(s1, u[6], _mm512_set1_epi32(xq[6]));
  s0 = _mm512_dpbusd_epi32(s0, u[3], _mm512_set1_epi32(xq[3]));
  s1 = _mm512_dpbusd_epi32(s1, u[7], _mm512_set1_epi32(xq[7]));
  lo = s0;
  hi = s1;
}

template <bool F32>
inline __m512 load_scales(const void* p, int64_t at) {
  if constexpr (F32) return _mm512_loadu_ps(static_cast<const float*>(p) + at * BLOCK);
  else return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + at * BLOCK)));
}

inline void store(const __m512* acc, const float* bias, OutRows out, int64_t out_stride, int64_t t_count) {
  const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int64_t t = 0; t < t_count; ++t) {
    const __m512 y = _mm512_add_ps(acc[t], b);
    if (out.f32) _mm512_storeu_ps(static_cast<float*>(out.at(t * out_stride).p), y);
    else _mm256_storeu_si256(static_cast<__m256i*>(out.at(t * out_stride).p), f32x16_to_bf16(y));
  }
}

// T activation rows (from r0) against one block of 16 output rows of a nibble kind with P bit
// planes; the block's group is unpacked once for the T rows. A row's arithmetic is the same
// sequence for any T.
template <int P, bool F32, bool HALF, int64_t T>
inline void nibble_block(const uint8_t* w, const void* s, const void* m, const QuantizedActs& a, int64_t r0,
                         int64_t k, int64_t groups, const float* bias, OutRows out, int64_t out_stride) {
  constexpr int64_t BYTES = 256 + 64 * P;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[T], macc[T];
  for (int64_t t = 0; t < T; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = w + g * BYTES;
    prefetch<BYTES>(wg + PREFETCH_NIBBLE);
    __m512i u[8];
    for (int i = 0; i < 4; ++i) {
      const __m512i p = _mm512_loadu_si512(wg + i * 64);
      u[i] = _mm512_and_si512(p, nibble);
      u[4 + i] = _mm512_and_si512(_mm512_srli_epi16(p, 4), nibble);
    }
    for (int plane = 0; plane < P; ++plane) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << plane));
      const __m512i bits = _mm512_loadu_si512(wg + 256 + plane * 64);
      for (int j = 0; j < 8; ++j) {     // bit j of each byte -> bit 4 + plane (16-bit shifts: the AND drops spill)
        const int shift = 4 + plane - j;
        const __m512i moved = shift >= 0 ? _mm512_sll_epi16(bits, _mm_cvtsi32_si128(shift))
                                         : _mm512_srl_epi16(bits, _mm_cvtsi32_si128(-shift));
        u[j] = _mm512_or_si512(u[j], _mm512_and_si512(moved, bit));
      }
    }
    if constexpr (HALF) {   // Q6K: a scale per 16 values, codes offset by 32
      const __m512 s0 = load_scales<F32>(s, 2 * g), s1 = load_scales<F32>(s, 2 * g + 1);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = (r0 + t) * groups + g;
        __m512i lo, hi;
        group_dot(u, a.q.data() + (r0 + t) * k + g * GROUP, lo, hi);
        lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(32 * a.qh[2 * at]));
        hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * a.qh[2 * at + 1]));
        const __m512 dx = _mm512_set1_ps(a.dx[at]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(s0, dx), acc[t]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(s1, dx), acc[t]);
      }
    } else {
      const __m512 sv = load_scales<F32>(s, g), mv = load_scales<F32>(m, g);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = (r0 + t) * groups + g;
        __m512i lo, hi;
        group_dot(u, a.q.data() + (r0 + t) * k + g * GROUP, lo, hi);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), _mm512_mul_ps(sv, _mm512_set1_ps(a.dx[at])), acc[t]);
        macc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.sx[at]), macc[t]);
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) acc[t] = _mm512_add_ps(acc[t], macc[t]);
  store(acc, bias, out, out_stride, T);
}

// Q8_0: VPDPBUSD wants unsigned weights, so the codes go in as q + 128 and each row gives back
// 128 * (the sum of its group's activation codes).
template <int64_t T>
inline void q8_block(const int8_t* w, const void* d, const QuantizedActs& a, int64_t r0, int64_t k, int64_t groups,
                     const float* bias, OutRows out, int64_t out_stride) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[T];
  for (int64_t t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    prefetch<512>(w + g * 512 + PREFETCH_Q8);
    __m512i u[8];
    for (int i = 0; i < 8; ++i) u[i] = _mm512_xor_si512(_mm512_loadu_si512(w + g * 512 + i * 64), flip);
    const __m512 dv = load_scales<false>(d, g);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = (r0 + t) * groups + g;
      __m512i lo, hi;
      group_dot(u, a.q.data() + (r0 + t) * k + g * GROUP, lo, hi);
      const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), _mm512_set1_epi32(128 * a.qs[at]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, _mm512_set1_ps(a.dx[at])), acc[t]);
    }
  }
  store(acc, bias, out, out_stride, T);
}

#endif  // GGUF_MATMUL_VNNI

#ifdef GGUF_MATMUL_SIMD
// One segment of a linear's output rows: a kind, its packed codes and scales, where its rows go.
struct Segment {
  int64_t kind, blocks, col0;
  const uint8_t* codes;
  const void *s, *m;
};

template <int64_t T>
inline void run_block(const Segment& sg, int64_t b, const QuantizedActs& a, int64_t r0, int64_t k, int64_t groups,
                      const float* bias, OutRows out, int64_t n) {
  const int64_t gb = group_bytes(sg.kind) * groups, sc = scales_per_group(sg.kind) * groups * BLOCK;
  const uint8_t* w = sg.codes + b * gb;
  const bool f32 = f32_scales(sg.kind);
  const void* s = f32 ? static_cast<const void*>(static_cast<const float*>(sg.s) + b * sc)
                      : static_cast<const void*>(static_cast<const uint16_t*>(sg.s) + b * sc);
  const void* m = !has_min(sg.kind) ? nullptr
                  : f32 ? static_cast<const void*>(static_cast<const float*>(sg.m) + b * groups * BLOCK)
                        : static_cast<const void*>(static_cast<const uint16_t*>(sg.m) + b * groups * BLOCK);
  switch (sg.kind) {
    case Q4: nibble_block<0, false, false, T>(w, s, m, a, r0, k, groups, bias, out, n); break;
    case Q5: nibble_block<1, false, false, T>(w, s, m, a, r0, k, groups, bias, out, n); break;
    case Q4K: nibble_block<0, true, false, T>(w, s, m, a, r0, k, groups, bias, out, n); break;
    case Q5K: nibble_block<1, true, false, T>(w, s, m, a, r0, k, groups, bias, out, n); break;
    case Q6K: nibble_block<2, true, true, T>(w, s, m, a, r0, k, groups, bias, out, n); break;
    case Q8: q8_block<T>(reinterpret_cast<const int8_t*>(w), s, a, r0, k, groups, bias, out, n); break;
    default: break;
  }
}
static_assert(TILE == 6, "the tile switch below handles a rest of up to 5 rows");
#endif

}  // namespace

bool gguf_matmul_available() {
#ifdef GGUF_MATMUL_SIMD
  return true;
#else
  return false;
#endif
}

// The ISA level of this build's GGUF kernels: "avx512_vnni", "avx2" or "none".
std::string gguf_matmul_isa() {
#if defined(GGUF_MATMUL_VNNI)
  return "avx512_vnni";
#elif defined(GGUF_MATMUL_AVX2)
  return "avx2";
#else
  return "none";
#endif
}

// x [M, K] bf16; per segment i: codes uint8 [N_i / 16, G * bytes(kind)], s [N_i / 16, G (x2), 16]
// (fp16, fp32 for K kinds), m like s (or empty), kinds[i]; bias fp32 [sum N_i] or None
// -> [M, sum N_i] bf16 (fp32 with f32_out), the segments' rows side by side.
torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& codes, const std::vector<torch::Tensor>& s,
                          const std::vector<torch::Tensor>& m, const std::vector<int64_t>& kinds,
                          const c10::optional<torch::Tensor>& bias, bool f32_out) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2, "x: a 2-D bf16 CPU tensor");
  TORCH_CHECK(!codes.empty() && codes.size() == s.size() && s.size() == m.size() && m.size() == kinds.size(),
              "gguf_linear: one codes, scales, mins and kind per segment");
  const int64_t rows = x.size(0), k = x.size(1), groups = k / GROUP;
  TORCH_CHECK(k % GROUP == 0, "gguf_linear: x has ", k, " columns, not a multiple of 32");
#ifdef GGUF_MATMUL_SIMD
  std::vector<Segment> segs;
  int64_t blocks = 0;
  for (size_t i = 0; i < codes.size(); ++i) {
    const int64_t kind = kinds[i];
    const auto sdtype = f32_scales(kind) ? at::kFloat : at::kHalf;
    TORCH_CHECK(codes[i].is_contiguous() && codes[i].dim() == 2 && codes[i].size(1) == groups * group_bytes(kind)
                    && codes[i].element_size() == 1,
                "gguf_linear: segment ", i, ": codes [N / 16, ", groups * group_bytes(kind), "] bytes expected for x [M, ", k, "]");
    const int64_t nb = codes[i].size(0);
    TORCH_CHECK(s[i].scalar_type() == sdtype && s[i].is_contiguous() && s[i].numel() == nb * groups * scales_per_group(kind) * BLOCK,
                "gguf_linear: segment ", i, ": scales of the wrong dtype or size");
    if (has_min(kind))
      TORCH_CHECK(m[i].scalar_type() == sdtype && m[i].is_contiguous() && m[i].numel() == nb * groups * BLOCK,
                  "gguf_linear: segment ", i, ": mins of the wrong dtype or size");
    segs.push_back({kind, nb, blocks * BLOCK, static_cast<const uint8_t*>(codes[i].data_ptr()), s[i].data_ptr(),
                    has_min(kind) ? m[i].data_ptr() : nullptr});
    blocks += nb;
  }
  const int64_t n = blocks * BLOCK;
  const float* bp = nullptr;
  torch::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    bc = bias->contiguous();
    TORCH_CHECK(bc.scalar_type() == at::kFloat && bc.numel() == n, "gguf_linear: bias fp32 [", n, "] expected");
    bp = bc.data_ptr<float>();
  }
  auto xc = x.contiguous();
  auto out = torch::empty({rows, n}, x.options().dtype(f32_out ? at::kFloat : at::kBFloat16));
  QuantizedActs a;
  quantize_acts(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), rows, k, a);
  const OutRows op{out.data_ptr(), f32_out};
  spin_pool::parallel_for(0, blocks, 2, [&](int64_t begin, int64_t end) {
    size_t si = 0;
    for (int64_t gb = begin; gb < end; ++gb) {
      while (gb * BLOCK >= segs[si].col0 + segs[si].blocks * BLOCK) ++si;
      const Segment& sg = segs[si];
      const int64_t b = gb - sg.col0 / BLOCK;
      const OutRows ob = op.at(gb * BLOCK);
      const float* bb = bp != nullptr ? bp + gb * BLOCK : nullptr;
      int64_t r0 = 0;
      for (; r0 + TILE <= rows; r0 += TILE) run_block<TILE>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n);
      switch (rows - r0) {
        case 5: run_block<5>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n); break;
        case 4: run_block<4>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n); break;
        case 3: run_block<3>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n); break;
        case 2: run_block<2>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n); break;
        case 1: run_block<1>(sg, b, a, r0, k, groups, bb, ob.at(r0 * n), n); break;
        default: break;
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "gguf_linear: this build has neither AVX-512 VNNI nor AVX2");
#endif
}
