// CPU kernels for the bf16 step around the int4 matmuls (inference/kernels/cpu_ops.py builds
// this file with torch's C++ extension loader; inference/models/cpu_layers.py uses it).
//
// Each op does in one pass what the PyTorch path does in several ops, computes in fp32 and rounds
// to bf16 once. Every output row depends on its own inputs only, in a fixed order of arithmetic,
// so results do not depend on the batch a row is in or on how threads split the work.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "bf16.h"
#include "lanes.h"
#include "spin_pool.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using bf16 = uint16_t;

inline float to_f32(bf16 x) { return bf16conv::to_f32(x); }
inline bf16 to_bf16(float f) { return bf16conv::from_f32(f); }

const bf16* bf16_data(const torch::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr<at::BFloat16>()); }
bf16* bf16_data_mut(torch::Tensor& t) { return reinterpret_cast<bf16*>(t.data_ptr<at::BFloat16>()); }

void check_bf16(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kBFloat16 && t.is_contiguous(),
              name, ": a contiguous bf16 CPU tensor is needed");
}

#if defined(__AVX512F__)
#include <immintrin.h>
inline __m512 load_bf16x16(const bf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
#endif

// sum_i q[i] * k[i] (q fp32, k bf16), in a fixed order: 16 lanes of fused multiply-adds, then
// their sum in _mm512_reduce_add_ps's order, at every ISA level (lanes.h)
inline float dot_bf16(const float* q, const bf16* k, int64_t d) {
  if (d % 16 == 0) {
#if defined(__AVX512F__)
    __m512 s = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load_bf16x16(k + i), s);
    return _mm512_reduce_add_ps(s);
#else
    float s[16] = {};
    for (int64_t i = 0; i < d; i += 16)
      for (int j = 0; j < 16; ++j) s[j] = std::fma(q[i + j], to_f32(k[i + j]), s[j]);
    return lanes::sum16(s);
#endif
  }
  float s = 0.f;
  for (int64_t i = 0; i < d; ++i) s += q[i] * to_f32(k[i]);
  return s;
}

// acc += p * v (v bf16), fused, as the AVX-512 build does
inline void axpy_bf16(float* acc, float p, const bf16* v, int64_t d) {
#if defined(__AVX512F__)
  if (d % 16 == 0) {
    const __m512 pv = _mm512_set1_ps(p);
    for (int64_t i = 0; i < d; i += 16)
      _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(pv, load_bf16x16(v + i), _mm512_loadu_ps(acc + i)));
    return;
  }
#endif
  for (int64_t i = 0; i < d; ++i) acc[i] = std::fma(p, to_f32(v[i]), acc[i]);
}

inline void scale_row(float* acc, float alpha, int64_t d) {
  for (int64_t i = 0; i < d; ++i) acc[i] *= alpha;
}

}  // namespace

// x [T, N] bf16, residual [T, N] fp32, bf16 or empty -> (RMSNorm(x + residual) * weight in bf16,
// x + residual). The sum takes the residual's dtype: the residual stream the next layer reads stays
// fp32 from the first layer on (as llama.cpp keeps it), or is rounded to bf16 with a bf16 residual.
static void add_rms_norm_rows(const bf16* xp, const float* rf, const bf16* rb, int64_t rows, int64_t n,
                              const bf16* wp, double eps, bf16* op, float* sf, bf16* sb) {
  spin_pool::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> h(n);
    for (int64_t r = begin; r < end; ++r) {
      const bf16* xr = xp + r * n;
      if (rf) {
        const float* rr = rf + r * n;
        float* sr = sf + r * n;
        for (int64_t i = 0; i < n; ++i) sr[i] = h[i] = to_f32(xr[i]) + rr[i];
      } else if (rb) {
        const bf16* rr = rb + r * n;
        bf16* sr = sb + r * n;
        for (int64_t i = 0; i < n; ++i) {
          bf16 s = to_bf16(to_f32(xr[i]) + to_f32(rr[i]));
          sr[i] = s;
          h[i] = to_f32(s);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) h[i] = to_f32(xr[i]);
      }
      // 16 lanes of fused multiply-adds, summed in a fixed order: the same bits at every ISA level
      // (a vectorised reduction's order follows the vector width)
      float part[16] = {};
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) part[j] = std::fma(h[i + j], h[i + j], part[j]);
      float ss = lanes::sum16(part);
      for (; i < n; ++i) ss = std::fma(h[i], h[i], ss);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      bf16* orow = op + r * n;
      for (int64_t i = 0; i < n; ++i) orow[i] = to_bf16(h[i] * inv * to_f32(wp[i]));
    }
  });
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual,
                                        torch::Tensor weight, double eps) {
  check_bf16(x, "x");
  check_bf16(weight, "weight");
  const int64_t rows = x.size(0), n = x.size(1);
  const bool has_res = residual.has_value() && residual->defined();
  const bool f32_res = has_res && residual->scalar_type() == at::kFloat;
  if (f32_res) {
    TORCH_CHECK(residual->device().is_cpu() && residual->is_contiguous() && residual->sizes() == x.sizes(),
                "residual: a contiguous CPU tensor of x's shape is needed");
  } else if (has_res) {
    check_bf16(*residual, "residual");
  }
  auto out = torch::empty_like(x);
  auto sum = has_res ? torch::empty_like(*residual) : x;
  add_rms_norm_rows(bf16_data(x), f32_res ? residual->data_ptr<float>() : nullptr,
                    has_res && !f32_res ? bf16_data(*residual) : nullptr, rows, n, bf16_data(weight), eps,
                    bf16_data_mut(out), f32_res ? sum.data_ptr<float>() : nullptr,
                    has_res && !f32_res ? bf16_data_mut(sum) : nullptr);
  return {out, sum};
}

// qkv [T, (H + 2 Hkv) * D]; cos, sin [P, D / 2] fp32 tables; positions, slots [T] int64;
// k_cache, v_cache [blocks, block_size, Hkv, D]. Writes each token's rotated k and its v into its
// cache slot and returns the rotated q [T, H, D] (neox-style rotate-half RoPE).
torch::Tensor rope_write_kv(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor positions,
                            torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                            int64_t num_heads, int64_t num_kv_heads) {
  check_bf16(qkv, "qkv");
  check_bf16(k_cache, "k_cache");
  check_bf16(v_cache, "v_cache");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous(), "cos, sin: contiguous fp32 tables");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong, "positions, slots: int64");
  const int64_t tokens = qkv.size(0), half = cos.size(1), d = 2 * half;
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * d, "qkv: width does not match the heads");
  TORCH_CHECK(k_cache.size(-1) == d && k_cache.size(-2) == num_kv_heads, "k_cache: [blocks, block_size, Hkv, D]");
  auto q = torch::empty({tokens, num_heads, d}, qkv.options());
  const bf16* in = bf16_data(qkv);
  const float* cp = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  const int64_t* pos = positions.contiguous().data_ptr<int64_t>();
  const int64_t* slot = slots.contiguous().data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "slots: ", slot[t], " outside the cache");
  bf16* qp = bf16_data_mut(q);
  bf16* kp = bf16_data_mut(k_cache);
  bf16* vp = bf16_data_mut(v_cache);
  const int64_t width = (num_heads + 2 * num_kv_heads) * d, kv_row = num_kv_heads * d;
  spin_pool::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* row = in + t * width;
      const float* c = cp + pos[t] * half;
      const float* s = sn + pos[t] * half;
      for (int64_t h = 0; h < num_heads + num_kv_heads; ++h) {
        const bf16* x = row + h * d;
        bf16* y = h < num_heads ? qp + (t * num_heads + h) * d : kp + slot[t] * kv_row + (h - num_heads) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
          y[i] = to_bf16(x1 * c[i] - x2 * s[i]);
          y[i + half] = to_bf16(x2 * c[i] + x1 * s[i]);
        }
      }
      std::memcpy(vp + slot[t] * kv_row, row + (num_heads + num_kv_heads) * d, kv_row * sizeof(bf16));
    }
  });
  return q;
}

// q [B, H, D]; caches [blocks, block_size, Hkv, D]; tables [B, >= blocks used] int64; context [B]
// int64 (tokens incl. the new one) -> [B, H, D]. One task per (sequence, KV head): its query heads
// stream the sequence's blocks in order with an online softmax in fp32.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor tables, torch::Tensor context, double scale) {
  check_bf16(q, "q");
  check_bf16(k_cache, "k_cache");
  check_bf16(v_cache, "v_cache");
  TORCH_CHECK(tables.scalar_type() == at::kLong && context.scalar_type() == at::kLong, "tables, context: int64");
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t block = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  TORCH_CHECK(k_cache.size(3) == d && heads % kv_heads == 0, "q and the caches disagree on heads or head_dim");
  auto tab = tables.contiguous();
  auto ctx = context.contiguous();
  const int64_t width = tab.size(1), num_blocks = k_cache.size(0);
  const int64_t* tp = tab.data_ptr<int64_t>();
  const int64_t* cp = ctx.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(cp[b] >= 1 && cp[b] <= width * block, "context: ", cp[b], " tokens do not fit the block table");
    for (int64_t j = 0; j < (cp[b] + block - 1) / block; ++j)
      TORCH_CHECK(tp[b * width + j] >= 0 && tp[b * width + j] < num_blocks, "tables: block outside the cache");
  }
  auto out = torch::empty_like(q);
  const bf16* qp = bf16_data(q);
  const bf16* kp = bf16_data(k_cache);
  const bf16* vp = bf16_data(v_cache);
  bf16* op = bf16_data_mut(out);
  const float sc = static_cast<float>(scale);
  spin_pool::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(group * d), acc(group * d), score(group * block), m(group), l(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, h = task % kv_heads;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t i = 0; i < d; ++i) qf[g * d + i] = to_f32(qp[(b * heads + h * group + g) * d + i]) * sc;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      const int64_t n = cp[b];
      for (int64_t start = 0; start < n; start += block) {
        const int64_t len = std::min(block, n - start);
        const int64_t base = tp[b * width + start / block] * block;
        for (int64_t j = 0; j < len; ++j) {
          const bf16* k = kp + ((base + j) * kv_heads + h) * d;
          for (int64_t g = 0; g < group; ++g) score[g * block + j] = dot_bf16(qf.data() + g * d, k, d);
        }
        for (int64_t g = 0; g < group; ++g) {
          float mx = m[g];
          for (int64_t j = 0; j < len; ++j) mx = std::max(mx, score[g * block + j]);
          const float alpha = std::exp(m[g] - mx);
          float sum = l[g] * alpha;
          for (int64_t j = 0; j < len; ++j) {
            const float p = std::exp(score[g * block + j] - mx);
            score[g * block + j] = p;
            sum += p;
          }
          scale_row(acc.data() + g * d, alpha, d);
          m[g] = mx;
          l[g] = sum;
        }
        for (int64_t j = 0; j < len; ++j) {
          const bf16* v = vp + ((base + j) * kv_heads + h) * d;
          for (int64_t g = 0; g < group; ++g) axpy_bf16(acc.data() + g * d, score[g * block + j], v, d);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.f / l[g];
        bf16* o = op + (b * heads + h * group + g) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = to_bf16(acc[g * d + i] * inv);
      }
    }
  });
  return out;
}

// x [T, 2 I] (gate | up) -> silu(gate) * up [T, I]
torch::Tensor silu_mul(torch::Tensor x) {
  check_bf16(x, "x");
  const int64_t rows = x.size(0), inter = x.size(1) / 2;
  auto out = torch::empty({rows, inter}, x.options());
  const bf16* xp = bf16_data(x);
  bf16* op = bf16_data_mut(out);
  spin_pool::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* g = xp + r * 2 * inter;
      const bf16* u = g + inter;
      bf16* o = op + r * inter;
      for (int64_t i = 0; i < inter; ++i) {
        const float a = to_f32(g[i]);
        o[i] = to_bf16(a / (1.f + std::exp(-a)) * to_f32(u[i]));
      }
    }
  });
  return out;
}

// cpu_prefill_attention.cpp
torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor table,
                                      int64_t context_len, double scale);

// gguf_matmul.cpp
bool gguf_matmul_available();
std::string gguf_matmul_isa();
torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& codes, const std::vector<torch::Tensor>& s,
                          const std::vector<torch::Tensor>& m, const std::vector<int64_t>& kinds,
                          const c10::optional<torch::Tensor>& bias, bool f32_out);

namespace spin_pool {
Pool& pool() {
  static Pool p([] {
    const char* env = std::getenv("INFERENCE_CPU_THREADS");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : at::get_num_threads();
  }(), [] {
    const char* env = std::getenv("INFERENCE_CPU_SPIN_US");
    return env != nullptr ? std::atoll(env) : 2000LL;
  }());
  return p;
}
}  // namespace spin_pool

int64_t pool_threads() { return spin_pool::pool().size(); }


// One GGUF linear of a decode stack, read from a layer's tensor list (see decode_layers).
struct StackLinear {
  std::vector<torch::Tensor> codes, s, m;
  std::vector<int64_t> kinds;
  c10::optional<torch::Tensor> bias;

  torch::Tensor operator()(const torch::Tensor& x) const { return gguf_linear(x, codes, s, m, kinds, bias, false); }
};

StackLinear read_linear(const std::vector<torch::Tensor>& t, size_t& ti, const std::vector<int64_t>& desc, size_t& di) {
  TORCH_CHECK(di + 2 <= desc.size(), "decode_layers: a layer's description is too short");
  StackLinear l;
  const int64_t segments = desc[di++], has_bias = desc[di++];
  TORCH_CHECK(di + segments <= desc.size() && ti + has_bias + 3 * segments <= t.size(), "decode_layers: a layer's tensors do not match its description");
  if (has_bias) l.bias = t[ti++];
  for (int64_t i = 0; i < segments; ++i) {
    l.kinds.push_back(desc[di++]);
    l.codes.push_back(t[ti++]);
    l.s.push_back(t[ti++]);
    l.m.push_back(t[ti++]);
  }
  return l;
}

// A decode step's decoder layers in one call (every token a decode; dense layers whose linears are
// GGUF blocks): the ops the Python layers call, in the same order, without ~12 Python calls a layer.
// layers[i] = {input norm weight, post-attention norm weight, then per linear (qkv, o, gate_up,
// down): its bias if it has one, then codes, scales, mins per segment}; descs[i] = per linear
// {segments, has bias, kind of each segment}. Returns (hidden, residual) before the final norm.
std::vector<torch::Tensor> decode_layers(torch::Tensor x, const std::vector<std::vector<torch::Tensor>>& layers,
                                         const std::vector<std::vector<int64_t>>& descs,
                                         const std::vector<torch::Tensor>& k_caches,
                                         const std::vector<torch::Tensor>& v_caches, torch::Tensor cos,
                                         torch::Tensor sin, torch::Tensor positions, torch::Tensor slots,
                                         torch::Tensor tables, torch::Tensor context, int64_t num_heads,
                                         int64_t num_kv_heads, double scale, double eps) {
  TORCH_CHECK(k_caches.size() == layers.size() && v_caches.size() == layers.size() && descs.size() == layers.size(),
              "one description and one KV cache pair per layer");
  const int64_t tokens = x.size(0);
  torch::Tensor residual;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& t = layers[i];
    size_t ti = 2, di = 0;
    const StackLinear qkv_proj = read_linear(t, ti, descs[i], di), o_proj = read_linear(t, ti, descs[i], di);
    const StackLinear gate_up = read_linear(t, ti, descs[i], di), down = read_linear(t, ti, descs[i], di);
    TORCH_CHECK(ti == t.size() && di == descs[i].size(), "layer ", i, ": tensors left over after its four linears");
    torch::Tensor h;
    if (i == 0) {
      residual = x.to(at::kFloat);   // the residual stream stays fp32 (CpuRMSNorm does the same)
      h = add_rms_norm(x, c10::nullopt, t[0], eps)[0];
    } else {
      auto r = add_rms_norm(x, residual, t[0], eps);
      h = r[0];
      residual = r[1];
    }
    auto q = rope_write_kv(qkv_proj(h), cos, sin, positions, k_caches[i], v_caches[i], slots, num_heads, num_kv_heads);
    auto a = paged_decode_attention(q, k_caches[i], v_caches[i], tables, context, scale);
    auto post = add_rms_norm(o_proj(a.view({tokens, -1})), residual, t[1], eps);
    residual = post[1];
    x = down(silu_mul(gate_up(post[0])));
  }
  return {x, residual};
}

// The kernels run without the GIL (they touch no Python object): the engine thread's step no longer
// blocks the server's request threads, nor waits for them to hand the GIL back between ops.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_layers", &decode_layers, py::call_guard<py::gil_scoped_release>(), "a decode step's decoder layers in one call");
  m.def("pool_threads", &pool_threads, "threads of the kernels' pool (made on first use)");
  m.def("gguf_matmul_available", &gguf_matmul_available, "gguf_linear runs here (AVX-512 VNNI or AVX2 build)");
  m.def("gguf_matmul_isa", &gguf_matmul_isa, "the ISA level of this build's GGUF kernels");
  m.def("gguf_linear", &gguf_linear, py::call_guard<py::gil_scoped_release>(), "x @ W^T (+ bias) for GGUF blocks, int8 activations; bf16 out, or fp32 with f32_out");
  m.def("add_rms_norm", &add_rms_norm, py::call_guard<py::gil_scoped_release>(), "x (+ residual), RMSNorm, one pass");
  m.def("rope_write_kv", &rope_write_kv, py::call_guard<py::gil_scoped_release>(), "RoPE on q and k, k and v into their cache slots");
  m.def("paged_decode_attention", &paged_decode_attention, py::call_guard<py::gil_scoped_release>(), "decode attention over the paged cache");
  m.def("paged_prefill_attention", &paged_prefill_attention, py::call_guard<py::gil_scoped_release>(), "a prefill chunk's causal attention over the paged cache");
  m.def("silu_mul", &silu_mul, py::call_guard<py::gil_scoped_release>(), "silu(gate) * up");
}
