// A prompt's attention on AMX-BF16 tiles: q k^T and p v in TDPBF16PS (bfloat16 operands, float32
// sums), the softmax in float32 (bf16gemm.h's bf16_softmax_row). At 1,024 tokens it runs the
// 1.5B's causal attention ~4.3x and SmolLM2's ~2.4x faster than layers.h's float32 `attention`,
// where attention was 18% and 37% of their prefills (scripts/kernels/bench_prefill_attention.cpp;
// BENCHMARKS.md, row "a prompt's attention on AMX-BF16 tiles").
//
// Which queries take it is the caller's word, not the shape's: the queries of a prompt (a
// prefill, `tiles`), never a decode step or a chunk of guessed tokens, which stay on `attention`.
// So a query's bits depend only on its own position being a prompt's, never on the batch beside
// it, its padding, how the prompt was chunked, or whether its keys are a shared prompt's:
// each query sees exactly `attention`'s key list (KeyList), in the same order, converted to
// bfloat16 once per (row, kv head), and its tile sums run over that list from its start in
// blocks of 32 (keys it does not see weigh exactly 0). What changes is the prompt's numbers
// against the float32 path (a max |difference| of ~1e-2 on outputs of ~3 in the benchmark):
// TARG_MLX_ATTN_BF16=0, or TARG_MLX_AMX=0, gives the float32 path's bits back.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bf16gemm.h"
#include "layers.h"

namespace targ {

#if TARG_AMX_BF16
inline bool attention_tiles_take(int D) {
  static const bool off = env_is("TARG_MLX_ATTN_BF16", "0");
  return !off && (D == 64 || D == 128) && amx_bf16_takes(D);
}

// n keys (pointers kp/vp to D floats each) as the tiles' B operands, n32 columns (zero past n):
// keys as [D / 2][n32] pairs along the head dimension, values as [n32 / 2][D] pairs along the keys.
inline void tile_keys(const float* const* kp, const float* const* vp, int n, int n32, int D, uint16_t* kb, uint16_t* vb) {
  std::fill(kb, kb + (size_t)D * n32, 0);
  std::fill(vb + (size_t)(n / 2) * D * 2, vb + (size_t)D * n32, 0);
  for (int j = 0; j < n; j++) bf16_key_column(kp[j], D, n32, j, reinterpret_cast<uint32_t*>(kb));
  for (int j = 0; j < n; j += 2)
    bf16_value_pair(vp[j], j + 1 < n ? vp[j + 1] : nullptr, D, reinterpret_cast<uint32_t*>(vb) + (size_t)(j / 2) * D);
}

// Up to 16 queries (rows ld_q apart) of one head; query r sees the first nq[r] of the ld keys in
// kb/vb (nq[r] = 0: a padding position, a zero output). Outputs rows ld_o apart.
inline void tile_queries(const float* q, size_t ld_q, int qn, const int* nq, const uint16_t* kb, const uint16_t* vb,
                         int ld, int D, float scale, float* o, size_t ld_o, float* s, uint16_t* pb, uint16_t* qb) {
  int n = 0;
  for (int r = 0; r < qn; r++) n = std::max(n, nq[r]);
  const int n32 = (n + 31) / 32 * 32;
  for (int r = 0; r < 16; r++)
    for (int d = 0; d < D; d += 32)
      _mm512_storeu_si512(qb + (size_t)r * D + d, r < qn ? bf16x32(q + r * ld_q + d) : _mm512_setzero_si512());
  const size_t ks_stride = (size_t)16 * ld * 2;  // a k-step (32 dimensions) of kb
  for (int j = 0; j < n32; j += 32) {
    HwTiles::zero<0>();
    HwTiles::zero<1>();
    for (int ks = 0; ks < D / 32; ks++) {
      HwTiles::load<4>(qb + 32 * ks, D * 2);
      HwTiles::load<5>(kb + ks * ks_stride + (size_t)j * 2, (size_t)ld * 4);
      HwTiles::dpbf16<0, 4, 5>();
      HwTiles::load<7>(kb + ks * ks_stride + (size_t)(j + 16) * 2, (size_t)ld * 4);
      HwTiles::dpbf16<1, 4, 7>();
    }
    HwTiles::store<0>(s + j, (size_t)n32 * 4);
    HwTiles::store<1>(s + j + 16, (size_t)n32 * 4);
  }
  float inv[16];
  for (int r = 0; r < 16; r++) {
    if (r < qn && nq[r] > 0) {
      inv[r] = bf16_softmax_row(s + (size_t)r * n32, nq[r], n32, scale, pb + (size_t)r * n32);
    } else {
      inv[r] = 0.f;
      std::fill(pb + (size_t)r * n32, pb + (size_t)(r + 1) * n32, 0);
    }
  }
  alignas(64) float ot[16 * 128];
  for (int d0 = 0; d0 < D; d0 += 64) {  // 4 C tiles of 16 dimensions a pass
    HwTiles::zero<0>();
    HwTiles::zero<1>();
    HwTiles::zero<2>();
    HwTiles::zero<3>();
    for (int j = 0; j < n32; j += 32) {
      const uint16_t* vj = vb + (size_t)(j / 2) * D * 2 + 2 * d0;
      HwTiles::load<4>(pb + j, (size_t)n32 * 2);
      HwTiles::load<5>(vj, D * 4);
      HwTiles::dpbf16<0, 4, 5>();
      HwTiles::load<7>(vj + 32, D * 4);
      HwTiles::dpbf16<1, 4, 7>();
      HwTiles::load<5>(vj + 64, D * 4);
      HwTiles::dpbf16<2, 4, 5>();
      HwTiles::load<7>(vj + 96, D * 4);
      HwTiles::dpbf16<3, 4, 7>();
    }
    HwTiles::store<0>(ot + d0, D * 4);
    HwTiles::store<1>(ot + d0 + 16, D * 4);
    HwTiles::store<2>(ot + d0 + 32, D * 4);
    HwTiles::store<3>(ot + d0 + 48, D * 4);
  }
  for (int r = 0; r < qn; r++)
    for (int d = 0; d < D; d += 16)
      _mm512_storeu_ps(o + r * ld_o + d, _mm512_mul_ps(_mm512_load_ps(ot + r * D + d), _mm512_set1_ps(inv[r])));
}

// `attention`'s contract (layers.h) for a prompt's queries, on the tiles; false where they do not
// take it (no tiles here, set off, or a head size other than 64 and 128).
inline bool attention_tiles(const float* q, const KV& K, const KV& V, const int32_t* pad, int hole, int B, int Hq, int Hkv,
                            int L, int S, int D, float scale, float* out, const Shared* pre = nullptr) {
  if (!attention_tiles_take(D) || L <= 0) return false;
  const int group = Hq / Hkv, P = pre ? pre->P : 0, qblocks = (L + 15) / 16;
  const long ld_out = (long)Hq * D;
  const KeyList keys{K, V, pad, hole, pre};
  // every (row, kv head)'s keys as the last query sees them (the others see a prefix), once
  const int ld = (P + S + 31) / 32 * 32;
  std::vector<uint16_t> kbuf((size_t)B * Hkv * D * ld), vbuf(kbuf.size());
  std::vector<int> shared_n(B * Hkv);
  parallel_range(B * Hkv, 1, 1, [&](int t0, int t1) {
    std::vector<const float*> kp(P + S), vp(P + S);
    for (int t = t0; t < t1; t++) {
      const int b = t / Hkv, kh = t % Hkv;
      shared_n[t] = keys.gather(b, kh, S - 1, kp.data(), vp.data());
      const int n = keys.visible(b, shared_n[t], S - 1);
      tile_keys(kp.data(), vp.data(), n, ld, D, kbuf.data() + (size_t)t * D * ld, vbuf.data() + (size_t)t * D * ld);
    }
  });
  // blocks of 16 queries, the last ones (which see the most keys) handed out first
  const int tasks = B * Hq * qblocks;
  parallel_range(tasks, 1, 1, [&](int t0, int t1) {
    std::vector<float> s((size_t)16 * ld);
    std::vector<uint16_t> pb((size_t)16 * ld), qb((size_t)16 * D);
    HwTiles::begin(tile_config(64));
    for (int t = t0; t < t1; t++) {
      const int bh = t % (B * Hq), blk = qblocks - 1 - t / (B * Hq), b = bh / Hq, h = bh % Hq, kh = h / group;
      const int i0 = 16 * blk, qn = std::min(16, L - i0), kv = b * Hkv + kh;
      int nq[16];
      for (int r = 0; r < qn; r++) nq[r] = keys.visible(b, shared_n[kv], S - L + i0 + r);
      tile_queries(q + (((size_t)b * Hq + h) * L + i0) * D, D, qn, nq, kbuf.data() + (size_t)kv * D * ld,
                   vbuf.data() + (size_t)kv * D * ld, ld, D, scale, out + ((size_t)b * L + i0) * ld_out + (size_t)h * D, ld_out,
                   s.data(), pb.data(), qb.data());
    }
    HwTiles::end();
  });
  return true;
}
#else
inline bool attention_tiles_take(int) { return false; }
inline bool attention_tiles(const float*, const KV&, const KV&, const int32_t*, int, int, int, int, int, int, int, float, float*,
                            const Shared* = nullptr) {
  return false;
}
#endif

// One attention call: a prompt's queries (`tiles`) on the tiles where they take them, else, and
// every other call, layers.h's float32 `attention`.
inline void attention_of(bool tiles, const float* q, const KV& K, const KV& V, const int32_t* pad, int hole, int B, int Hq,
                         int Hkv, int L, int S, int D, float scale, float* out, const Shared* pre = nullptr) {
  if (!(tiles && attention_tiles(q, K, V, pad, hole, B, Hq, Hkv, L, S, D, scale, out, pre)))
    attention(q, K, V, pad, hole, B, Hq, Hkv, L, S, D, scale, out, pre);
}

}  // namespace targ
