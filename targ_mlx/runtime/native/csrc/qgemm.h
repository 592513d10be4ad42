// Quantized matrix product y = x W^T for float32 activations and 4- or 8-bit weights.
//
// Weights use the affine scheme of MLX and GGUF Q4_1/Q8_0: w = scale * q + bias per group of 32
// along K. They are stored in tiles of 16 output columns (native/pack.py): for each tile and
// group, the 32 rows k of 16 values each, so one vector load dequantizes w[k, n..n+15] and the
// product is a stream of fused multiply-adds with broadcast activations, as in an sgemm kernel.
// With AVX512-VNNI or AVX2, activations are quantized to int8 per group of 32 and the products
// run in integers (below); elsewhere they stay float32 and y[m, n] is the sequential sum over
// k = 0..K-1. Either way the order of every addition is fixed whatever M is, so a row's result
// does not depend on the batch it is in.
//
// 4-bit tiles hold two rows k per byte: byte (kp, lane) = q[2kp][lane] | q[2kp+1][lane] << 4.
// Q4_K tiles use another nibble order and kernel (k4tiles.h) unless TARG_MLX_Q4K_LAYOUT=tiles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "pool.h"
#include "simd.h"

#if TARG_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && !defined(TARG_NO_VNNI)
#define TARG_VNNI 1
#endif
// int8 activations: VNNI dot products, or AVX2's vpmaddubsw (AVX-512 without VNNI keeps float32)
#if TARG_VNNI || TARG_AVX2
#define TARG_Q8 1
#endif

namespace targ {

constexpr int QG = 32;  // group size along K
constexpr int NT = 16;  // output columns per tile
constexpr int kPrefetch = 4;  // groups ahead in each weight stream (fused and int8 kernels)

// f(std::integral_constant<int, R>{}) with R = rows (1..RB): a block's row count, known at run
// time, as the template argument of a kernel that keeps each row's sums in registers.
template <int RB, class F>
inline void with_rows(int rows, F f) {
  if constexpr (RB > 1)
    if (rows < RB) return with_rows<RB - 1>(rows, f);
  f(std::integral_constant<int, RB>{});
}

// Whether the kernel-choice flag `name` (TARG_MLX_Q4K_LAYOUT, TARG_MLX_Q6K_LAYOUT,
// TARG_MLX_Q6K_KERNEL) is `value`; native/__init__.py rejects values that are neither choice
// before any weights exist, so anything else here means unset.
inline bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, value) == 0;
}

struct QMat {
  const uint8_t* q;    // tiles of NT columns, see above
  const void* scales;  // per (tile, group, lane), float16 or float32; Q4_K tiles (kscale): see group_affine
  const void* biases;
  bool half;
  bool kscale = false;
  bool k4 = false;  // Q4_K tiles in the k4 nibble layout (k4tiles.h), read by k4gemm
  int N, K, bits;
  int tile_bytes() const { return K * NT * bits / 8; }
  int group_bytes() const { return QG * NT * bits / 8; }
};

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, f;
  if (exp == 0) {
    if (mant == 0) f = sign;
    else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; exp--; }
      f = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) f = sign | 0x7f800000u | (mant << 13);
  else f = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  float out;
  std::memcpy(&out, &f, 4);
  return out;
#endif
}

// NT scales (or biases) of one (tile, group) as float32.
inline void load16(const void* base, bool half, size_t idx, float* out) {
  if (!half) {
    std::memcpy(out, (const float*)base + idx, NT * sizeof(float));
    return;
  }
  const uint16_t* h = (const uint16_t*)base + idx;
#if defined(__F16C__) && (TARG_AVX512 || TARG_AVX2)
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h)));
  _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + 8))));
#else
  for (int l = 0; l < NT; l++) out[l] = half_to_float(h[l]);
#endif
}

// Where the scales and biases of tile t, group g start (for prefetching).
inline const char* scales_at(const QMat& W, int t, int g) {
  const size_t G = W.K / QG;
  if (W.kscale) return (const char*)W.scales + (t * G + g) * 2 * NT;
  return (const char*)W.scales + (t * G + g) * NT * (W.half ? 2 : 4);
}
inline const char* biases_at(const QMat& W, int t, int g) {
  const size_t G = W.K / QG;
  if (W.kscale) return (const char*)W.biases + (t * (G / 8) + g / 8) * 2 * NT * 2;
  return (const char*)W.biases + (t * G + g) * NT * (W.half ? 2 : 4);
}

// The scale and bias of the 16 columns of tile t over group g, as float32: stored so (float16 or
// float32), or, for Q4_K tiles (kscale), made from what the file stores: per column and group
// the 6-bit scale and min (a byte each: 16 scales then 16 mins), per column and super-block of 8
// groups the float16 d and dmin (16 d then 16 dmin). scale = d * sc, bias = -(dmin * m), so a
// Q4_K matrix keeps 4.625 bits a weight (the file: 4.5) instead of 5 with float16 scale and bias.
// Returns where the 16 scales and 16 biases are: in W itself when stored as float32 (copying them
// through a buffer measured 1.5x slower at prefill), else converted into s and b.
struct Affine16 {
  const float* s;
  const float* b;
};
inline Affine16 group_affine(const QMat& W, int t, int g, float* s, float* b) {
  if (!W.kscale) {
    const size_t idx = ((size_t)t * (W.K / QG) + g) * NT;
    if (!W.half) return {(const float*)W.scales + idx, (const float*)W.biases + idx};
    load16(W.scales, W.half, idx, s);
    load16(W.biases, W.half, idx, b);
    return {s, b};
  }
  const uint8_t* sm = (const uint8_t*)scales_at(W, t, g);
  const void* dd = biases_at(W, t, g);
#if defined(__F16C__) && (TARG_AVX512 || TARG_AVX2)
  const uint16_t* h = (const uint16_t*)dd;
  const __m256 neg = _mm256_set1_ps(-0.f);
  for (int i = 0; i < NT; i += 8) {  // 8 lanes at a time: bytes to float, times d or dmin
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + NT + i)));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sm + i))));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sm + NT + i))));
    _mm256_storeu_ps(s + i, _mm256_mul_ps(d, sc));
    _mm256_storeu_ps(b + i, _mm256_xor_ps(_mm256_mul_ps(dmin, mn), neg));
  }
  return {s, b};
#else
  float d[NT], dmin[NT];
  load16(dd, true, 0, d);
  load16(dd, true, NT, dmin);
  for (int l = 0; l < NT; l++) {
    s[l] = d[l] * (float)sm[l];
    b[l] = -(dmin[l] * (float)sm[NT + l]);
  }
  return {s, b};
#endif
}

// The quantized value of row k (within its group) of a tile's group, lane l.
inline int qval(const QMat& W, const uint8_t* grp, int k, int l) {
  if (W.bits == 8) return grp[k * NT + l];
  if (W.k4) {  // k4tiles.h: run k / 8, byte 4 l + k % 4, low nibble for k % 8 < 4
    const uint8_t b = grp[64 * (k / 8) + 4 * l + k % 4];
    return (k % 8) < 4 ? (b & 0x0f) : (b >> 4);
  }
  uint8_t b = grp[(k / 2) * NT + l];
  return k % 2 ? b >> 4 : b & 0x0f;
}

// Dequantize one tile (K x NT floats, row k contiguous) -- the same arithmetic as the fused
// kernels below: w = fma(q, scale, bias).
inline void dequant_tile(const QMat& W, int t, float* out) {
  const int G = W.K / QG;
  float s[NT], b[NT];
  for (int g = 0; g < G; g++) {
    const uint8_t* grp = W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes();
    const Affine16 a = group_affine(W, t, g, s, b);
    for (int k = 0; k < QG; k++) {
      float* o = out + (size_t)(g * QG + k) * NT;
#if TARG_AVX512
      if (W.k4) {
        for (int l = 0; l < NT; l++) o[l] = std::fma((float)qval(W, grp, k, l), a.s[l], a.b[l]);
        continue;
      }
      __m512i qi;
      if (W.bits == 8) {
        qi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(grp + k * NT)));
      } else {
        __m128i v = _mm_loadu_si128((const __m128i*)(grp + (k / 2) * NT));
        v = (k % 2) ? _mm_srli_epi16(v, 4) : v;
        qi = _mm512_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0f)));
      }
      _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(qi), _mm512_loadu_ps(a.s), _mm512_loadu_ps(a.b)));
#else
      for (int l = 0; l < NT; l++) o[l] = std::fma((float)qval(W, grp, k, l), a.s[l], a.b[l]);
#endif
    }
  }
}

// y[m, tile columns] for rows [m0, m0 + MT) from a dequantized tile panel (K x NT).
template <int MT>
inline void panel_rows(const float* panel, int K, const float* x, int m0, float* acc_out) {
#if TARG_AVX512
  __m512 acc[MT];
  for (int m = 0; m < MT; m++) acc[m] = _mm512_setzero_ps();
  for (int k = 0; k < K; k++) {
    __m512 w = _mm512_loadu_ps(panel + (size_t)k * NT);
    for (int m = 0; m < MT; m++) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)(m0 + m) * K + k]), w, acc[m]);
  }
  for (int m = 0; m < MT; m++) _mm512_storeu_ps(acc_out + m * NT, acc[m]);
#else
  float acc[MT][NT] = {};
  for (int k = 0; k < K; k++) {
    const float* w = panel + (size_t)k * NT;
    for (int m = 0; m < MT; m++) {
      float xv = x[(size_t)(m0 + m) * K + k];
      for (int l = 0; l < NT; l++) acc[m][l] = std::fma(xv, w[l], acc[m][l]);
    }
  }
  std::memcpy(acc_out, acc, sizeof(acc));
#endif
}

#if TARG_AVX512 || TARG_AVX2
// Cold weights (each decode step streams them all from memory) are read in TT separate places;
// the hardware prefetcher alone leaves the loads waiting on memory, so the kernels ask for the
// group kPrefetch ahead of each stream explicitly. Near a tile's end, the same distance lands in
// the tiles the thread takes next.
template <int BITS, int TT>
inline void prefetch_ahead(const QMat& W, int t0, int g) {
  const int G = W.K / QG;
  for (int j = 0; j < TT; j++) {
    int tg = g + kPrefetch, tt = t0 + j;
    if (tg >= G) tg -= G, tt += TT;
    if (tt * NT >= W.N) continue;
    const char* ahead = (const char*)(W.q + (size_t)tt * W.tile_bytes() + (size_t)tg * W.group_bytes());
    for (int c = 0; c < QG * NT * BITS / 8; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
    _mm_prefetch(scales_at(W, tt, tg), _MM_HINT_T0);
    _mm_prefetch(biases_at(W, tt, tg), _MM_HINT_T0);
  }
}
#endif

#if TARG_AVX512
// Few rows (decode): dequantize in registers and multiply at once, TT tiles side by side so
// the sequential k-sums of different tiles overlap. Same arithmetic, in the same order, as
// dequant_tile + panel_rows.
template <int BITS, int MT, int TT>
inline void fused_tiles(const QMat& W, int t0, const float* x, int m0, float* acc_out /* MT x TT*NT */) {
  const int K = W.K, G = K / QG;
  __m512 acc[MT][TT];
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++) acc[m][j] = _mm512_setzero_ps();
  const __m128i low = _mm_set1_epi8(0x0f);
  for (int g = 0; g < G; g++) {
    __m512 s[TT], b[TT];
    const uint8_t* grp[TT];
    for (int j = 0; j < TT; j++) {
      float sf[NT], bf[NT];
      const Affine16 a = group_affine(W, t0 + j, g, sf, bf);
      s[j] = _mm512_loadu_ps(a.s), b[j] = _mm512_loadu_ps(a.b);
      grp[j] = W.q + (size_t)(t0 + j) * W.tile_bytes() + (size_t)g * W.group_bytes();
    }
    prefetch_ahead<BITS, TT>(W, t0, g);
    const float* xg = x + g * QG;
    if constexpr (BITS == 4) {
      for (int kp = 0; kp < QG / 2; kp++) {
        for (int j = 0; j < TT; j++) {
          __m128i v = _mm_loadu_si128((const __m128i*)(grp[j] + kp * NT));
          __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, low))), s[j], b[j]);
          __m512 w1 = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), low))), s[j], b[j]);
          for (int m = 0; m < MT; m++) {
            const float* xr = xg + (size_t)(m0 + m) * K + 2 * kp;
            acc[m][j] = _mm512_fmadd_ps(_mm512_set1_ps(xr[0]), w0, acc[m][j]);
            acc[m][j] = _mm512_fmadd_ps(_mm512_set1_ps(xr[1]), w1, acc[m][j]);
          }
        }
      }
    } else {
      for (int k = 0; k < QG; k++) {
        for (int j = 0; j < TT; j++) {
          __m512 w = _mm512_fmadd_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(grp[j] + k * NT)))), s[j], b[j]);
          for (int m = 0; m < MT; m++)
            acc[m][j] = _mm512_fmadd_ps(_mm512_set1_ps(xg[(size_t)(m0 + m) * K + k]), w, acc[m][j]);
        }
      }
    }
  }
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++) _mm512_storeu_ps(acc_out + (size_t)m * TT * NT + j * NT, acc[m][j]);
}
#endif

inline void finish(const float* acc, int m, int n0, int cols, float* y, int ldy, const float* residual,
                   const float* bias) {
  float* yr = y + (size_t)m * ldy + n0;
  for (int l = 0; l < cols; l++) {
    float v = acc[l];
    if (bias) v += bias[n0 + l];
    if (residual) v += residual[(size_t)m * ldy + n0 + l];
    yr[l] = v;
  }
}

#if TARG_AVX512 || TARG_AVX2
// Rows [m0, m0 + MT) over tiles [t0, t1), TT tiles at a time, by the tile kernel K (float32 or
// int8 activations X), each finished with bias and residual.
template <class K, int BITS, int MT, int TT, class X>
void tile_rows(const QMat& W, const X& x, int m0, int t0, int t1, float* y, int ldy, const float* residual,
               const float* bias) {
  alignas(64) float acc[MT * TT * NT];
  int t = t0;
  for (; t + TT <= t1; t += TT) {
    K::template run<BITS, MT, TT>(W, t, x, m0, acc);
    for (int m = 0; m < MT; m++) finish(acc + (size_t)m * TT * NT, m0 + m, t * NT, TT * NT, y, ldy, residual, bias);
  }
  for (; t < t1; t++) {
    K::template run<BITS, MT, 1>(W, t, x, m0, acc);
    for (int m = 0; m < MT; m++) finish(acc + (size_t)m * NT, m0 + m, t * NT, NT, y, ldy, residual, bias);
  }
}
#endif

#if TARG_AVX512
struct FusedF32 {
  template <int BITS, int MT, int TT>
  static void run(const QMat& W, int t, const float* x, int m0, float* acc) { fused_tiles<BITS, MT, TT>(W, t, x, m0, acc); }
};

template <int BITS, int MT, int TT>
void fused_rows(const QMat& W, const float* x, int m0, int t0, int t1, float* y, int ldy, const float* residual,
                const float* bias) {
  tile_rows<FusedF32, BITS, MT, TT>(W, x, m0, t0, t1, y, ldy, residual, bias);
}

// All M <= 8 rows in one block, so each weight is read from memory once: more rows share each
// dequantized vector, fewer rows take more tiles side by side (independent sums in flight).
template <int BITS>
void fused(const QMat& W, const float* x, int M, int t0, int t1, float* y, int ldy, const float* residual,
           const float* bias) {
  switch (M) {
    case 1: fused_rows<BITS, 1, 4>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 2: fused_rows<BITS, 2, 4>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 3: fused_rows<BITS, 3, 3>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 4: fused_rows<BITS, 4, 3>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 5: fused_rows<BITS, 5, 2>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 6: fused_rows<BITS, 6, 2>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    case 7: fused_rows<BITS, 7, 2>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
    default: fused_rows<BITS, 8, 2>(W, x, 0, t0, t1, y, ldy, residual, bias); break;
  }
}
#endif

#if TARG_Q8
// ---- int8 activations (AVX512-VNNI with VBMI, or AVX2) ----------------------------------------
//
// As llama.cpp does for Q4_1/Q8_0 weights, each row's activations are quantized per group of 32
// to int8, x ~ d * qx, and the group's dot products run in integers (VNNI: vpdpbusd, 64 byte
// products per instruction; AVX2: vpmaddubsw, 32 byte products into 16-bit pair sums), then
// fold into float: for each output column,
//   y += d * (scale * sum(q * qx) + bias * sum(qx)).
// Integer sums are exact, and the float fold runs group by group in the same order for every
// row, so a row's result still does not depend on the batch it is in. Both ISAs quantize alike
// and fold alike, so they give the same numbers.

struct Q8 {
  const int8_t* q;  // per row and group, in the layout the ISA's tile kernel reads (see quantize_rows)
  float* d;         // M x G: the group's scale
  float* ds;        // M x G: d * sum(qx)
  int K = 0, G = 0;
  bool stream = true;  // few rows: every weight comes from memory once, so the kernels prefetch
};

#if TARG_VNNI
constexpr int kQ8RowBytes = 1;  // int8 bytes stored per activation
#else
constexpr int kQ8RowBytes = 8;  // AVX2: each 4 activations become a 32-byte vpmaddubsw operand
#endif

// A growing per-thread buffer: a prefill's activations would otherwise be a fresh multi-MB
// allocation (page faults and zeroing) for each of the ~120 matmuls of a forward pass.
inline void* q8_scratch(size_t bytes) {
  thread_local std::vector<uint64_t> buf;
  if (buf.size() * 8 < bytes) buf.resize((bytes + 7) / 8);
  return buf.data();
}

#if TARG_VNNI
inline void quantize_rows(const float* x, int m0, int m1, int K, int bits, Q8& X) {
  const int G = K / QG;
  int8_t* qout = (int8_t*)X.q;
  // within 16 bytes: two runs of 8 as even k then odd k (the 4-bit tiles' low and high nibbles)
  const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  for (int m = m0; m < m1; m++) {
    for (int g = 0; g < G; g++) {
      const float* xg = x + (size_t)m * K + g * QG;
      __m512 a0 = _mm512_loadu_ps(xg), a1 = _mm512_loadu_ps(xg + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
      float id = amax > 0.f ? 127.f / amax : 0.f;
      __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, _mm512_set1_ps(id)));
      __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, _mm512_set1_ps(id)));
      __m128i b0 = _mm512_cvtsepi32_epi8(i0), b1 = _mm512_cvtsepi32_epi8(i1);
      if (bits == 4) b0 = _mm_shuffle_epi8(b0, order), b1 = _mm_shuffle_epi8(b1, order);
      int8_t* q = qout + (size_t)m * K + g * QG;
      _mm_storeu_si128((__m128i*)q, b0);
      _mm_storeu_si128((__m128i*)(q + 16), b1);
      float d = amax / 127.f;
      X.d[(size_t)m * G + g] = d;
      X.ds[(size_t)m * G + g] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
  }
}
#else
// The same int8 values as the VNNI quantizer; each 4 of them (a0 a1 a2 a3) are stored as the
// 32-byte operand the AVX2 kernel multiplies a weight register by: 16-bit pairs (a0 a1) in the
// low 128 bits, (a2 a3) in the high. 4-bit weights pair k = 4j, 4j+1 | 4j+2, 4j+3 (a byte's
// two nibbles), 8-bit weights k = 4j, 4j+2 | 4j+1, 4j+3 (two rows interleaved).
inline void quantize_rows(const float* x, int m0, int m1, int K, int bits, Q8& X) {
  const int G = K / QG;
  int8_t* qout = (int8_t*)X.q;
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i spread = bits == 4
      ? _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3)
      : _mm256_setr_epi8(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3);
  for (int m = m0; m < m1; m++) {
    for (int g = 0; g < G; g++) {
      const float* xg = x + (size_t)m * K + g * QG;
      __m256 a[4];
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; i++) a[i] = _mm256_loadu_ps(xg + 8 * i), mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, a[i]));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      float amax = _mm_cvtss_f32(h);
      float id = amax > 0.f ? 127.f / amax : 0.f;
      __m256i iv[4], isum = _mm256_setzero_si256();
      for (int i = 0; i < 4; i++) {
        iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(a[i], _mm256_set1_ps(id)));
        isum = _mm256_add_epi32(isum, iv[i]);
      }
      // saturating packs work within 128-bit lanes: bytes come out as k 0-3 8-11 16-19 24-27 4-7 ...
      __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
      b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      alignas(32) int32_t quads[8];
      _mm256_store_si256((__m256i*)quads, b);
      __m256i* out = (__m256i*)(qout + ((size_t)m * K + g * QG) * kQ8RowBytes);
      for (int j = 0; j < 8; j++) _mm256_storeu_si256(out + j, _mm256_shuffle_epi8(_mm256_set1_epi32(quads[j]), spread));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
      float d = amax / 127.f;
      X.d[(size_t)m * G + g] = d;
      X.ds[(size_t)m * G + g] = d * (float)_mm_cvtsi128_si32(s4);
    }
  }
}
#endif

#if TARG_VNNI
// Byte (16 r + n) -> (4 n + r): 4 stored rows of a tile's 16 columns become 16 lanes of 4
// consecutive rows each, the operand layout of vpdpbusd.
inline __m512i vnni_order() {
  alignas(64) int8_t idx[64];
  for (int n = 0; n < 16; n++)
    for (int r = 0; r < 4; r++) idx[4 * n + r] = (int8_t)(16 * r + n);
  return _mm512_load_si512(idx);
}

// A group's bytes -> 8 vpdpbusd operands: w[i] pairs with activation bytes 4i .. 4i + 3 of the
// group as quantize_rows stores them (also the AMX kernel's B tile, amx.h).
template <int BITS>
inline void q8_operands(const uint8_t* grp, __m512i perm, __m512i* w) {
  if constexpr (BITS == 4) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    for (int i = 0; i < 4; i++) {
      __m512i v = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(grp + 64 * i));
      w[2 * i] = _mm512_and_si512(v, low);
      w[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
  } else {
    for (int i = 0; i < 8; i++) w[i] = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(grp + 64 * i));
  }
}

template <int BITS, int MT, int TT>
inline void q8_tiles(const QMat& W, int t0, const Q8& X, int m0, float* acc_out /* MT x TT*NT */) {
  const int K = W.K, G = K / QG;
  const __m512i perm = vnni_order();
  __m512 acc[MT][TT];
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++) acc[m][j] = _mm512_setzero_ps();
  for (int g = 0; g < G; g++) {
    // at prefill a tile is read by one row block after another from L1/L2: no prefetch there
    if (X.stream) prefetch_ahead<BITS, TT>(W, t0, g);
    for (int j = 0; j < TT; j++) {
      const uint8_t* grp = W.q + (size_t)(t0 + j) * W.tile_bytes() + (size_t)g * W.group_bytes();
      float sf[NT], bf[NT];
      const Affine16 a = group_affine(W, t0 + j, g, sf, bf);
      const __m512 s = _mm512_loadu_ps(a.s), b = _mm512_loadu_ps(a.b);
      __m512i w[8];
      q8_operands<BITS>(grp, perm, w);
      for (int m = 0; m < MT; m++) {
        const int32_t* xq = (const int32_t*)(X.q + (size_t)(m0 + m) * K + g * QG);
        // one chain per row (the MT rows are the sums in flight): integer sums are exact, so
        // their order changes no bit, and the two-chain version's vpaddd is saved
        __m512i acc_i = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++) acc_i = _mm512_dpbusd_epi32(acc_i, w[i], _mm512_set1_epi32(xq[i]));
        const size_t dg = (size_t)(m0 + m) * G + g;
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc_i), s);
        acc[m][j] = _mm512_fmadd_ps(f, _mm512_set1_ps(X.d[dg]), acc[m][j]);
        acc[m][j] = _mm512_fmadd_ps(b, _mm512_set1_ps(X.ds[dg]), acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++) _mm512_storeu_ps(acc_out + (size_t)m * TT * NT + j * NT, acc[m][j]);
}
#else
// AVX2: vpmaddubsw multiplies 32 unsigned weight bytes by 32 signed activation bytes and adds
// adjacent pairs into 16-bit lanes. A 32-byte load of a 4-bit tile holds rows k..k+3 of its 16
// columns; splitting nibbles and interleaving them gives, per column, the pairs (k, k+1) in the
// low 128 bits and (k+2, k+3) in the high. A pair is at most 2 * 15 * 127 = 3810, so a group's 8
// loads sum exactly in 16 bits (30480 < 32767) and widen to 32 bits once per group. 8-bit
// weights are split into nibbles the same way (q = 16 hi + lo), two products per byte.
inline __m256i widen_pairs(__m256i a) {  // 16 x int16 (column c in lanes c and c + 8) -> 8 x int32
  return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(a)),
                          _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a, 1)));
}

template <int BITS, int MT, int TT>
inline void q8_tiles(const QMat& W, int t0, const Q8& X, int m0, float* acc_out /* MT x TT*NT */) {
  const int K = W.K, G = K / QG;
  constexpr int P = BITS == 4 ? 2 : 4;  // 16-bit accumulators per (row, tile): column halves x nibbles
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256 acc[MT][TT][2];
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
  for (int g = 0; g < G; g++) {
    prefetch_ahead<BITS, TT>(W, t0, g);
    __m256i a16[MT][TT][P];
    for (int m = 0; m < MT; m++)
      for (int j = 0; j < TT; j++)
        for (int p = 0; p < P; p++) a16[m][j][p] = _mm256_setzero_si256();
    const __m256i* xg[MT];
    for (int m = 0; m < MT; m++) xg[m] = (const __m256i*)(X.q + ((size_t)(m0 + m) * K + g * QG) * kQ8RowBytes);
    for (int r = 0; r < 8; r++) {  // rows k = 4r .. 4r + 3 of the group
      for (int j = 0; j < TT; j++) {
        const uint8_t* grp = W.q + (size_t)(t0 + j) * W.tile_bytes() + (size_t)g * W.group_bytes();
        if constexpr (BITS == 4) {
          __m256i v = _mm256_loadu_si256((const __m256i*)(grp + 32 * r));
          __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          __m256i wa = _mm256_unpacklo_epi8(lo, hi), wb = _mm256_unpackhi_epi8(lo, hi);
          for (int m = 0; m < MT; m++) {
            const __m256i xv = _mm256_loadu_si256(xg[m] + r);
            a16[m][j][0] = _mm256_add_epi16(a16[m][j][0], _mm256_maddubs_epi16(wa, xv));
            a16[m][j][1] = _mm256_add_epi16(a16[m][j][1], _mm256_maddubs_epi16(wb, xv));
          }
        } else {
          __m256i v0 = _mm256_loadu_si256((const __m256i*)(grp + 64 * r));
          __m256i v1 = _mm256_loadu_si256((const __m256i*)(grp + 64 * r + 32));
          __m256i pa = _mm256_unpacklo_epi8(v0, v1), pb = _mm256_unpackhi_epi8(v0, v1);
          __m256i w[4] = {_mm256_and_si256(pa, low), _mm256_and_si256(pb, low),
                          _mm256_and_si256(_mm256_srli_epi16(pa, 4), low), _mm256_and_si256(_mm256_srli_epi16(pb, 4), low)};
          for (int m = 0; m < MT; m++) {
            const __m256i xv = _mm256_loadu_si256(xg[m] + r);
            for (int p = 0; p < 4; p++) a16[m][j][p] = _mm256_add_epi16(a16[m][j][p], _mm256_maddubs_epi16(w[p], xv));
          }
        }
      }
    }
    for (int j = 0; j < TT; j++) {
      alignas(32) float sf[NT], bf[NT];
      const Affine16 a = group_affine(W, t0 + j, g, sf, bf);
      for (int h = 0; h < 2; h++) {
        const __m256 s = _mm256_loadu_ps(a.s + 8 * h), b = _mm256_loadu_ps(a.b + 8 * h);
        for (int m = 0; m < MT; m++) {
          __m256i isum = widen_pairs(a16[m][j][h]);
          if constexpr (BITS == 8) isum = _mm256_add_epi32(isum, _mm256_slli_epi32(widen_pairs(a16[m][j][h + 2]), 4));
          const size_t dg = (size_t)(m0 + m) * G + g;
          __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), s);
          acc[m][j][h] = _mm256_fmadd_ps(f, _mm256_set1_ps(X.d[dg]), acc[m][j][h]);
          acc[m][j][h] = _mm256_fmadd_ps(b, _mm256_set1_ps(X.ds[dg]), acc[m][j][h]);
        }
      }
    }
  }
  for (int m = 0; m < MT; m++)
    for (int j = 0; j < TT; j++)
      for (int h = 0; h < 2; h++) _mm256_storeu_ps(acc_out + (size_t)m * TT * NT + j * NT + 8 * h, acc[m][j][h]);
}
#endif

struct FusedQ8 {
  template <int BITS, int MT, int TT>
  static void run(const QMat& W, int t, const Q8& X, int m0, float* acc) { q8_tiles<BITS, MT, TT>(W, t, X, m0, acc); }
};

template <int BITS, int MT, int TT>
void q8_rows(const QMat& W, const Q8& X, int m0, int t0, int t1, float* y, int ldy, const float* residual,
             const float* bias) {
  tile_rows<FusedQ8, BITS, MT, TT>(W, X, m0, t0, t1, y, ldy, residual, bias);
}

#if TARG_VNNI
// Rows sharing each weight load at prefill: each row keeps one float sum per tile in a register,
// so more rows spread a tile's unpacking (4 vpermb, 12 masks and shifts, scales per group of 32)
// over more vpdpbusd. SmolLM2's Q4_1 tiles on a Zen 4 (profile_prefill, 256 tokens): 8 rows
// 203 GMAC/s (197 with two chains a row and prefetch at prefill), 12 rows 218,
// 16 rows 224-226, 20 rows 229 (within noise of 16, and near the 32-register limit). -DTARG_Q8_VNNI_ROWS=N builds another.
#ifndef TARG_Q8_VNNI_ROWS
#define TARG_Q8_VNNI_ROWS 16
#endif
constexpr int kQ8Rows = TARG_Q8_VNNI_ROWS;

// Tiles side by side for MT rows: fewer rows take more tiles (independent sums in flight).
template <int BITS, int MT>
constexpr int q8_tiles_across() {
  return MT <= 2 ? 4 : MT <= 4 ? 2 : 1;
}
#else
constexpr int kQ8Rows = 4;  // AVX2 has 16 vector registers: 16-bit sums for 4 rows x 1 tile

// (8-bit weights keep four 16-bit sums per row and tile, so half as many tiles fit)
template <int BITS, int MT>
constexpr int q8_tiles_across() {
  return MT == 1 ? (BITS == 4 ? 4 : 2) : MT == 2 ? (BITS == 4 ? 2 : 1) : 1;
}
#endif

// MT rows (1..kQ8Rows) at m0.
template <int BITS>
void q8_block(const QMat& W, const Q8& X, int MT, int m0, int t0, int t1, float* y, int ldy, const float* residual,
              const float* bias) {
  with_rows<kQ8Rows>(MT, [&](auto r) {
    constexpr int R = decltype(r)::value;
    q8_rows<BITS, R, q8_tiles_across<BITS, R>()>(W, X, m0, t0, t1, y, ldy, residual, bias);
  });
}

// Tiles [t0, t1) for all M rows: up to kQ8Rows rows read each weight once; more rows go in
// blocks of kQ8Rows over each tile while it sits in L1, with the rows' int8 activations blocked
// to stay in L2.
template <int BITS>
void q8_gemm_tiles(const QMat& W, const Q8& X, int M, int t0, int t1, float* y, int ldy, const float* residual,
                   const float* bias) {
  if (M <= kQ8Rows) {
    q8_block<BITS>(W, X, M, 0, t0, t1, y, ldy, residual, bias);
    return;
  }
  const int MB = std::max(kQ8Rows, (256 * 1024 / (W.K * kQ8RowBytes)) / kQ8Rows * kQ8Rows);
  const int G = W.K / QG;
  std::vector<float> sb(W.kscale ? 2 * (size_t)G * NT : 0);
  for (int mb = 0; mb < M; mb += MB) {
    const int me = std::min(M, mb + MB);
    for (int t = t0; t < t1; t++) {
      if (!W.kscale) {
        for (int m = mb; m < me; m += kQ8Rows)
          q8_block<BITS>(W, X, std::min(kQ8Rows, me - m), m, t, t + 1, y, ldy, residual, bias);
        continue;
      }
      // Q4_K tiles: the tile's float scales and biases once, for every block of rows (a view of
      // the tile as affine float32 tiles, whose column 0 is the tile's first column)
      for (int g = 0; g < G; g++) group_affine(W, t, g, sb.data() + (size_t)g * NT, sb.data() + ((size_t)G + g) * NT);
      QMat V = W;
      V.q = W.q + (size_t)t * W.tile_bytes(), V.scales = sb.data(), V.biases = sb.data() + (size_t)G * NT;
      V.half = V.kscale = false, V.N = NT;
      for (int m = mb; m < me; m += kQ8Rows)
        q8_block<BITS>(V, X, std::min(kQ8Rows, me - m), m, 0, 1, y + t * NT, ldy, residual ? residual + t * NT : nullptr,
                       bias ? bias + t * NT : nullptr);
    }
  }
}
#endif

// Rows at or below which the fused kernel runs; above, each tile is dequantized once into a
// panel that every block of 8 rows reuses (prefill). Both give bit-identical rows.
constexpr int kFusedMaxRows = 8;

// Tiles [t0, t1) for all M rows.
inline void qgemm_tiles(const QMat& W, const float* x, int M, int t0, int t1, float* y, int ldy,
                        const float* residual, const float* bias) {
  const int K = W.K;
#if TARG_AVX512
  if (M <= kFusedMaxRows) {
    if (W.bits == 4) fused<4>(W, x, M, t0, t1, y, ldy, residual, bias);
    else fused<8>(W, x, M, t0, t1, y, ldy, residual, bias);
    return;
  }
#endif
  std::vector<float> panel((size_t)K * NT);
  alignas(64) float acc[8 * NT];
  // Rows in blocks that stay in L2 while every tile of the range passes over them.
  const int MB = std::max(8, (256 * 1024 / (K * (int)sizeof(float))) / 8 * 8);
  for (int mb = 0; mb < M; mb += MB) {
    const int me = std::min(M, mb + MB);
    for (int t = t0; t < t1; t++) {
      dequant_tile(W, t, panel.data());
      int m = mb;
      for (; m + 8 <= me; m += 8) {
        panel_rows<8>(panel.data(), K, x, m, acc);
        for (int i = 0; i < 8; i++) finish(acc + i * NT, m + i, t * NT, NT, y, ldy, residual, bias);
      }
      for (; m < me; m++) {
        panel_rows<1>(panel.data(), K, x, m, acc);
        finish(acc, m, t * NT, NT, y, ldy, residual, bias);
      }
    }
  }
}

#if TARG_Q8
// x (M x K) quantized per group of 32 for `bits`-bit tiles, into this thread's scratch buffer.
inline Q8 quantize_q8_scratch(const float* x, int M, int K, int bits) {
  Q8 X;
  X.K = K, X.G = K / QG;
  const size_t qbytes = (size_t)M * K * kQ8RowBytes, gs = (size_t)M * X.G;
  char* buf = (char*)q8_scratch(qbytes + 2 * gs * sizeof(float));
  X.q = (const int8_t*)buf;
  X.d = (float*)(buf + qbytes);
  X.ds = X.d + gs;
  X.stream = M <= kQ8Rows;
  if ((long)M * K < (1 << 16)) quantize_rows(x, 0, M, K, bits, X);
  else parallel_range(M, 1, 16, [&](int a, int b) { quantize_rows(x, a, b, K, bits, X); });
  return X;
}
#endif

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual (same layout as y)]
inline void qgemm(const QMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias) {
  const int tiles = W.N / NT;
  long work = (long)M * W.N * W.K;
#if TARG_Q8
  const Q8 X = quantize_q8_scratch(x, M, W.K, W.bits);
  auto body = [&](int a, int b) {
    if (W.bits == 4) q8_gemm_tiles<4>(W, X, M, a, b, y, ldy, residual, bias);
    else q8_gemm_tiles<8>(W, X, M, a, b, y, ldy, residual, bias);
  };
#else
  auto body = [&](int a, int b) { qgemm_tiles(W, x, M, a, b, y, ldy, residual, bias); };
#endif
  if (work < (1 << 18)) body(0, tiles);
  else parallel_range(tiles, 4, 4, body);
}

}  // namespace targ
