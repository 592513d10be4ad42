// Intel AMX int8 tiles: the process's permission, the tile shapes the prefill kernels use, and
// two interchangeable tile engines: the hardware's (tile instructions) and a plain C++ one that
// does what those instructions do, so the packing and indexing of the kernels (amx.h) can be
// checked, bit for bit, on every machine.
//
// A tile register holds up to 16 rows of 64 bytes. TDPBSUD C += A B takes A as 16 rows of
// signed bytes (activations: rows m, bytes k) and B as K/4 rows of 64 unsigned bytes where row
// o holds, for each of 16 columns n, the 4 bytes k = 4o .. 4o + 3 (weights): exactly the
// vpdpbusd operand the VNNI kernels already build (w[o] in k4tiles.h, k6tiles.h, qgemm.h), so a
// group's 8 operands stored one after another are its B tile. C[m][n] is the int32 sum over k
// of A[m][k] * B[k][n], the integer dot product the VNNI kernels make lane by lane.
//
// Tile data is off in a Linux process until it asks for it (arch_prctl ARCH_REQ_XCOMP_PERM);
// the grant is per process. The tile configuration is per thread: every thread that runs a tile
// instruction loads it first (a thread without one faults), so each kernel task loads it on
// entry and releases the tiles on exit (leaving no tile state for a context switch to save).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "simd.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if TARG_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AMX_TILE__) && \
    defined(__AMX_INT8__) && defined(__linux__) && !defined(TARG_NO_VNNI) && !defined(TARG_NO_AMX)
#define TARG_AMX 1
#endif

namespace targ {

// ---- permission -------------------------------------------------------------------------------
struct AmxGrant {
  bool ok;
  std::string why;  // for `native info`
};

// Asked once per process (pool() asks before it starts its threads). TARG_MLX_AMX=0 leaves the
// tiles off (to time the VNNI kernels in the same build).
inline const AmxGrant& amx_grant() {
  static const AmxGrant g = []() -> AmxGrant {
#if TARG_AMX
    const char* e = std::getenv("TARG_MLX_AMX");
    if (e && std::strcmp(e, "0") == 0) return {false, "off (TARG_MLX_AMX=0)"};
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0)
      return {false, std::string("off: the kernel refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
                         std::strerror(errno) + "); the VNNI kernels run"};
    return {true, "on: AMX int8 tiles for prefill"};
#else
    return {false, "off: not in this build (its -march has no AMX-INT8 or no AVX512-VNNI)"};
#endif
  }();
  return g;
}

// Which engine the prefill kernels use: 0 the VNNI kernels, 1 AMX tiles, 2 the plain C++ tile
// engine (tests; slow). Set from Python (set_amx) to compare them in one process.
enum AmxMode : int { kAmxOff = 0, kAmxHw = 1, kAmxRef = 2 };
inline std::atomic<int>& amx_mode() {
  static std::atomic<int> m{amx_grant().ok ? kAmxHw : kAmxOff};
  return m;
}

constexpr int kAmxGroupBytes = 512;  // a group of 32 k's B tile: 8 rows x 64 bytes

// ---- tile shapes ------------------------------------------------------------------------------
// tmm0..3: C, 16 rows x 16 int32. tmm4/tmm6: A, 16 rows x KB bytes; tmm5/tmm7: B, KB/4 rows x
// 64 bytes. KB = 32 (a group of 32 k) or 16 (a Q6_K sub-block).
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

inline TileConfig tile_config(int kb) {
  TileConfig c;
  for (int i = 0; i < 4; i++) c.colsb[i] = 64, c.rows[i] = 16;
  for (int i : {4, 6}) c.colsb[i] = (uint16_t)kb, c.rows[i] = 16;
  for (int i : {5, 7}) c.colsb[i] = 64, c.rows[i] = (uint8_t)(kb / 4);
  return c;
}

// ---- the plain C++ engine ---------------------------------------------------------------------
struct RefTiles {
  struct Reg {
    alignas(64) uint8_t b[16][64];
  };
  struct State {
    TileConfig cfg;
    Reg t[8];
  };
  static State& st() {
    thread_local State s;
    return s;
  }
  static void begin(const TileConfig& c) { st().cfg = c; }
  static void end() {}
  template <int T>
  static void zero() {
    std::memset(st().t[T].b, 0, sizeof(Reg));
  }
  template <int T>
  static void load(const void* p, size_t stride) {  // tileloadd: rows x colsb bytes
    State& s = st();
    std::memset(s.t[T].b, 0, sizeof(Reg));
    for (int r = 0; r < s.cfg.rows[T]; r++) std::memcpy(s.t[T].b[r], (const uint8_t*)p + r * stride, s.cfg.colsb[T]);
  }
  // C[m][n] += sum_k s8(A[m][4k + i]) * B[k][4n + i], k < colsb(A) / 4, B unsigned (TDPBSUD) or
  // signed (TDPBSSD)
  template <int C, int A, int B, bool SIGNED_B>
  static void dp() {
    State& s = st();
    for (int m = 0; m < s.cfg.rows[C]; m++)
      for (int n = 0; n < s.cfg.colsb[C] / 4; n++) {
        int32_t acc;
        std::memcpy(&acc, &s.t[C].b[m][4 * n], 4);
        for (int k = 0; k < s.cfg.colsb[A] / 4; k++)
          for (int i = 0; i < 4; i++) {
            const uint8_t b = s.t[B].b[k][4 * n + i];
            acc += (int32_t)(int8_t)s.t[A].b[m][4 * k + i] * (SIGNED_B ? (int32_t)(int8_t)b : (int32_t)b);
          }
        std::memcpy(&s.t[C].b[m][4 * n], &acc, 4);
      }
  }
  template <int T>
  static void store(void* p, size_t stride) {
    State& s = st();
    for (int r = 0; r < s.cfg.rows[T]; r++) std::memcpy((uint8_t*)p + r * stride, s.t[T].b[r], s.cfg.colsb[T]);
  }
};

#if TARG_AMX
// ---- the hardware -----------------------------------------------------------------------------
// GCC's tile intrinsics paste their register number into the instruction text, so each one
// needs a literal: the register is chosen by `if constexpr`.
#define TARG_TILE_EACH(T, OP) \
  if constexpr (T == 0) OP(0);  \
  else if constexpr (T == 1) OP(1); \
  else if constexpr (T == 2) OP(2); \
  else if constexpr (T == 3) OP(3); \
  else if constexpr (T == 4) OP(4); \
  else if constexpr (T == 5) OP(5); \
  else if constexpr (T == 6) OP(6); \
  else OP(7)

struct HwTiles {
  // (GCC 12's _tile_loadconfig names only 8 bytes of the configuration as its input, so the
  // compiler may leave the rest unwritten: the asm names all 64)
  static void begin(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c)); }
  static void end() { _tile_release(); }
  template <int T>
  static void zero() {
#define TARG_OP(n) _tile_zero(n)
    TARG_TILE_EACH(T, TARG_OP);
#undef TARG_OP
  }
  template <int T>
  static void load(const void* p, size_t stride) {
#define TARG_OP(n) _tile_loadd(n, p, (long)stride)
    TARG_TILE_EACH(T, TARG_OP);
#undef TARG_OP
  }
  template <int C, int A, int B, bool SIGNED_B>
  static void dp() {  // C in 0..3, A in {4, 6}, B in {5, 7}, or B = 3 with C < 3
    static_assert(C >= 0 && C < 4 && (A == 4 || A == 6) && (B == 5 || B == 7 || (B == 3 && C < 3)), "tile triple");
#define TARG_DP2(c, a, b)                        \
  if constexpr (SIGNED_B) _tile_dpbssd(c, a, b); \
  else _tile_dpbsud(c, a, b)
#define TARG_DP(c)                                       \
  if constexpr (A == 4 && B == 5) { TARG_DP2(c, 4, 5); } \
  else if constexpr (A == 4 && B == 7) { TARG_DP2(c, 4, 7); } \
  else if constexpr (A == 6 && B == 5) { TARG_DP2(c, 6, 5); } \
  else if constexpr (A == 6 && B == 7) { TARG_DP2(c, 6, 7); } \
  else if constexpr (A == 4) { TARG_DP2(c, 4, 3); }      \
  else { TARG_DP2(c, 6, 3); }
    if constexpr (C == 0) { TARG_DP(0) }
    else if constexpr (C == 1) { TARG_DP(1) }
    else if constexpr (C == 2) { TARG_DP(2) }
    else if constexpr (B != 3) { TARG_DP(3) }
#undef TARG_DP
#undef TARG_DP2
  }
  template <int T>
  static void store(void* p, size_t stride) {
#define TARG_OP(n) _tile_stored(n, p, (long)stride)
    TARG_TILE_EACH(T, TARG_OP);
#undef TARG_OP
  }
#if defined(__AMX_BF16__)
  // C += A B over bfloat16 pairs (TDPBF16PS, float32 sums): C in 0..3, A in {4, 6}, B in {5, 7}
  template <int C, int A, int B>
  static void dpbf16() {
    static_assert(C >= 0 && C < 4 && (A == 4 || A == 6) && (B == 5 || B == 7), "tile triple");
#define TARG_DP2(c)                                                  \
  if constexpr (A == 4 && B == 5) _tile_dpbf16ps(c, 4, 5);           \
  else if constexpr (A == 4 && B == 7) _tile_dpbf16ps(c, 4, 7);      \
  else if constexpr (A == 6 && B == 5) _tile_dpbf16ps(c, 6, 5);      \
  else _tile_dpbf16ps(c, 6, 7)
    if constexpr (C == 0) { TARG_DP2(0); }
    else if constexpr (C == 1) { TARG_DP2(1); }
    else if constexpr (C == 2) { TARG_DP2(2); }
    else { TARG_DP2(3); }
#undef TARG_DP2
  }
#endif
};
#undef TARG_TILE_EACH
#endif

}  // namespace targ
