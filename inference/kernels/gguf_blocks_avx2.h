// The GGUF block kernels of gguf_matmul.cpp for CPUs with AVX2 + FMA + F16C and no AVX-512 VNNI
// (AMD Zen 2/3, Intel Haswell to Comet Lake), included inside its anonymous namespace.
//
// The packed layout is the AVX-512 one: a 64-byte vector of 16 rows is read as two 32-byte halves
// (rows 0-7, rows 8-15). VPMADDUBSW + VPMADDWD stand for VPDPBUSD: per int32 lane, the sum of 4
// unsigned x signed byte products. Their int16 pair sums stay below 2^15: nibble-kind codes are at
// most 63 (2 * 63 * 127), and Q8_0 goes in as |q| with the activation's sign flipped where q < 0
// (2 * 128 * 127), not as q + 128. Every group's integer dot product, and every fp32 operation
// after it, is the AVX-512 path's: the two levels give bit-identical results.

inline int32_t hsum8(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
}

// Activations per 32-value group: the same fp32 products, rounded to nearest even by VCVTPS2DQ and
// saturated to int8 as the AVX-512 path does, so the same int8 codes and scales.
void quantize_acts(const uint16_t* x, int64_t rows, int64_t k, QuantizedActs& a) {
  const int64_t groups = k / GROUP;
  a.resize(rows, k);
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   // undoes the packs' lane interleave
  spin_pool::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t* xg = x + r * k + g * GROUP;
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
          v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
              _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xg + 8 * i))), 16));
          mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
        const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        __m256i c[4];
        for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q.data() + r * k + g * GROUP),
                            _mm256_permutevar8x32_epi32(bytes, order));
        const int32_t lo = hsum8(_mm256_add_epi32(c[0], c[1])), hi = hsum8(_mm256_add_epi32(c[2], c[3]));
        const int64_t at = r * groups + g;
        a.dx[at] = amax / 127.f;
        a.qs[at] = lo + hi;
        a.qh[2 * at] = lo;
        a.qh[2 * at + 1] = hi;
        a.sx[at] = static_cast<float>(lo + hi) * (amax / 127.f);
      }
    }
  });
}

// per int32 lane: sum of 4 products u[b] * x[b] (u unsigned, x signed bytes)
inline __m256i dot4(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

// codes 0..15 (lo) and 16..31 (hi) of a group, 8 rows: exact int32 per row. Codes below 32 (P <= 1)
// keep four VPMADDUBSW pair sums in int16 before widening (4 * 2 * 31 * 127 < 2^15); 6-bit codes
// two at a time (2 * 2 * 63 * 127 < 2^15).
template <int P>
inline void group_dot(const __m256i* u, const int8_t* xg, __m256i& lo, __m256i& hi) {
  const int32_t* xq = reinterpret_cast<const int32_t*>(xg);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i p[8];
  for (int i = 0; i < 8; ++i) p[i] = _mm256_maddubs_epi16(u[i], _mm256_set1_epi32(xq[i]));
  if constexpr (P <= 1) {
    lo = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])), ones);
    hi = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])), ones);
  } else {
    lo = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), ones),
                          _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), ones));
    hi = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p[4], p[5]), ones),
                          _mm256_madd_epi16(_mm256_add_epi16(p[6], p[7]), ones));
  }
}

template <bool F32>
inline __m256 load_scales8(const void* p, int64_t at, int half) {
  if constexpr (F32) return _mm256_loadu_ps(static_cast<const float*>(p) + at * BLOCK + half * 8);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + at * BLOCK + half * 8)));
}

template <int64_t T>
inline void store(__m256 (*acc)[2], const float* bias, OutRows out, int64_t out_stride) {
  alignas(32) float v[8];
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < 2; ++h) {
      __m256 y = acc[t][h];
      if (bias != nullptr) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + h * 8));
      void* dst = out.at(t * out_stride + h * 8).p;
      if (out.f32) {
        _mm256_storeu_ps(static_cast<float*>(dst), y);
        continue;
      }
      _mm256_store_ps(v, y);
      for (int i = 0; i < 8; ++i) static_cast<uint16_t*>(dst)[i] = bf16conv::from_f32(v[i]);
    }
  }
}

template <int P, bool F32, bool HALF, int64_t T>
inline void nibble_block(const uint8_t* w, const void* s, const void* m, const QuantizedActs& a, int64_t r0,
                         int64_t k, int64_t groups, const float* bias, OutRows out, int64_t out_stride) {
  constexpr int64_t BYTES = 256 + 64 * P;
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  __m256 acc[T][2], macc[T][2];
  for (int64_t t = 0; t < T; ++t) acc[t][0] = acc[t][1] = macc[t][0] = macc[t][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = w + g * BYTES;
    prefetch<BYTES>(wg + PREFETCH_NIBBLE);
    for (int h = 0; h < 2; ++h) {
      __m256i u[8];
      for (int i = 0; i < 4; ++i) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + i * 64 + h * 32));
        u[i] = _mm256_and_si256(p, nibble);
        u[4 + i] = _mm256_and_si256(_mm256_srli_epi16(p, 4), nibble);
      }
      for (int plane = 0; plane < P; ++plane) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(16 << plane));
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 256 + plane * 64 + h * 32));
        for (int j = 0; j < 8; ++j) {   // bit j of each byte -> bit 4 + plane
          const int shift = 4 + plane - j;
          const __m256i moved = shift >= 0 ? _mm256_sll_epi16(bits, _mm_cvtsi32_si128(shift))
                                           : _mm256_srl_epi16(bits, _mm_cvtsi32_si128(-shift));
          u[j] = _mm256_or_si256(u[j], _mm256_and_si256(moved, bit));
        }
      }
      if constexpr (HALF) {
        const __m256 s0 = load_scales8<F32>(s, 2 * g, h), s1 = load_scales8<F32>(s, 2 * g + 1, h);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t at = (r0 + t) * groups + g;
          __m256i lo, hi;
          group_dot<P>(u, a.q.data() + (r0 + t) * k + g * GROUP, lo, hi);
          lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * a.qh[2 * at]));
          hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * a.qh[2 * at + 1]));
          const __m256 dx = _mm256_set1_ps(a.dx[at]);
          acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(s0, dx), acc[t][h]);
          acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(s1, dx), acc[t][h]);
        }
      } else {
        const __m256 sv = load_scales8<F32>(s, g, h), mv = load_scales8<F32>(m, g, h);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t at = (r0 + t) * groups + g;
          __m256i lo, hi;
          group_dot<P>(u, a.q.data() + (r0 + t) * k + g * GROUP, lo, hi);
          acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)),
                                      _mm256_mul_ps(sv, _mm256_set1_ps(a.dx[at])), acc[t][h]);
          macc[t][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(a.sx[at]), macc[t][h]);
        }
      }
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < 2; ++h) acc[t][h] = _mm256_add_ps(acc[t][h], macc[t][h]);
  store<T>(acc, bias, out, out_stride);
}

template <int64_t T>
inline void q8_block(const int8_t* w, const void* d, const QuantizedActs& a, int64_t r0, int64_t k, int64_t groups,
                     const float* bias, OutRows out, int64_t out_stride) {
  __m256 acc[T][2];
  for (int64_t t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    prefetch<512>(w + g * 512 + PREFETCH_Q8);
    for (int h = 0; h < 2; ++h) {
      __m256i q[8], u[8];
      for (int i = 0; i < 8; ++i) {
        q[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 512 + i * 64 + h * 32));
        u[i] = _mm256_abs_epi8(q[i]);
      }
      const __m256 dv = load_scales8<false>(d, g, h);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = (r0 + t) * groups + g;
        const int32_t* xq = reinterpret_cast<const int32_t*>(a.q.data() + (r0 + t) * k + g * GROUP);
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
          lo = _mm256_add_epi32(lo, dot4(u[i], _mm256_sign_epi8(_mm256_set1_epi32(xq[i]), q[i])));
          hi = _mm256_add_epi32(hi, dot4(u[4 + i], _mm256_sign_epi8(_mm256_set1_epi32(xq[4 + i]), q[4 + i])));
        }
        acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)),
                                    _mm256_mul_ps(dv, _mm256_set1_ps(a.dx[at])), acc[t][h]);
      }
    }
  }
  store<T>(acc, bias, out, out_stride);
}
