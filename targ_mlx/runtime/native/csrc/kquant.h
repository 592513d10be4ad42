// K-quant weights as the GGUF file stores them: y = x W^T where each row of W (one output column)
// is K/256 super-blocks of Q4_K (144 bytes: float16 d and dmin, 8 six-bit scales and mins, 256
// nibbles) or Q6_K (210 bytes: 256 six-bit values in ql/qh, 16 int8 scales, float16 d).
//
// Reading the blocks as stored keeps the resident weights at the file's own size and needs no
// repacking (affine 16-column tiles with a float16 scale and bias per 32 take Q6_K's 6.56 bits a
// weight to 9). Used for Q6_K matrices and for embeddings; a Q4_K matrix multiplies faster in
// 4-bit tiles with its own scales (k4tiles.h; qgemm.h on AVX512-VNNI; gguf_blocks.kernel_weights,
// docs/archive/benchmarks-journal.md, "K-quant blocks"), so q4k_row serves only a Q4_K embedding tied as the output
// head. The arithmetic is llama.cpp's Q4_K/Q6_K x Q8_K: activations are quantized to int8 per
// super-block of 256 with one float scale and integer sums per 16, the products of a
// whole super-block are summed in integers (each sub-block's 6-bit scale applied with
// vpmaddwd), and the float fold happens once per 256, not once per 32.
//
// Unlike llama.cpp, which takes one weight row against one activation row, a weight row's
// unpacked nibbles and scales are reused for up to 4 activation rows (prefill), so the unpacking
// and scale shuffles are paid once per 4 rows. Every (row, column) result is computed by the same
// sequence of operations whatever the number of rows beside it, so a row's result does not
// depend on the batch it is in (the skip == Never identity).
//
// AVX512-VNNI builds multiply Q6_K rows with 64 weights a register (q6k_row_vnni: vpmaddubsw,
// then vpdpwssd by the sub-block scales; 1.27x the AVX2 kernel's rate at prefill on a Zen 4 EPYC,
// docs/archive/benchmarks-journal.md, "Where the 1.5B's prefill goes"; TARG_MLX_Q6K_KERNEL=avx2
// runs the other), but
// there a Q6_K matrix is kept in 16-column tiles by default (k6tiles.h, 1.6-2.2x these rows), so
// rows serve embeddings and TARG_MLX_Q6K_LAYOUT=rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pool.h"
#include "qgemm.h"
#include "simd.h"

namespace targ {

constexpr int QK = 256;  // weights per super-block
constexpr int kQ4K = 12, kQ6K = 14;  // GGML type ids

inline int kblock_bytes(int type) { return type == kQ4K ? 144 : 210; }

struct KMat {
  const uint8_t* b;  // N rows of K/256 blocks each
  int N, K, type;
  size_t row_bytes() const { return (size_t)(K / QK) * kblock_bytes(type); }
  const uint8_t* row(int n) const { return b + (size_t)n * row_bytes(); }
};

// Q4_K's 12 bytes of scales and mins -> 8 scales, 8 mins (get_scale_min_k4 in ggml).
inline void k4_scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; j++) {
    sc[j] = s[j] & 63, mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// ---- dequantization (embedding rows; tests) ---------------------------------------------------
// The same float operations, in the same order, as gguf-py's `gguf.quants` (Q4_K: (d*sc)*q -
// dmin*m; Q6_K: (d*sc)*q), so the result is bit-exact: no fused multiply-add may be formed here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
inline void kdequant_row(const KMat& W, int n, float* out) {
  const uint8_t* r = W.row(n);
  for (int s = 0; s < W.K / QK; s++, out += QK) {
    if (W.type == kQ4K) {
      const uint8_t* blk = r + (size_t)s * 144;
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      uint8_t sc[8], mn[8];
      k4_scale_min(blk + 4, sc, mn);
      for (int j = 0; j < 8; j++) {
        volatile float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
        const uint8_t* qs = blk + 16 + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
          volatile float p = ds * (float)((j % 2 ? qs[i] >> 4 : qs[i]) & 0x0f);
          out[32 * j + i] = p - dm;
        }
      }
    } else {
      const uint8_t* blk = r + (size_t)s * 210;
      const uint8_t *ql = blk, *qh = blk + 128;
      const int8_t* sc = (const int8_t*)(blk + 192);
      const float d = f16_at(blk + 208);
      for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
          for (int i = 0; i < 32; i++) {
            const int e = 128 * h + 32 * t + i;
            const uint8_t l = ql[64 * h + 32 * (t % 2) + i];
            const int q = (((t < 2 ? l : l >> 4) & 0x0f) | (((qh[32 * h + i] >> (2 * t)) & 3) << 4)) - 32;
            volatile float ds = d * (float)sc[e / 16];
            out[e] = ds * (float)q;
          }
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

inline void kembed(const KMat& W, const int32_t* ids, int n, float* out) {
  for (int t = 0; t < n; t++) kdequant_row(W, ids[t], out + (size_t)t * W.K);
}

// ---- activations per 256 ----------------------------------------------------------------------
struct Q8K {
  int8_t* q;      // M x K
  float* d;       // M x K/256
  int16_t* bsum;  // M x K/16: sums of 16 consecutive int8 values (Q6_K's sub-blocks)
  int16_t* bsum32;  // M x K/32: sums of 32 (Q4_K's sub-blocks)
  int K, S;
};

inline void quantize_q8k(const float* x, int m0, int m1, Q8K& X) {
  const int K = X.K, S = X.S;
  for (int m = m0; m < m1; m++) {
    for (int s = 0; s < S; s++) {
      const float* xs = x + (size_t)m * K + (size_t)s * QK;
      int8_t* q = X.q + (size_t)m * K + (size_t)s * QK;
      int16_t* bs = X.bsum + (size_t)m * (K / 16) + (size_t)s * 16;
      int16_t* b32 = X.bsum32 + (size_t)m * (K / 32) + (size_t)s * 8;
#if defined(__AVX2__) && defined(__FMA__)
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < QK; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      const float amax = _mm_cvtss_f32(h);
      const __m256 id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      for (int i = 0; i < QK; i += 32) {
        __m256i iv[4];
        for (int j = 0; j < 4; j++) iv[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + i + 8 * j), id));
        for (int j = 0; j < 4; j += 2) {  // sums of 16: two vectors of 8
          __m256i v = _mm256_add_epi32(iv[j], iv[j + 1]);
          __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
          s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
          s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
          bs[i / 16 + j / 2] = (int16_t)_mm_cvtsi128_si32(s4);
        }
        // saturating packs work within 128-bit lanes; the permute restores k order
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i*)(q + i), b);
      }
      X.d[(size_t)m * S + s] = amax / 127.f;
      for (int j = 0; j < 8; j++) b32[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
#else
      float amax = 0.f;
      for (int i = 0; i < QK; i++) amax = std::max(amax, std::fabs(xs[i]));
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) {
          int v = (int)std::nearbyint(xs[i] * id);
          q[i] = (int8_t)std::max(-127, std::min(127, v));
          sum += q[i];
        }
        bs[g] = (int16_t)sum;
      }
      for (int j = 0; j < 8; j++) b32[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
      X.d[(size_t)m * S + s] = amax / 127.f;
#endif
    }
  }
}

// ---- one weight row against MR activation rows ------------------------------------------------
#if defined(__AVX2__) && defined(__FMA__)
inline float khsum(__m256 v) {  // lanes (i, i+4), then pairs, then the last two
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// pshufb mask taking byte j into all 16 lanes (a scale, before widening to 16 bits)
inline __m128i bcast_byte(int j) { return _mm_set1_epi8((char)j); }
// pshufb mask taking 16-bit word j of each 128-bit lane into all 8 words of that lane
inline __m256i bcast_word(int j) { return _mm256_set1_epi16((short)((2 * j + 1) << 8 | 2 * j)); }

// Q4_K's 12 bytes of scales and mins as 8 scale bytes then 8 min bytes, in registers (the
// word trick of ggml's AVX2 kernel; k4_scale_min in scalar form).
inline __m128i k4_scales_mins(const uint8_t* s) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  const uint32_t sc_lo = u[0] & k1, sc_hi = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const uint32_t mn_lo = u[1] & k1, mn_hi = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

template <int MR>
inline void q4k_row(const uint8_t* row, const Q8K& X, int m0, float* out) {
  const int K = X.K, S = X.S;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 facc[MR];
  for (int m = 0; m < MR; m++) facc[m] = _mm256_setzero_ps();
  for (int s = 0; s < S; s++) {
    const uint8_t* blk = row + (size_t)s * 144;
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    const __m128i sm = k4_scales_mins(blk + 4);
    const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // 8 scales as int16, both lanes
    __m256i iacc[MR];
    for (int m = 0; m < MR; m++) iacc[m] = _mm256_setzero_si256();
    const uint8_t* qs = blk + 16;
    for (int c = 0; c < 4; c++) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
      const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      const __m256i sl = _mm256_shuffle_epi8(sc16, bcast_word(2 * c));
      const __m256i sh = _mm256_shuffle_epi8(sc16, bcast_word(2 * c + 1));
      for (int m = 0; m < MR; m++) {
        const int8_t* xq = X.q + (size_t)(m0 + m) * K + (size_t)s * QK + 64 * c;
        const __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)xq)));
        const __m256i ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xq + 32))));
        iacc[m] = _mm256_add_epi32(iacc[m], _mm256_add_epi32(pl, ph));
      }
    }
    for (int m = 0; m < MR; m++) {
      const float dx = X.d[(size_t)(m0 + m) * S + s];
      facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[m]), _mm256_set1_ps(d * dx), facc[m]);
      // the mins: sum_j min_j * (sum of x over sub-block j), four partial sums in the low lanes
      const __m128i b32 = _mm_loadu_si128((const __m128i*)(X.bsum32 + (size_t)(m0 + m) * (K / 32) + (size_t)s * 8));
      const __m256i pm = _mm256_zextsi128_si256(_mm_madd_epi16(mins, b32));
      facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_set1_ps(-dmin * dx), facc[m]);
    }
  }
  for (int m = 0; m < MR; m++) out[m] = khsum(facc[m]);
}

template <int MR>
inline void q6k_row(const uint8_t* row, const Q8K& X, int m0, float* out) {
  const int K = X.K, S = X.S;
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x03), m30 = _mm256_set1_epi8(0x30);
  __m256 facc[MR];
  for (int m = 0; m < MR; m++) facc[m] = _mm256_setzero_ps();
  for (int s = 0; s < S; s++) {
    const uint8_t* blk = row + (size_t)s * 210;
    const uint8_t *ql = blk, *qh = blk + 128;
    const float d = f16_at(blk + 208);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(blk + 192));
    __m256i iacc[MR];
    // values are q - 32: start each sum at -32 * sum_j scale_j * (sum of x over sub-block j), exact
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    for (int m = 0; m < MR; m++) {
      const __m256i bs = _mm256_loadu_si256((const __m256i*)(X.bsum + (size_t)(m0 + m) * (K / 16) + (size_t)s * 16));
      iacc[m] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
    }
    for (int h = 0; h < 2; h++) {
      const __m256i l0 = _mm256_loadu_si256((const __m256i*)(ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256((const __m256i*)(ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256((const __m256i*)(qh + 32 * h));
      __m256i w[4];
      w[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
      w[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
      w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
      for (int t = 0; t < 4; t++) {
        // sub-blocks of 16: the low 128 bits of a chunk take scale 8h+2t, the high ones 8h+2t+1
        const int j = 8 * h + 2 * t;
        const __m128i pair = _mm_unpacklo_epi64(bcast_byte(j), bcast_byte(j + 1));
        const __m256i sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pair));
        for (int m = 0; m < MR; m++) {
          const int8_t* xq = X.q + (size_t)(m0 + m) * K + (size_t)s * QK + 128 * h + 32 * t;
          const __m256i p = _mm256_maddubs_epi16(w[t], _mm256_loadu_si256((const __m256i*)xq));
          iacc[m] = _mm256_add_epi32(iacc[m], _mm256_madd_epi16(sv, p));
        }
      }
    }
    for (int m = 0; m < MR; m++)
      facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[m]), _mm256_set1_ps(d * X.d[(size_t)(m0 + m) * S + s]), facc[m]);
  }
  for (int m = 0; m < MR; m++) out[m] = khsum(facc[m]);
}

#if TARG_VNNI
// Q6_K on AVX512-VNNI: 64 weights a register, two instructions per 64 products and row. A
// super-block's ql (2 x 64 bytes) and qh (2 x 32) unpack to four registers holding its 256
// values in k order: one ql load's low nibbles are k 0-63 of its half, its high nibbles k 64-127,
// and qh's 2-bit fields for them sit at bits 0-1/4-5 (low 256 bits) and 2-3/6-7 (high 256 bits).
// vpmaddubsw makes 16-bit pair sums (at most 2 x 63 x 127: exact) and vpdpwssd multiplies each
// by its sub-block's scale (16-bit lanes 8j..8j+7 of chunk c take scale 4c + j) into int32:
// the AVX2 kernel's vpmaddubsw, vpmaddwd, vpaddd at twice the width, less one instruction.
template <int MR>
inline void q6k_row_vnni(const uint8_t* row, const Q8K& X, int m0, float* out) {
  const int K = X.K, S = X.S;
  const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  const __m512i hshift = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  __m512i sidx[4];  // 16-bit lane l of chunk c <- scale 4c + l / 8
  for (int c = 0; c < 4; c++) {
    alignas(64) int16_t ix[32];
    for (int l = 0; l < 32; l++) ix[l] = (int16_t)(4 * c + l / 8);
    sidx[c] = _mm512_load_si512(ix);
  }
  __m512 facc[MR];
  for (int m = 0; m < MR; m++) facc[m] = _mm512_setzero_ps();
  for (int s = 0; s < S; s++) {
    const uint8_t* blk = row + (size_t)s * 210;
    const uint8_t *ql = blk, *qh = blk + 128;
    const float d = f16_at(blk + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(blk + 192)));
    __m512i w[4], sc[4];
    for (int h = 0; h < 2; h++) {
      const __m512i l = _mm512_loadu_si512(ql + 64 * h);
      const __m512i hb = _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(qh + 32 * h))), hshift);
      w[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi64(hb, 4), m30));
      w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(l, 4), m4), _mm512_and_si512(hb, m30));
    }
    for (int c = 0; c < 4; c++) sc[c] = _mm512_permutexvar_epi16(sidx[c], _mm512_castsi256_si512(sc16));
    const __m256i sc32 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 5);  // -32 * scale: |.| <= 4096
    for (int m = 0; m < MR; m++) {
      // values are q - 32: start at -32 * sum_j scale_j * (sum of x over sub-block j), exact
      const __m256i bs = _mm256_loadu_si256((const __m256i*)(X.bsum + (size_t)(m0 + m) * (K / 16) + (size_t)s * 16));
      __m512i acc = _mm512_zextsi256_si512(_mm256_madd_epi16(sc32, bs));
      const int8_t* xq = X.q + (size_t)(m0 + m) * K + (size_t)s * QK;
      for (int c = 0; c < 4; c++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(w[c], _mm512_loadu_si512(xq + 64 * c)), sc[c]);
      facc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(d * X.d[(size_t)(m0 + m) * S + s]), facc[m]);
    }
  }
  for (int m = 0; m < MR; m++) out[m] = _mm512_reduce_add_ps(facc[m]);
}
#endif
#else
// Portable: the same integer sums per super-block and the same per-256 float fold.
template <int MR>
inline void q4k_row(const uint8_t* row, const Q8K& X, int m0, float* out) {
  for (int m = 0; m < MR; m++) {
    float acc = 0.f, fmin = 0.f;
    for (int s = 0; s < X.S; s++) {
      const uint8_t* blk = row + (size_t)s * 144;
      const float d = f16_at(blk), dmin = f16_at(blk + 2);
      uint8_t sc[8], mn[8];
      k4_scale_min(blk + 4, sc, mn);
      const int8_t* xq = X.q + (size_t)(m0 + m) * X.K + (size_t)s * QK;
      const int16_t* bs = X.bsum + (size_t)(m0 + m) * (X.K / 16) + (size_t)s * 16;
      int isum = 0, msum = 0;
      for (int j = 0; j < 8; j++) {
        const uint8_t* qs = blk + 16 + 32 * (j / 2);
        int sub = 0;
        for (int i = 0; i < 32; i++) sub += ((j % 2 ? qs[i] >> 4 : qs[i]) & 0x0f) * xq[32 * j + i];
        isum += sc[j] * sub;
        msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
      }
      const float dx = X.d[(size_t)(m0 + m) * X.S + s];
      acc = std::fma(d * dx, (float)isum, acc);
      fmin = std::fma(dmin * dx, (float)msum, fmin);
    }
    out[m] = acc - fmin;
  }
}

template <int MR>
inline void q6k_row(const uint8_t* row, const Q8K& X, int m0, float* out) {
  for (int m = 0; m < MR; m++) {
    float acc = 0.f;
    for (int s = 0; s < X.S; s++) {
      const uint8_t* blk = row + (size_t)s * 210;
      const uint8_t *ql = blk, *qh = blk + 128;
      const int8_t* sc = (const int8_t*)(blk + 192);
      const int8_t* xq = X.q + (size_t)(m0 + m) * X.K + (size_t)s * QK;
      int isum = 0;
      for (int e = 0; e < QK; e++) {
        const int h = e / 128, t = (e % 128) / 32, i = e % 32;
        const uint8_t l = ql[64 * h + 32 * (t % 2) + i];
        const int q = (((t < 2 ? l : l >> 4) & 0x0f) | (((qh[32 * h + i] >> (2 * t)) & 3) << 4)) - 32;
        isum += sc[e / 16] * q * xq[e];
      }
      acc = std::fma(f16_at(blk + 208) * X.d[(size_t)(m0 + m) * X.S + s], (float)isum, acc);
    }
    out[m] = acc;
  }
}
#endif

// Which Q6_K kernel runs (one process, one kernel): on AVX512-VNNI builds the 512-bit one unless
// TARG_MLX_Q6K_KERNEL=avx2 asks for the other, to time one against the other on a machine.
inline bool q6k_vnni() {
#if TARG_VNNI
  static const bool v = !env_is("TARG_MLX_Q6K_KERNEL", "avx2");
  return v;
#else
  return false;
#endif
}

inline const char* q6k_kernel_name() {
#if defined(__AVX2__) && defined(__FMA__)
  return q6k_vnni() ? "avx512-vnni" : "avx2";
#else
  return "portable";
#endif
}

template <int MR>
inline void krow(const KMat& W, int n, const Q8K& X, int m0, float* out) {
  if (W.type == kQ4K) q4k_row<MR>(W.row(n), X, m0, out);
#if TARG_VNNI
  else if (q6k_vnni()) q6k_row_vnni<MR>(W.row(n), X, m0, out);
#endif
  else q6k_row<MR>(W.row(n), X, m0, out);
}

#ifndef TARG_KQ_ROWS
#define TARG_KQ_ROWS 4
#endif
constexpr int kKRows = TARG_KQ_ROWS;  // activation rows sharing each unpacked weight row

// Output columns [n0, n1) for all M rows. Activation rows go in blocks whose int8 values stay
// in L2 while the weight rows pass over them; within a block, 16 weight rows at a time stay in
// L1 while every group of 4 activation rows takes them.
inline void kq_rows(const KMat& W, const Q8K& X, int M, int n0, int n1, float* y, int ldy, const float* residual,
                    const float* bias) {
  const int MB = std::max(kKRows, (256 * 1024 / W.K) / kKRows * kKRows), NB = 16;
  float out[kKRows];
  for (int mb = 0; mb < M; mb += MB) {
    const int me = std::min(M, mb + MB);
    for (int nb = n0; nb < n1; nb += NB) {
      const int ne = std::min(n1, nb + NB);
      for (int m = mb; m < me; m += kKRows) {
        const int mr = std::min(kKRows, me - m);
        for (int n = nb; n < ne; n++) {
          with_rows<kKRows>(mr, [&](auto r) { krow<decltype(r)::value>(W, n, X, m, out); });
          for (int i = 0; i < mr; i++) {
            float v = out[i];
            if (bias) v += bias[n];
            if (residual) v += residual[(size_t)(m + i) * ldy + n];
            y[(size_t)(m + i) * ldy + n] = v;
          }
        }
      }
    }
  }
}

// A growing per-thread buffer for the quantized activations (see q8_scratch in qgemm.h).
inline void* kq_scratch(size_t bytes) {
  thread_local std::vector<uint64_t> buf;
  if (buf.size() * 8 < bytes) buf.resize((bytes + 7) / 8);
  return buf.data();
}

// x (M x K) quantized per 256 into this thread's scratch buffer (valid until its next use).
inline Q8K quantize_q8k_scratch(const float* x, int M, int K) {
  Q8K X;
  X.K = K, X.S = K / QK;
  const size_t qbytes = (size_t)M * K, dbytes = (size_t)M * X.S * sizeof(float);
  char* buf = (char*)kq_scratch(qbytes + dbytes + (size_t)M * (K / 16 + K / 32) * sizeof(int16_t) + 64);
  X.q = (int8_t*)buf;
  X.d = (float*)(buf + (qbytes + 63) / 64 * 64);
  X.bsum = (int16_t*)((char*)X.d + dbytes);
  X.bsum32 = X.bsum + (size_t)M * (K / 16);
  if ((long)M * K < (1 << 16)) quantize_q8k(x, 0, M, X);
  else parallel_range(M, 1, 16, [&](int a, int b) { quantize_q8k(x, a, b, X); });
  return X;
}

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual (same layout as y)]
inline void kqgemm(const KMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias) {
  const Q8K X = quantize_q8k_scratch(x, M, W.K);
  auto body = [&](int a, int b) { kq_rows(W, X, M, a, b, y, ldy, residual, bias); };
  if ((long)M * W.N * W.K < (1 << 18)) body(0, W.N);
  else parallel_range(W.N, 16, 16, body);
}

}  // namespace targ
