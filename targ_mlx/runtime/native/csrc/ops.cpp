// MLX primitives over the kernels in qgemm.h, layers.h and sampling.h, and their Python bindings.
//
// Each op builds one node of MLX's lazy graph; its eval_cpu allocates the outputs and dispatches
// the kernel on the CPU stream, so these ops mix freely with MLX's own (and run under mx.compile).
// CPU only: on a Mac or an NVIDIA GPU the ordinary mlx-lm model is used instead.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "amx.h"
#include "attn_tiles.h"
#include "bert.h"
#include "bf16gemm.h"
#include "k4tiles.h"
#include "k6tiles.h"
#include "kquant.h"
#include "layers.h"
#include "qgemm.h"
#include "sampling.h"

namespace nb = nanobind;
namespace mx = mlx::core;
using mx::array;

namespace {

mx::Stream cpu_stream() { return mx::default_stream(mx::Device::cpu); }

// A float32 view of an evaluated array in row-major order: its own buffer when already
// row-contiguous, else a gathered copy owned by `hold`.
const float* contiguous_f32(const array& a, std::shared_ptr<std::vector<float>>& hold) {
  if (a.flags().row_contiguous) return a.data<float>();
  hold = std::make_shared<std::vector<float>>(a.size());
  const float* base = a.data<float>();
  const int nd = a.ndim();
  std::vector<int64_t> idx(nd, 0);
  for (size_t i = 0; i < a.size(); i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * a.strides()[d];
    (*hold)[i] = base[off];
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < a.shape(d)) break;
      idx[d] = 0;
    }
  }
  return hold->data();
}

void alloc(array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

// A node's arrays as its dispatched task holds them, the way MLX's own CPU ops hand them over:
// copies that view the buffers without owning them (the task runs later, on the stream thread).
std::vector<array> weak(const std::vector<array>& arrays) {
  std::vector<array> out;
  out.reserve(arrays.size());
  for (auto& a : arrays) out.push_back(array::unsafe_weak_copy(a));
  return out;
}

targ::QMat qmat(const array& q, const array& scales, const array& biases, int bits) {
  targ::QMat w;
  w.q = q.data<uint8_t>();
  w.scales = scales.data<void>();
  w.biases = biases.data<void>();
  w.half = scales.dtype() == mx::float16;
  w.kscale = scales.dtype() == mx::uint8;  // Q4_K tiles: 6-bit scales and mins, float16 d and dmin
  w.k4 = w.kscale && targ::q4k_k4();        // ... in the k4 layout in this process (k4tiles.h)
  w.N = q.shape(0);
  w.K = q.shape(1) * 8 / bits;
  w.bits = bits;
  return w;
}

void check_packed(const array& q, const array& scales, const array& biases, int bits, const char* op) {
  if (bits != 4 && bits != 6 && bits != 8) throw std::invalid_argument(std::string(op) + ": bits must be 4, 6 or 8");
  if (q.dtype() != mx::uint8 || q.ndim() != 2)
    throw std::invalid_argument(std::string(op) + ": packed weights must be a 2-D uint8 array (targ_mlx.native.pack)");
  int K = q.shape(1) * 8 / bits;
  if (K % targ::QG || q.shape(0) % targ::NT)
    throw std::invalid_argument(std::string(op) + ": K must be a multiple of 32 and N of 16");
  if (bits == 6 || scales.dtype() == mx::int8) {  // Q6_K tiles (k6tiles.h)
    if (!targ::kQ6KTiles) throw std::invalid_argument(std::string(op) + ": Q6_K tiles run on AVX512-VNNI builds only");
    if (bits != 6 || K % 256 || scales.dtype() != mx::int8 || biases.dtype() != mx::float16 || scales.ndim() != 2 ||
        biases.ndim() != 2 || scales.shape(0) != q.shape(0) || scales.shape(1) != K / 16 || biases.shape(0) != q.shape(0) ||
        biases.shape(1) != K / 256)
      throw std::invalid_argument(std::string(op) + ": Q6_K tiles need 6 bits, int8 scales (N, K/16) and float16 d (N, K/256)");
    return;
  }
  if (scales.dtype() == mx::uint8) {  // Q4_K tiles (qgemm.h, group_affine)
    if (bits != 4 || K % 256 || biases.dtype() != mx::float16 || scales.ndim() != 2 || biases.ndim() != 2 ||
        scales.shape(0) != q.shape(0) || scales.shape(1) != 2 * (K / targ::QG) || biases.shape(0) != q.shape(0) ||
        biases.shape(1) != 2 * (K / 256))
      throw std::invalid_argument(std::string(op) + ": Q4_K tiles need 4 bits, uint8 scales (N, 2K/32) and float16 "
                                  "d/dmin (N, 2K/256)");
    return;
  }
  if (scales.dtype() != biases.dtype() || (scales.dtype() != mx::float16 && scales.dtype() != mx::float32))
    throw std::invalid_argument(std::string(op) + ": scales and biases must both be float16 or float32");
  if (scales.ndim() != 2 || scales.shape(0) != q.shape(0) || scales.shape(1) != K / targ::QG ||
      biases.shape() != scales.shape())
    throw std::invalid_argument(std::string(op) + ": scales/biases must be (N, K/32)");
}

// K-quant blocks as stored (kquant.h): blocks is (N, K/256 * block bytes) uint8, type a GGML id.
int kblocks_K(const array& blocks, int type) { return blocks.shape(1) / targ::kblock_bytes(type) * targ::QK; }

targ::KMat kmat(const array& blocks, int type) {
  targ::KMat w;
  w.b = blocks.data<uint8_t>();
  w.type = type;
  w.N = blocks.shape(0);
  w.K = kblocks_K(blocks, type);
  return w;
}

void check_kblocks(const array& blocks, int type, const char* op) {
  if (type != targ::kQ4K && type != targ::kQ6K)
    throw std::invalid_argument(std::string(op) + ": type must be 12 (Q4_K) or 14 (Q6_K)");
  if (blocks.dtype() != mx::uint8 || blocks.ndim() != 2 || blocks.shape(1) % targ::kblock_bytes(type))
    throw std::invalid_argument(std::string(op) + ": blocks must be a 2-D uint8 array of whole super-blocks per row");
}

array as_f32(const array& x) { return x.dtype() == mx::float32 ? x : mx::astype(x, mx::float32, cpu_stream()); }

#define TARG_PRIMITIVE_COMMON(NAME)                                                     \
  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {            \
    throw std::runtime_error(#NAME " runs on the CPU only");                          \
  }                                                                                   \
  const char* name() const override { return #NAME; }

// ---------------------------------------------------------------------------------------------
// A matrix's form: bits (4, 6 or 8) for 16-column tiles (arrays q, scales, biases), or the GGML
// type (12 or 14) for K-quant blocks as stored (array blocks).
bool is_kquant(int form) { return form == targ::kQ4K || form == targ::kQ6K; }
int weight_arrays(int form) { return is_kquant(form) ? 1 : 3; }  // blocks, or q + scales + biases
int weight_K(int form, const array* w) { return is_kquant(form) ? kblocks_K(w[0], form) : w[0].shape(1) * 8 / form; }

// Float32 scratch from MLX's allocator (its buffer cache makes a decode step's reuse cheap).
struct Scratch {
  mx::allocator::Data d;
  float* p;
  explicit Scratch(size_t n) : d(mx::allocator::malloc(std::max<size_t>(n, 1) * sizeof(float))),
                               p(static_cast<float*>(d.buffer().raw_ptr())) {}
};

// out (M x N) = x (M x K) W^T (+ bias) (+ res) for W in `form` given by its arrays w[0..]: the one
// place a matrix product is chosen, for QLinear and the fused blocks below. `swiglu`: W is
// gate|up and out (M x N / 2) its SwiGLU (no bias or residual): on AMX tiles the product finishes
// so (amx.h), elsewhere it is the product and then the SwiGLU op's kernel, the same bits.
void linear_rows(int form, const array* w, const float* x, int M, float* out, const float* res, const float* bias,
                 bool swiglu = false) {
  if (swiglu) {
    if (!is_kquant(form)) {
      targ::QMat W = qmat(w[0], w[1], w[2], form);
      if (targ::amx_takes(W, M) && W.N % (2 * targ::NT) == 0) return targ::amx_gemm(W, x, M, out, W.N / 2, nullptr, nullptr, true);
    }
    const int N = w[0].shape(0);
    Scratch gu((size_t)M * N);
    linear_rows(form, w, x, M, gu.p, nullptr, nullptr);
    targ::swiglu(gu.p, M, N / 2, out);
    return;
  }
  if (is_kquant(form)) {
    targ::KMat W = kmat(w[0], form);
    targ::kqgemm(W, x, M, out, W.N, res, bias);
    return;
  }
  targ::QMat W = qmat(w[0], w[1], w[2], form);
  if (targ::amx_takes(W, M)) targ::amx_gemm(W, x, M, out, W.N, res, bias);
  else if (W.bits == 6) targ::k6gemm(W, x, M, out, W.N, res, bias);
  else if (W.k4) targ::k4gemm(W, x, M, out, W.N, res, bias);
  else targ::qgemm(W, x, M, out, W.N, res, bias);
}

// y = x W^T (+ bias) (+ residual) for W in either form.
class QLinear : public mx::Primitive {
 public:
  QLinear(mx::Stream s, int form, bool has_bias, bool has_res, bool swiglu = false)
      : Primitive(s), form_(form), bias_(has_bias), res_(has_res), swiglu_(swiglu) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    array& out = outs[0];
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in);
    enc.dispatch([ins = std::move(ins), out = array::unsafe_weak_copy(out), form = form_, hb = bias_, hr = res_,
                  sw = swiglu_]() mutable {
      std::shared_ptr<std::vector<float>> hx, hr_;
      const array& x = ins[0];
      const float* xp = contiguous_f32(x, hx);
      const int nw = weight_arrays(form);  // weight inputs after x
      const float* bias = hb ? ins[1 + nw].data<float>() : nullptr;
      const float* res = hr ? contiguous_f32(ins[1 + nw + hb], hr_) : nullptr;
      linear_rows(form, &ins[1], xp, (int)(x.size() / weight_K(form, &ins[1])), out.data<float>(), res, bias, sw);
    });
  }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const QLinear&>(o);
    return form_ == p.form_ && bias_ == p.bias_ && res_ == p.res_ && swiglu_ == p.swiglu_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override {
    auto s = in[0].shape();
    s.back() = in[1].shape(0) / (swiglu_ ? 2 : 1);
    return {s};
  }
  TARG_PRIMITIVE_COMMON(TargQLinear)
 private:
  int form_;
  bool bias_, res_, swiglu_;
};

// x as float32 with K columns, plus the optional bias and residual, as QLinear's inputs.
array qlinear_node(const char* op, const array& x_, int K, int N, std::vector<array> weights, int form,
                   std::optional<array> bias, std::optional<array> residual, bool swiglu = false) {
  if (swiglu && (bias || residual || N % 2))
    throw std::invalid_argument(std::string(op) + ": swiglu=True takes a gate|up matrix (an even N) with no bias or residual");
  array x = as_f32(x_);
  if (x.ndim() < 1 || x.shape(-1) != K) {
    std::ostringstream m;
    m << op << ": input's last dimension is " << (x.ndim() ? x.shape(-1) : 0) << ", the weights expect " << K;
    throw std::invalid_argument(m.str());
  }
  auto shape = x.shape();
  shape.back() = N;
  auto out_shape = shape;
  if (swiglu) out_shape.back() = N / 2;
  std::vector<array> ins = {x};
  ins.insert(ins.end(), weights.begin(), weights.end());
  if (bias) ins.push_back(as_f32(*bias));
  if (residual) {
    if (residual->shape() != shape) throw std::invalid_argument(std::string(op) + ": residual must have the output's shape");
    ins.push_back(as_f32(*residual));
  }
  return array(out_shape, mx::float32,
               std::make_shared<QLinear>(cpu_stream(), form, bias.has_value(), residual.has_value(), swiglu), ins);
}

array op_qlinear(const array& x, const array& q, const array& scales, const array& biases, int bits,
                 std::optional<array> bias, std::optional<array> residual, bool swiglu) {
  check_packed(q, scales, biases, bits, "qlinear");
  return qlinear_node("qlinear", x, q.shape(1) * 8 / bits, q.shape(0), {q, scales, biases}, bits, bias, residual, swiglu);
}

array op_kqlinear(const array& x, const array& blocks, int type, std::optional<array> bias, std::optional<array> residual,
                  bool swiglu) {
  check_kblocks(blocks, type, "kqlinear");
  return qlinear_node("kqlinear", x, kblocks_K(blocks, type), blocks.shape(0), {blocks}, type, bias, residual, swiglu);
}


// ---------------------------------------------------------------------------------------------
class RMSNorm : public mx::Primitive {
 public:
  RMSNorm(mx::Stream s, float eps, bool add) : Primitive(s), eps_(eps), add_(add) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    for (auto& o : outs) alloc(o);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in), os = weak(outs);
    enc.dispatch([ins = std::move(ins), os = std::move(os), eps = eps_, add = add_]() mutable {
      std::shared_ptr<std::vector<float>> h1, h2;
      const float* x = contiguous_f32(ins[0], h1);
      const float* r = add ? contiguous_f32(ins[1], h2) : nullptr;
      const array& w = ins[add ? 2 : 1];
      int H = ins[0].shape(-1), rows = (int)(ins[0].size() / H);
      float* h = add ? os[0].data<float>() : nullptr;
      float* y = os[add ? 1 : 0].data<float>();
      targ::rms_norm(x, r, w.data<float>(), eps, rows, H, h, y);
    });
  }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const RMSNorm&>(o);
    return eps_ == p.eps_ && add_ == p.add_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override {
    return add_ ? std::vector<mx::Shape>{in[0].shape(), in[0].shape()} : std::vector<mx::Shape>{in[0].shape()};
  }
  TARG_PRIMITIVE_COMMON(TargRMSNorm)
 private:
  float eps_;
  bool add_;
};

void check_norm(const array& x, const array& w) {
  if (w.ndim() != 1 || x.ndim() < 1 || w.shape(0) != x.shape(-1))
    throw std::invalid_argument("rms_norm: weight must be 1-D with the input's last dimension");
}

array op_rms_norm(const array& x_, const array& w, float eps) {
  array x = as_f32(x_);
  check_norm(x, w);
  return array(x.shape(), mx::float32, std::make_shared<RMSNorm>(cpu_stream(), eps, false), {x, as_f32(w)});
}

std::tuple<array, array> op_add_rms_norm(const array& x_, const array& r_, const array& w, float eps) {
  array x = as_f32(x_), r = as_f32(r_);
  check_norm(x, w);
  if (r.shape() != x.shape()) throw std::invalid_argument("add_rms_norm: x and r must have the same shape");
  auto outs = array::make_arrays({x.shape(), x.shape()}, {mx::float32, mx::float32},
                                 std::make_shared<RMSNorm>(cpu_stream(), eps, true), {x, r, as_f32(w)});
  return {outs[0], outs[1]};
}

// ---------------------------------------------------------------------------------------------
class RopeTable : public mx::Primitive {
 public:
  RopeTable(mx::Stream s, int B, int L, float scale) : Primitive(s), B_(B), L_(L), scale_(scale) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    for (auto& o : outs) alloc(o);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([pos = array::unsafe_weak_copy(in[0]), f = array::unsafe_weak_copy(in[1]),
                  c = array::unsafe_weak_copy(outs[0]), s = array::unsafe_weak_copy(outs[1]), B = B_, L = L_,
                  scale = scale_]() mutable {
      targ::rope_table(pos.data<int32_t>(), (int)pos.size(), B, L, f.data<float>(), (int)f.size(), scale,
                       c.data<float>(), s.data<float>());
    });
  }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const RopeTable&>(o);
    return B_ == p.B_ && L_ == p.L_ && scale_ == p.scale_;
  }
  TARG_PRIMITIVE_COMMON(TargRopeTable)
 private:
  int B_, L_;
  float scale_;
};

std::tuple<array, array> op_rope_table(const array& pos, const array& inv_freq, int B, int L, float scale) {
  array p = mx::contiguous(mx::astype(mx::reshape(pos, {-1}, cpu_stream()), mx::int32, cpu_stream()), false, cpu_stream());
  if (p.size() != 1 && (int)p.size() != B) throw std::invalid_argument("rope_table: positions must have 1 or B entries");
  mx::Shape sh = {B, L, (int)inv_freq.size()};
  auto outs = array::make_arrays({sh, sh}, {mx::float32, mx::float32}, std::make_shared<RopeTable>(cpu_stream(), B, L, scale),
                                 {p, mx::contiguous(as_f32(inv_freq), false, cpu_stream())});
  return {outs[0], outs[1]};
}

class RopeSplit : public mx::Primitive {
 public:
  RopeSplit(mx::Stream s, int hq, int hkv, int d, bool trad) : Primitive(s), hq_(hq), hkv_(hkv), d_(d), trad_(trad) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    for (auto& o : outs) alloc(o);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = array::unsafe_weak_copy(in[0]), c = array::unsafe_weak_copy(in[1]), s = array::unsafe_weak_copy(in[2]),
                  q = array::unsafe_weak_copy(outs[0]), k = array::unsafe_weak_copy(outs[1]),
                  v = array::unsafe_weak_copy(outs[2]), hq = hq_, hkv = hkv_, d = d_, trad = trad_]() mutable {
      std::shared_ptr<std::vector<float>> h;
      const float* xp = contiguous_f32(x, h);
      int B = x.shape(0), L = x.shape(1);
      targ::rope_split(xp, B, L, hq, hkv, d, c.data<float>(), s.data<float>(), c.shape(2), trad, q.data<float>(),
                       k.data<float>(), v.data<float>());
    });
  }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const RopeSplit&>(o);
    return hq_ == p.hq_ && hkv_ == p.hkv_ && d_ == p.d_ && trad_ == p.trad_;
  }
  TARG_PRIMITIVE_COMMON(TargRopeSplit)
 private:
  int hq_, hkv_, d_;
  bool trad_;
};

std::tuple<array, array, array> op_rope_split(const array& qkv_, const array& cos_t, const array& sin_t, int n_heads,
                                           int n_kv_heads, int head_dim, bool traditional) {
  array qkv = as_f32(qkv_);
  if (qkv.ndim() != 3 || qkv.shape(2) != (n_heads + 2 * n_kv_heads) * head_dim)
    throw std::invalid_argument("rope_split: qkv must be (B, L, (n_heads + 2 n_kv_heads) * head_dim)");
  int B = qkv.shape(0), L = qkv.shape(1);
  if (cos_t.ndim() != 3 || cos_t.shape(0) != B || cos_t.shape(1) != L || 2 * cos_t.shape(2) > head_dim)
    throw std::invalid_argument("rope_split: cos/sin tables must be (B, L, rope_dims / 2)");
  mx::Shape qs = {B, n_heads, L, head_dim}, ks = {B, n_kv_heads, L, head_dim};
  auto outs = array::make_arrays({qs, ks, ks}, {mx::float32, mx::float32, mx::float32},
                                 std::make_shared<RopeSplit>(cpu_stream(), n_heads, n_kv_heads, head_dim, traditional),
                                 {qkv, cos_t, sin_t});
  return {outs[0], outs[1], outs[2]};
}

// ---------------------------------------------------------------------------------------------
class SwiGLU : public mx::UnaryPrimitive {
 public:
  explicit SwiGLU(mx::Stream s) : UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = array::unsafe_weak_copy(in[0]), out = array::unsafe_weak_copy(out)]() mutable {
      std::shared_ptr<std::vector<float>> h;
      const float* xp = contiguous_f32(x, h);
      int I = out.shape(-1), rows = (int)(out.size() / I);
      targ::swiglu(xp, rows, I, out.data<float>());
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargSwiGLU runs on the CPU only"); }
  const char* name() const override { return "TargSwiGLU"; }
  bool is_equivalent(const Primitive&) const override { return true; }
};

array op_swiglu(const array& gu_) {
  array gu = as_f32(gu_);
  if (gu.ndim() < 1 || gu.shape(-1) % 2) throw std::invalid_argument("swiglu: last dimension must be even ([gate | up])");
  auto s = gu.shape();
  s.back() /= 2;
  return array(s, mx::float32, std::make_shared<SwiGLU>(cpu_stream()), {gu});
}

// ---------------------------------------------------------------------------------------------
// A decoder layer's two halves around its attention (pre_run, post_run), for DecoderLayer below:
// the same kernels on the same inputs in the same order as the separate ops (rms_norm, QLinear,
// RopeSplit; QLinear, RMSNorm, SwiGLU), so the same bits.
//
// Matrices come as parts (q|k in Q4_K and v in Q6_K, say): a part's form and arrays as QLinear's.
// One part takes the bias inside its product; several are concatenated and the bias added after,
// as the model's separate ops do.


// y (M x sum N_i) = [x W_1^T | x W_2^T | ...] (+ bias); parts' arrays start at w.
void parts_rows(const std::vector<int>& forms, const array* w, const float* x, int M, int N, float* y, const float* bias) {
  if (forms.size() == 1) {
    linear_rows(forms[0], w, x, M, y, nullptr, bias);
    return;
  }
  int col = 0;
  for (int form : forms) {
    int n = w[0].shape(0);
    Scratch t((size_t)M * n);
    linear_rows(form, w, x, M, t.p, nullptr, nullptr);
    for (int r = 0; r < M; r++) std::copy(t.p + (size_t)r * n, t.p + (size_t)(r + 1) * n, y + (size_t)r * N + col);
    col += n;
    w += weight_arrays(form);
  }
  if (bias)
    for (int r = 0; r < M; r++)
      for (int j = 0; j < N; j++) y[(size_t)r * N + j] += bias[j];
}

int parts_arrays(const std::vector<int>& forms) {
  int n = 0;
  for (int f : forms) n += weight_arrays(f);
  return n;
}

// Checks each part against the input width K; returns the parts' total output width.
int check_parts(const char* op, const std::vector<int>& forms, const std::vector<array>& w, int K) {
  if (forms.empty() || (int)w.size() != parts_arrays(forms))
    throw std::invalid_argument(std::string(op) + ": each part needs its arrays (1 for K-quant blocks, 3 for tiles)");
  int N = 0;
  const array* p = w.data();
  for (int f : forms) {
    if (is_kquant(f)) check_kblocks(p[0], f, op);
    else check_packed(p[0], p[1], p[2], f, op);
    if (weight_K(f, p) != K) {
      std::ostringstream m;
      m << op << ": a part expects " << weight_K(f, p) << " inputs, the layer has " << K;
      throw std::invalid_argument(m.str());
    }
    N += p[0].shape(0);
    p += weight_arrays(f);
  }
  return N;
}

// rms_norm -> q|k|v parts (+ bias) -> RoPE and split, over inputs x, norm, parts..., [bias], cos,
// sin (`in`), into q (B, hq, L, d) and k, v (B, hkv, L, d).
struct PreSpec {
  float eps;
  std::vector<int> forms;
  bool bias;
  int hq, hkv, d;
  bool trad;
  bool operator==(const PreSpec&) const = default;
  int inputs() const { return 2 + parts_arrays(forms) + bias + 2; }
};

void pre_run(const PreSpec& p, const array* in, float* q, float* k, float* v) {
  std::shared_ptr<std::vector<float>> hx;
  const array& x = in[0];
  const int B = x.shape(0), L = x.shape(1), H = x.shape(2), M = B * L, N = (p.hq + 2 * p.hkv) * p.d;
  const int at = 2 + parts_arrays(p.forms);
  Scratch xn((size_t)M * H), qkv((size_t)M * N);
  targ::rms_norm(contiguous_f32(x, hx), nullptr, in[1].data<float>(), p.eps, M, H, nullptr, xn.p);
  parts_rows(p.forms, &in[2], xn.p, M, N, qkv.p, p.bias ? in[at].data<float>() : nullptr);
  const array &c = in[at + p.bias], &s = in[at + p.bias + 1];
  targ::rope_split(qkv.p, B, L, p.hq, p.hkv, p.d, c.data<float>(), s.data<float>(), c.shape(2), p.trad, q, k, v);
}

// pre_run's inputs for x (B, L, hidden), checked (`op` names the caller in errors).
std::vector<array> pre_inputs(const char* op, const array& x, const array& norm, const std::vector<int>& forms,
                              const std::vector<array>& weights, const std::optional<array>& bias, const array& cos_t,
                              const array& sin_t, int n_heads, int n_kv_heads, int head_dim) {
  if (x.ndim() != 3) throw std::invalid_argument(std::string(op) + ": x must be (B, L, hidden)");
  check_norm(x, norm);
  const int B = x.shape(0), L = x.shape(1), N = (n_heads + 2 * n_kv_heads) * head_dim;
  if (check_parts(op, forms, weights, x.shape(2)) != N)
    throw std::invalid_argument(std::string(op) + ": the parts' outputs must add up to (n_heads + 2 n_kv_heads) * head_dim");
  if (bias && (bias->ndim() != 1 || bias->shape(0) != N))
    throw std::invalid_argument(std::string(op) + ": bias must be (q|k|v width,)");
  if (cos_t.ndim() != 3 || cos_t.shape(0) != B || cos_t.shape(1) != L || 2 * cos_t.shape(2) > head_dim ||
      sin_t.shape() != cos_t.shape())
    throw std::invalid_argument(std::string(op) + ": cos/sin tables must be (B, L, rope_dims / 2)");
  std::vector<array> ins = {x, as_f32(norm)};
  ins.insert(ins.end(), weights.begin(), weights.end());
  if (bias) ins.push_back(as_f32(*bias));
  ins.push_back(as_f32(cos_t));
  ins.push_back(as_f32(sin_t));
  return ins;
}

// h = a O^T (+ bias) + x; out = down(swiglu(gate|up parts(rms_norm(h)) (+ bias))) (+ bias) + h,
// for M rows of width H; `w` holds o..., [o bias], norm, gate|up parts..., [their bias], down...,
// [down bias].
struct PostSpec {
  float eps;
  int o_form;
  bool o_bias;
  std::vector<int> gu_forms;
  bool gu_bias;
  int down_form;
  bool down_bias;
  bool operator==(const PostSpec&) const = default;
  int inputs() const {
    return weight_arrays(o_form) + o_bias + 1 + parts_arrays(gu_forms) + gu_bias + weight_arrays(down_form) + down_bias;
  }
};

void post_run(const PostSpec& p, const float* a, const float* x, int M, int H, const array* w, float* out) {
  int at = 0;
  const array* o = &w[at];
  at += weight_arrays(p.o_form);
  const float* o_bias = p.o_bias ? w[at++].data<float>() : nullptr;
  const float* norm = w[at++].data<float>();
  const array* gu = &w[at];
  at += parts_arrays(p.gu_forms);
  const float* gu_bias = p.gu_bias ? w[at++].data<float>() : nullptr;
  const array* down = &w[at];
  at += weight_arrays(p.down_form);
  const float* down_bias = p.down_bias ? w[at].data<float>() : nullptr;
  int N2 = 0;
  const array* g = gu;
  for (int f : p.gu_forms) {
    N2 += g[0].shape(0);
    g += weight_arrays(f);
  }
  Scratch h((size_t)M * H), hn((size_t)M * H), sw((size_t)M * (N2 / 2));
  linear_rows(p.o_form, o, a, M, h.p, x, o_bias);
  targ::rms_norm(h.p, nullptr, norm, p.eps, M, H, nullptr, hn.p);
  if (p.gu_forms.size() == 1 && !gu_bias) {  // one gate|up matrix: SwiGLU in its product, as the separate ops
    linear_rows(p.gu_forms[0], gu, hn.p, M, sw.p, nullptr, nullptr, true);
  } else {
    Scratch gs((size_t)M * N2);
    parts_rows(p.gu_forms, gu, hn.p, M, N2, gs.p, gu_bias);
    targ::swiglu(gs.p, M, N2 / 2, sw.p);
  }
  linear_rows(p.down_form, down, sw.p, M, out, h.p, down_bias);
}

// post_run's weights for rows of width H after an attention of width a_width, checked.
std::vector<array> post_inputs(const char* op, int a_width, int H, const array& norm, int o_form, const std::vector<array>& o,
                               const std::optional<array>& o_bias, const std::vector<int>& gu_forms,
                               const std::vector<array>& gu, const std::optional<array>& gu_bias, int down_form,
                               const std::vector<array>& down, const std::optional<array>& down_bias) {
  if (norm.ndim() != 1 || norm.shape(0) != H) throw std::invalid_argument(std::string(op) + ": the norm's weight must be (hidden,)");
  if (check_parts(op, {o_form}, o, a_width) != H)
    throw std::invalid_argument(std::string(op) + ": the output projection must map back to the hidden size");
  const int N2 = check_parts(op, gu_forms, gu, H);
  if (N2 % 2) throw std::invalid_argument(std::string(op) + ": gate|up must have an even width");
  if (check_parts(op, {down_form}, down, N2 / 2) != H)
    throw std::invalid_argument(std::string(op) + ": the down projection must map back to the hidden size");
  auto vec = [op](const std::optional<array>& b, int n, const char* what) {
    if (b && (b->ndim() != 1 || b->shape(0) != n))
      throw std::invalid_argument(std::string(op) + ": " + what + " bias has the wrong width");
  };
  vec(o_bias, H, "the output projection's");
  vec(gu_bias, N2, "gate|up's");
  vec(down_bias, H, "the down projection's");
  std::vector<array> ins(o.begin(), o.end());
  if (o_bias) ins.push_back(as_f32(*o_bias));
  ins.push_back(as_f32(norm));
  ins.insert(ins.end(), gu.begin(), gu.end());
  if (gu_bias) ins.push_back(as_f32(*gu_bias));
  ins.insert(ins.end(), down.begin(), down.end());
  if (down_bias) ins.push_back(as_f32(*down_bias));
  return ins;
}

// ---------------------------------------------------------------------------------------------
// Rows of a weight matrix in either form (see QLinear): tiles (form = bits; inputs ids, q,
// scales, biases) or K-quant blocks as stored (form = GGML type; inputs ids, blocks).
class Embed : public mx::UnaryPrimitive {
 public:
  Embed(mx::Stream s, int form) : UnaryPrimitive(s), form_(form) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in);
    enc.dispatch([ins = std::move(ins), out = array::unsafe_weak_copy(out), form = form_]() mutable {
      const int32_t* ids = ins[0].data<int32_t>();
      if (is_kquant(form)) targ::kembed(kmat(ins[1], form), ids, (int)ins[0].size(), out.data<float>());
      else targ::embed(qmat(ins[1], ins[2], ins[3], form), ids, (int)ins[0].size(), out.data<float>());
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargEmbed runs on the CPU only"); }
  const char* name() const override { return "TargEmbed"; }
  bool is_equivalent(const Primitive& o) const override { return form_ == static_cast<const Embed&>(o).form_; }
 private:
  int form_;
};

// Rows of K floats for ids, as Embed's inputs.
array embed_node(const array& ids, int K, std::vector<array> weights, int form) {
  auto s = ids.shape();
  s.push_back(K);
  std::vector<array> ins = {mx::contiguous(mx::astype(ids, mx::int32, cpu_stream()), false, cpu_stream())};
  ins.insert(ins.end(), weights.begin(), weights.end());
  return array(s, mx::float32, std::make_shared<Embed>(cpu_stream(), form), ins);
}

array op_embed(const array& ids, const array& q, const array& scales, const array& biases, int bits) {
  check_packed(q, scales, biases, bits, "embed");
  if (bits == 6) throw std::invalid_argument("embed: Q6_K tiles are not looked up (an embedding stays in rows)");
  return embed_node(ids, q.shape(1) * 8 / bits, {q, scales, biases}, bits);
}

array op_kembed(const array& ids, const array& blocks, int type) {
  check_kblocks(blocks, type, "kembed");
  return embed_node(ids, kblocks_K(blocks, type), {blocks}, type);
}

// ---------------------------------------------------------------------------------------------
// A (B, H, S, D) cache array as the attention kernel reads it: in place where its last axis is
// contiguous (a cache's buffer, or a slice of one), else a contiguous copy held by `h`.
targ::KV cache_view(const array& a, std::shared_ptr<std::vector<float>>& h) {
  if (a.strides()[3] == 1) return targ::KV{a.data<float>(), (long)a.strides()[0], (long)a.strides()[1], (long)a.strides()[2]};
  const float* p = contiguous_f32(a, h);
  return targ::KV{p, (long)a.shape(1) * a.shape(2) * a.shape(3), (long)a.shape(2) * a.shape(3), (long)a.shape(3)};
}

class Attention : public mx::UnaryPrimitive {
 public:
  Attention(mx::Stream s, float scale, bool pad, int hole, bool shared, bool shared_pad, int shared_hole, bool tiles)
      : UnaryPrimitive(s), scale_(scale), pad_(pad), hole_(hole), shared_(shared), shared_pad_(shared_pad),
        shared_hole_(shared_hole), tiles_(tiles) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in);
    enc.dispatch([ins = std::move(ins), out = array::unsafe_weak_copy(out), scale = scale_, pad = pad_, hole = hole_,
                  shared = shared_, shared_pad = shared_pad_, shared_hole = shared_hole_, tiles = tiles_]() mutable {
      std::shared_ptr<std::vector<float>> hq, hk, hv, hpk, hpv;
      const array &q = ins[0], &k = ins[1], &v = ins[2];
      const float* qp = contiguous_f32(q, hq);
      targ::KV K = cache_view(k, hk), V = cache_view(v, hv);
      size_t at = pad ? 4 : 3;
      targ::Shared pre{};
      if (shared) {
        const array &pk = ins[at], &pv = ins[at + 1];
        pre = targ::Shared{cache_view(pk, hpk), cache_view(pv, hpv), ins[at + 2].data<int32_t>(),
                           shared_pad ? ins[at + 3].data<int32_t>() : nullptr, shared_hole, (int)pk.shape(2), (int)pk.shape(0)};
      }
      targ::attention_of(tiles, qp, K, V, pad ? ins[3].data<int32_t>() : nullptr, hole, q.shape(0), q.shape(1), k.shape(1),
                         q.shape(2), k.shape(2), q.shape(3), scale, out.data<float>(), shared ? &pre : nullptr);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargAttention runs on the CPU only"); }
  const char* name() const override { return "TargAttention"; }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const Attention&>(o);
    return scale_ == p.scale_ && pad_ == p.pad_ && hole_ == p.hole_ && shared_ == p.shared_ && shared_pad_ == p.shared_pad_ &&
           shared_hole_ == p.shared_hole_ && tiles_ == p.tiles_;
  }
 private:
  float scale_;
  bool pad_;
  int hole_;
  bool shared_, shared_pad_;
  int shared_hole_;
  bool tiles_;  // a prompt's queries: on AMX-BF16 tiles where granted (attn_tiles.h)
};

// A flat int32 vector. The caches hand over row maps and paddings that already are one; passing
// them through as they are saves the 2-3 small ops per layer (~5 us each) a conversion would add
// to every decode step.
array int_vector(const array& a) {
  if (a.is_available() && a.dtype() == mx::int32 && a.ndim() == 1 && a.flags().row_contiguous) return a;
  return mx::contiguous(mx::astype(mx::reshape(a, {-1}, cpu_stream()), mx::int32, cpu_stream()), false, cpu_stream());
}

array op_attention(const array& q_, const array& k_, const array& v_, float scale, std::optional<array> left_pad,
                   int hole, std::optional<array> shared_keys, std::optional<array> shared_values,
                   std::optional<array> shared_rows, std::optional<array> shared_pad, int shared_hole, bool tiles) {
  array q = as_f32(q_), k = as_f32(k_), v = as_f32(v_);
  if (q.ndim() != 4 || k.ndim() != 4 || v.shape() != k.shape() || q.shape(0) != k.shape(0) || q.shape(3) != k.shape(3) ||
      q.shape(1) % k.shape(1))
    throw std::invalid_argument("attention: q (B, Hq, L, D), keys and values (B, Hkv, S, D) with Hq a multiple of Hkv");
  if (q.shape(2) > k.shape(2)) throw std::invalid_argument("attention: more queries than cached positions");
  std::vector<array> ins = {q, k, v};
  if (left_pad) {
    array lp = int_vector(*left_pad);
    if ((int)lp.size() != q.shape(0)) throw std::invalid_argument("attention: left_pad needs one entry per row");
    ins.push_back(lp);
  }
  mx::Shape s = {q.shape(0), q.shape(2), q.shape(1) * q.shape(3)};
  if (hole < 0 || hole > k.shape(2)) throw std::invalid_argument("attention: hole must lie within the cache");
  bool shared = shared_keys.has_value();
  if (shared != shared_values.has_value() || shared != shared_rows.has_value() || (shared_pad && !shared))
    throw std::invalid_argument("attention: shared keys need shared_values and shared_rows (and shared_pad is optional)");
  if (shared) {
    array pk = as_f32(*shared_keys), pv = as_f32(*shared_values), rows = int_vector(*shared_rows);
    if (pk.ndim() != 4 || pv.shape() != pk.shape() || pk.shape(1) != k.shape(1) || pk.shape(3) != k.shape(3))
      throw std::invalid_argument("attention: shared keys and values (R, Hkv, P, D) with the cache's Hkv and D");
    if ((int)rows.size() != q.shape(0)) throw std::invalid_argument("attention: shared_rows needs one entry per row");
    if (shared_hole < 0 || shared_hole > pk.shape(2)) throw std::invalid_argument("attention: shared_hole must lie within the shared keys");
    ins.insert(ins.end(), {pk, pv, rows});
    if (shared_pad) {
      array pp = int_vector(*shared_pad);
      if ((int)pp.size() != pk.shape(0)) throw std::invalid_argument("attention: shared_pad needs one entry per shared row");
      ins.push_back(pp);
    }
  }
  return array(s, mx::float32,
               std::make_shared<Attention>(cpu_stream(), scale, left_pad.has_value(), hole, shared, shared_pad.has_value(), shared_hole,
                                           tiles),
               ins);
}

// Writes kn, vn (B, Hkv, L, D) into keys and values at positions prev..prev+L-1 (the arrays'
// own buffers, any strides), then out (B, L, Hq*D) = the attention of q (B, Hq, L, D) over the
// first prev + L positions.
void append_attend(const float* q, const float* kn, const float* vn, int B, int Hq, int Hkv, int L, int D, array& keys,
                   array& values, int prev, const int32_t* pad, int hole, float scale, float* out, bool tiles) {
  auto put = [&](const float* src, array& buf) {
    float* base = buf.data<float>();
    const auto& st = buf.strides();
    for (int b = 0; b < B; b++)
      for (int h = 0; h < Hkv; h++)
        for (int l = 0; l < L; l++) {
          const float* from = src + (((size_t)b * Hkv + h) * L + l) * D;
          float* to = base + b * st[0] + h * st[1] + (prev + l) * st[2];
          for (int d = 0; d < D; d++) to[d * st[3]] = from[d];
        }
  };
  put(kn, keys);
  put(vn, values);
  std::shared_ptr<std::vector<float>> hk, hv;
  targ::attention_of(tiles, q, cache_view(keys, hk), cache_view(values, hv), pad, hole, B, Hq, Hkv, L, prev + L, D, scale, out);
}

// ---------------------------------------------------------------------------------------------
// A whole decoder layer as one node, for a step whose keys fit in the cache's buffers: pre_run,
// append_attend and post_run in that order, as the separate ops (with mlx-lm's cache update and
// Attention between) compute them, so the same bits. mlx-lm's update_and_fetch would
// make two SliceUpdates and two Slices a layer; a decode step is ~30 graph nodes instead of ~430.
// Outputs 1 and 2 share the buffers of the cache's arrays: the write lands in place, at positions
// no earlier node reads (every earlier step attended over fewer), and the caller stores them as
// the cache's arrays. Inputs: pre_run's, the cache's keys and values, [left_pad], post_run's
// weights; outputs: x (B, L, H), keys, values.
class DecoderLayer : public mx::Primitive {
 public:
  DecoderLayer(mx::Stream s, PreSpec pre, PostSpec post, float scale, bool pad, int hole, int prev, bool tiles)
      : Primitive(s), pre_(std::move(pre)), post_(std::move(post)), scale_(scale), pad_(pad), hole_(hole), prev_(prev),
        tiles_(tiles) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    const int at = pre_.inputs();
    alloc(outs[0]);
    outs[1].copy_shared_buffer(in[at]);
    outs[2].copy_shared_buffer(in[at + 1]);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in), os = weak(outs);
    enc.dispatch([ins = std::move(ins), os = std::move(os), pre = pre_, post = post_, scale = scale_, pad = pad_, hole = hole_,
                  prev = prev_, tiles = tiles_, at]() mutable {
      std::shared_ptr<std::vector<float>> hx;
      const array& x = ins[0];
      const int B = x.shape(0), L = x.shape(1), H = x.shape(2), M = B * L;
      Scratch q((size_t)M * pre.hq * pre.d), k((size_t)M * pre.hkv * pre.d), v((size_t)M * pre.hkv * pre.d),
          a((size_t)M * pre.hq * pre.d);
      pre_run(pre, ins.data(), q.p, k.p, v.p);
      append_attend(q.p, k.p, v.p, B, pre.hq, pre.hkv, L, pre.d, os[1], os[2], prev, pad ? ins[at + 2].data<int32_t>() : nullptr,
                    hole, scale, a.p, tiles);
      post_run(post, a.p, contiguous_f32(x, hx), M, H, &ins[at + 2 + pad], os[0].data<float>());
    });
  }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const DecoderLayer&>(o);
    return pre_ == p.pre_ && post_ == p.post_ && scale_ == p.scale_ && pad_ == p.pad_ && hole_ == p.hole_ && prev_ == p.prev_ &&
           tiles_ == p.tiles_;
  }
  TARG_PRIMITIVE_COMMON(TargDecoderLayer)
 private:
  PreSpec pre_;
  PostSpec post_;
  float scale_;
  bool pad_;
  int hole_, prev_;
  bool tiles_;  // a prompt's queries (attn_tiles.h)
};

std::tuple<array, array, array> op_decoder_layer(
    const array& x_, const array& norm_in, float eps, std::vector<int> forms, std::vector<array> weights,
    std::optional<array> bias, const array& cos_t, const array& sin_t, int n_heads, int n_kv_heads, int head_dim,
    bool traditional, const array& keys, const array& values, int prev, float scale, std::optional<array> left_pad, int hole,
    int o_form, std::vector<array> o, std::optional<array> o_bias, const array& norm_post, float eps_post,
    std::vector<int> gu_forms, std::vector<array> gu, std::optional<array> gu_bias, int down_form, std::vector<array> down,
    std::optional<array> down_bias, bool tiles) {
  array x = as_f32(x_);
  auto ins = pre_inputs("decoder_layer", x, norm_in, forms, weights, bias, cos_t, sin_t, n_heads, n_kv_heads, head_dim);
  const int B = x.shape(0), L = x.shape(1);
  if (keys.dtype() != mx::float32 || values.dtype() != mx::float32 || keys.ndim() != 4 || values.shape() != keys.shape() ||
      keys.shape(0) != B || keys.shape(1) != n_kv_heads || keys.shape(3) != head_dim)
    throw std::invalid_argument("decoder_layer: the cache's keys and values must be float32 (B, n_kv_heads, capacity, head_dim)");
  if (prev < 0 || prev + L > keys.shape(2))
    throw std::invalid_argument("decoder_layer: the new positions must fit in the cache's capacity");
  if (hole < 0 || hole > prev + L) throw std::invalid_argument("decoder_layer: hole must lie within the cache");
  ins.push_back(keys);
  ins.push_back(values);
  if (left_pad) {
    array lp = int_vector(*left_pad);
    if ((int)lp.size() != B) throw std::invalid_argument("decoder_layer: left_pad needs one entry per row");
    ins.push_back(lp);
  }
  auto w = post_inputs("decoder_layer", n_heads * head_dim, x.shape(2), norm_post, o_form, o, o_bias, gu_forms, gu, gu_bias,
                       down_form, down, down_bias);
  ins.insert(ins.end(), w.begin(), w.end());
  auto outs = array::make_arrays(
      {x.shape(), keys.shape(), values.shape()}, {mx::float32, mx::float32, mx::float32},
      std::make_shared<DecoderLayer>(
          cpu_stream(), PreSpec{eps, std::move(forms), bias.has_value(), n_heads, n_kv_heads, head_dim, traditional},
          PostSpec{eps_post, o_form, o_bias.has_value(), std::move(gu_forms), gu_bias.has_value(), down_form,
                   down_bias.has_value()},
          scale, left_pad.has_value(), hole, prev, tiles),
      ins);
  return {outs[0], outs[1], outs[2]};
}

// ---------------------------------------------------------------------------------------------
class Select : public mx::Primitive {
 public:
  explicit Select(mx::Stream s) : Primitive(s) {}
  void eval_cpu(const std::vector<array>& in, std::vector<array>& outs) override {
    for (auto& o : outs) alloc(o);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in), os = weak(outs);
    enc.dispatch([ins = std::move(ins), os = std::move(os)]() mutable {
      std::shared_ptr<std::vector<float>> h;
      const float* lg = contiguous_f32(ins[0], h);
      int B = ins[0].shape(0), V = ins[0].shape(1);
      targ::select_rows(lg, B, V, ins[1].data<float>(), ins[2].data<float>(), os[0].data<int32_t>(), os[1].data<float>(),
                        os[2].data<float>(), os[3].data<float>());
    });
  }
  bool is_equivalent(const Primitive&) const override { return true; }
  TARG_PRIMITIVE_COMMON(TargSelect)
};

std::tuple<array, array, array, array> op_select(const array& logits, const array& inv_temp, const array& u) {
  array lg = as_f32(logits);
  if (lg.ndim() != 2) throw std::invalid_argument("select: logits must be (B, V)");
  int B = lg.shape(0);
  auto vec = [&](const array& a) {
    array f = mx::contiguous(mx::broadcast_to(as_f32(mx::reshape(a, {-1}, cpu_stream())), {B}, cpu_stream()), false, cpu_stream());
    return f;
  };
  mx::Shape s = {B};
  auto outs = array::make_arrays({s, s, s, s}, {mx::int32, mx::float32, mx::float32, mx::float32},
                                 std::make_shared<Select>(cpu_stream()), {lg, vec(inv_temp), vec(u)});
  return {outs[0], outs[1], outs[2], outs[3]};
}

std::string simd_level() {
#if TARG_VNNI
  return "avx512-vnni";
#elif TARG_AVX512
  return "avx512";
#elif TARG_AVX2
  return "avx2";
#else
  return "scalar";
#endif
}

// ---------------------------------------------------------------------------------------------
// The sentence encoder's layers (bert.h): GELU, LayerNorm with its residual, bidirectional
// attention over padded rows.
class Gelu : public mx::UnaryPrimitive {
 public:
  explicit Gelu(mx::Stream s) : UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = array::unsafe_weak_copy(in[0]), out = array::unsafe_weak_copy(out)]() mutable {
      std::shared_ptr<std::vector<float>> h;
      targ::gelu_erf(contiguous_f32(x, h), out.size(), out.data<float>());
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargGelu runs on the CPU only"); }
  const char* name() const override { return "TargGelu"; }
  bool is_equivalent(const Primitive&) const override { return true; }
};

array op_gelu(const array& x_) {
  array x = as_f32(x_);
  return array(x.shape(), mx::float32, std::make_shared<Gelu>(cpu_stream()), {x});
}

class LayerNorm : public mx::UnaryPrimitive {
 public:
  LayerNorm(mx::Stream s, float eps, bool add) : UnaryPrimitive(s), eps_(eps), add_(add) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in);
    enc.dispatch([ins = std::move(ins), out = array::unsafe_weak_copy(out), eps = eps_, add = add_]() mutable {
      std::shared_ptr<std::vector<float>> h1, h2, h3, h4;
      const float* x = contiguous_f32(ins[0], h1);
      const float* r = add ? contiguous_f32(ins[1], h2) : nullptr;
      const float* w = contiguous_f32(ins[add ? 2 : 1], h3);
      const float* b = contiguous_f32(ins[add ? 3 : 2], h4);
      int H = ins[0].shape(-1), rows = (int)(ins[0].size() / H);
      targ::layer_norm(x, r, w, b, eps, rows, H, out.data<float>());
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargLayerNorm runs on the CPU only"); }
  const char* name() const override { return "TargLayerNorm"; }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const LayerNorm&>(o);
    return eps_ == p.eps_ && add_ == p.add_;
  }
 private:
  float eps_;
  bool add_;
};

array op_layer_norm(const array& x_, const array& w, const array& b, float eps, std::optional<array> residual) {
  array x = as_f32(x_);
  if (w.ndim() != 1 || b.ndim() != 1 || x.ndim() < 1 || w.shape(0) != x.shape(-1) || b.shape(0) != x.shape(-1))
    throw std::invalid_argument("layer_norm: weight and bias must be 1-D with the input's last dimension");
  std::vector<array> ins = {x};
  if (residual) {
    if (residual->shape() != x.shape()) throw std::invalid_argument("layer_norm: residual must have the input's shape");
    ins.push_back(as_f32(*residual));
  }
  ins.push_back(as_f32(w));
  ins.push_back(as_f32(b));
  return array(x.shape(), mx::float32, std::make_shared<LayerNorm>(cpu_stream(), eps, (bool)residual), ins);
}

class BidirAttention : public mx::UnaryPrimitive {
 public:
  BidirAttention(mx::Stream s, int heads, float scale, bool bf16)
      : UnaryPrimitive(s), heads_(heads), scale_(scale), bf16_(bf16) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([qkv = array::unsafe_weak_copy(in[0]), len = array::unsafe_weak_copy(in[1]),
                  out = array::unsafe_weak_copy(out), heads = heads_, scale = scale_, bf16 = bf16_]() mutable {
      std::shared_ptr<std::vector<float>> h;
      const float* q = contiguous_f32(qkv, h);
      const bool packed = qkv.ndim() == 2;  // (T, 3H): the sequences' rows one after another
      const int B = len.shape(0), L = packed ? 0 : qkv.shape(1), D = qkv.shape(-1) / 3 / heads;
      if (!(bf16 && targ::bf16_attention(q, len.data<int32_t>(), B, L, packed, heads, D, scale, out.data<float>())))
        targ::bidir_attention(q, len.data<int32_t>(), B, L, packed, heads, D, scale, out.data<float>());
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargBidirAttention runs on the CPU only"); }
  const char* name() const override { return "TargBidirAttention"; }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const BidirAttention&>(o);
    return heads_ == p.heads_ && scale_ == p.scale_ && bf16_ == p.bf16_;
  }
 private:
  int heads_;
  float scale_;
  bool bf16_;
};

array op_bidir_attention(const array& qkv_, const array& lengths, int heads, float scale, bool bf16) {
  array qkv = as_f32(qkv_);
  const bool packed = qkv.ndim() == 2;
  if ((qkv.ndim() != 3 && !packed) || heads <= 0 || qkv.shape(-1) % (3 * heads))
    throw std::invalid_argument("bidir_attention: qkv must be (B, L, 3 * heads * head_dim) or packed (T, 3 * heads * head_dim)");
  if (lengths.ndim() != 1 || (!packed && lengths.shape(0) != qkv.shape(0)))
    throw std::invalid_argument("bidir_attention: lengths must be (B,)");
  array len = mx::contiguous(mx::astype(lengths, mx::int32, cpu_stream()), false, cpu_stream());
  if (packed) {  // the rows each sequence owns are read from the lengths: they must cover qkv exactly
    mx::eval({len});
    long total = 0;
    for (int b = 0; b < len.shape(0); b++) {
      const int32_t n = len.data<int32_t>()[b];
      if (n < 0) throw std::invalid_argument("bidir_attention: a packed sequence's length is negative");
      total += n;
    }
    if (total != qkv.shape(0))
      throw std::invalid_argument("bidir_attention: packed lengths sum to " + std::to_string(total) + ", not qkv's " +
                                  std::to_string(qkv.shape(0)) + " rows");
  }
  mx::Shape shape = qkv.shape();
  shape.back() /= 3;
  return array(shape, mx::float32, std::make_shared<BidirAttention>(cpu_stream(), heads, scale, bf16 && targ::kBf16),
               {qkv, len});
}

// The encoder's bfloat16 products (bf16gemm.h): W packed once, x @ W + bias per call.
array op_bf16_pack(const array& w_) {
  array w = mx::contiguous(as_f32(w_), false, cpu_stream());
  if (w.ndim() != 2 || w.shape(0) % 2 || w.shape(1) % 16)
    throw std::invalid_argument("bf16_pack: W must be (K, N) with K even and N a multiple of 16");
  mx::eval({w});
  const int K = w.shape(0), N = w.shape(1);
  std::vector<uint16_t> out((size_t)K * N);
  targ::bf16_pack(w.data<float>(), K, N, out.data());
  return array(out.begin(), {N / 16, K / 2, 32}, mx::uint16);
}

class Bf16Linear : public mx::UnaryPrimitive {
 public:
  Bf16Linear(mx::Stream s, bool has_bias, bool gelu) : UnaryPrimitive(s), bias_(has_bias), gelu_(gelu) {}
  void eval_cpu(const std::vector<array>& in, array& out) override {
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    auto ins = weak(in);
    enc.dispatch([ins = std::move(ins), out = array::unsafe_weak_copy(out), hb = bias_, gelu = gelu_]() mutable {
      std::shared_ptr<std::vector<float>> hx;
      const array& x = ins[0];
      const int K = ins[1].shape(1) * 2, N = ins[1].shape(0) * 16;
      targ::bf16_linear(contiguous_f32(x, hx), (int)(x.size() / K), K, ins[1].data<uint16_t>(), N,
                        hb ? ins[2].data<float>() : nullptr, out.data<float>(), gelu);
    });
  }
  void eval_gpu(const std::vector<array>&, array&) override { throw std::runtime_error("TargBf16Linear runs on the CPU only"); }
  const char* name() const override { return "TargBf16Linear"; }
  bool is_equivalent(const Primitive& o) const override {
    auto& p = static_cast<const Bf16Linear&>(o);
    return bias_ == p.bias_ && gelu_ == p.gelu_;
  }
 private:
  bool bias_, gelu_;
};

array op_bf16_linear(const array& x_, const array& w, std::optional<array> bias, bool gelu) {
  if (!targ::kBf16) throw std::invalid_argument("bf16_linear: this build has no AVX512-BF16 (bf16_products() is False)");
  array x = as_f32(x_);
  if (w.dtype() != mx::uint16 || w.ndim() != 3 || w.shape(2) != 32)
    throw std::invalid_argument("bf16_linear: W must be bf16_pack's (N / 16, K / 2, 32) uint16");
  const int K = w.shape(1) * 2, N = w.shape(0) * 16;
  if (x.ndim() < 1 || x.shape(-1) != K) throw std::invalid_argument("bf16_linear: x's last dimension must be W's K");
  auto shape = x.shape();
  shape.back() = N;
  std::vector<array> ins = {x, mx::contiguous(w, false, cpu_stream())};
  if (bias) {
    if (bias->ndim() != 1 || bias->shape(0) != N) throw std::invalid_argument("bf16_linear: bias must be (N,)");
    ins.push_back(mx::contiguous(as_f32(*bias), false, cpu_stream()));
  }
  return array(shape, mx::float32, std::make_shared<Bf16Linear>(cpu_stream(), bias.has_value(), gelu), ins);
}

// ---------------------------------------------------------------------------------------------
// AMX tiles (amx.h): the engine switch and the layout check.
std::string set_amx(const std::string& mode) {
  static const char* names[] = {"vnni", "amx", "ref"};
  int want = mode == "vnni" ? targ::kAmxOff : mode == "amx" ? targ::kAmxHw : mode == "ref" ? targ::kAmxRef : -1;
  if (want < 0) throw std::invalid_argument("set_amx: mode " + mode + " is none of amx, vnni, ref");
  if (want == targ::kAmxHw && !targ::amx_grant().ok) throw std::invalid_argument("set_amx: AMX " + targ::amx_grant().why);
  if (want == targ::kAmxRef && simd_level() != "avx512-vnni")
    throw std::invalid_argument("set_amx: the tile kernels need an AVX512-VNNI build, this one is " + simd_level());
  return names[targ::amx_mode().exchange(want)];
}

array tile_dots(const array& xq_, const array& q, const array& scales, const array& biases, int bits, bool simd_unpack) {
  check_packed(q, scales, biases, bits, "tile_dots");
  array xq = mx::contiguous(xq_, false, cpu_stream());
  mx::eval({xq, q, scales, biases});
  targ::QMat W = qmat(q, scales, biases, bits);
  if (xq.dtype() != mx::int8 || xq.ndim() != 2 || xq.shape(1) != W.K || xq.shape(0) % 16)
    throw std::invalid_argument("tile_dots: xq must be int8 (M, K) with M a multiple of 16");
  const int M = xq.shape(0), parts = bits == 6 ? 2 : 1;
  std::vector<int32_t> out((size_t)M * (W.K / targ::QG) * parts * W.N);
  targ::tile_dots(W, xq.data<int8_t>(), M, simd_unpack, out.data());
  return array(out.begin(), {M, W.K / targ::QG * parts, W.N}, mx::int32);
}

}  // namespace

NB_MODULE(_targ_native, m) {
  m.doc() = "targ-mlx CPU kernels as MLX primitives (see targ_mlx/native)";
  m.def("qlinear", &op_qlinear, nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("biases"), nb::arg("bits"),
        nb::arg("bias") = nb::none(), nb::arg("residual") = nb::none(), nb::arg("swiglu") = false,
        "x @ W.T (+ bias) (+ residual) for packed 4/8-bit W; float32 out; swiglu: W is gate|up, out its SwiGLU");
  m.def("kqlinear", &op_kqlinear, nb::arg("x"), nb::arg("blocks"), nb::arg("type"), nb::arg("bias") = nb::none(),
        nb::arg("residual") = nb::none(), nb::arg("swiglu") = false,
        "x @ W.T (+ bias) (+ residual) for W as GGUF Q4_K/Q6_K blocks; float32 out; swiglu: W is gate|up, out its SwiGLU");
  m.def("kembed", &op_kembed, nb::arg("ids"), nb::arg("blocks"), nb::arg("type"),
        "rows of GGUF Q4_K/Q6_K blocks, dequantized as gguf.quants does");
  m.def("rms_norm", &op_rms_norm, nb::arg("x"), nb::arg("weight"), nb::arg("eps"));
  m.def("add_rms_norm", &op_add_rms_norm, nb::arg("x"), nb::arg("r"), nb::arg("weight"), nb::arg("eps"),
        "(h, rms_norm(h)) with h = x + r");
  m.def("rope_table", &op_rope_table, nb::arg("positions"), nb::arg("inv_freq"), nb::arg("batch"), nb::arg("length"),
        nb::arg("scale") = 1.0f);
  m.def("rope_split", &op_rope_split, nb::arg("qkv"), nb::arg("cos"), nb::arg("sin"), nb::arg("n_heads"),
        nb::arg("n_kv_heads"), nb::arg("head_dim"), nb::arg("traditional"));
  m.def("swiglu", &op_swiglu, nb::arg("gate_up"));
  m.def("embed", &op_embed, nb::arg("ids"), nb::arg("q"), nb::arg("scales"), nb::arg("biases"), nb::arg("bits"));
  m.def("attention", &op_attention, nb::arg("q"), nb::arg("keys"), nb::arg("values"), nb::arg("scale"),
        nb::arg("left_pad") = nb::none(), nb::arg("hole") = 0, nb::arg("shared_keys") = nb::none(),
        nb::arg("shared_values") = nb::none(), nb::arg("shared_rows") = nb::none(), nb::arg("shared_pad") = nb::none(),
        nb::arg("shared_hole") = 0, nb::arg("tiles") = false,
        "softmax(q k^T * scale) v per row, hiding keys [hole, hole + left_pad[b]) and future positions; "
        "with shared_keys, row b first attends to row shared_rows[b] of them (a prompt shared by several rows); "
        "tiles: a prompt's queries, on AMX-BF16 tiles where granted (bfloat16 products)");
  m.def("decoder_layer", &op_decoder_layer, nb::arg("x"), nb::arg("norm"), nb::arg("eps"), nb::arg("forms"),
        nb::arg("weights"), nb::arg("bias").none(), nb::arg("cos"), nb::arg("sin"), nb::arg("n_heads"), nb::arg("n_kv_heads"),
        nb::arg("head_dim"), nb::arg("traditional"), nb::arg("keys"), nb::arg("values"), nb::arg("prev"), nb::arg("scale"),
        nb::arg("left_pad").none(), nb::arg("hole"), nb::arg("o_form"), nb::arg("o"), nb::arg("o_bias").none(),
        nb::arg("norm_post"), nb::arg("eps_post"), nb::arg("gate_up_forms"), nb::arg("gate_up"), nb::arg("gate_up_bias").none(),
        nb::arg("down_form"), nb::arg("down"), nb::arg("down_bias").none(), nb::arg("tiles") = false,
        "a decoder layer as one node, writing k and v into the cache's buffers in place: (x, keys, values)");
  m.def("select", &op_select, nb::arg("logits"), nb::arg("inv_temp"), nb::arg("u"),
        "(token, entropy, gap, logprob) per row; inv_temp 0 = greedy");
  m.def("gelu", &op_gelu, nb::arg("x"), "0.5 x (1 + erf(x / sqrt 2)), float32");
  m.def("layer_norm", &op_layer_norm, nb::arg("x"), nb::arg("weight"), nb::arg("bias"), nb::arg("eps"),
        nb::arg("residual") = nb::none(), "LayerNorm(x (+ residual)) * weight + bias over the last axis");
  m.def("bidir_attention", &op_bidir_attention, nb::arg("qkv"), nb::arg("lengths"), nb::arg("heads"), nb::arg("scale"),
        nb::arg("bf16") = false,
        "softmax(scale q k^T) v per head over each row's first lengths[b] tokens; qkv (B, L, 3 H) -> (B, L, H), or "
        "packed (T, 3 H) -> (T, H) with the sequences' rows one after another (lengths summing to T); "
        "bf16: both products in bfloat16 where the build multiplies it and head_dim is 32 or 64");
  m.def("bf16_pack", &op_bf16_pack, nb::arg("w"), "W (K, N) float32 -> bfloat16 pairs for bf16_linear: (N/16, K/2, 32) uint16");
  m.def("bf16_linear", &op_bf16_linear, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(),
        nb::arg("gelu") = false,
        "x @ W (+ bias) (then GELU) with W from bf16_pack: bfloat16 products, float32 sums and out (AVX512-BF16 builds)");
  m.def("bf16_products", [] { return targ::kBf16; }, "whether this build multiplies bfloat16 (AVX512-BF16)");
  m.def("simd", &simd_level);
  m.def("q4k_layout", [] { return std::string(targ::q4k_k4() ? "k4" : "tiles"); },
        "the nibble layout of Q4_K tiles in this process (gguf_blocks.q4k_tiles)");
  m.def("q6k_kernel", [] {
        return std::string(targ::q6k_kernel_name()); },
        "the kernel that multiplies Q6_K rows in this process (kquant.h)");
  m.def("q6k_layout", [] { return std::string(targ::q6k_tiles_on() ? "tiles" : "rows"); },
        "the form of Q6_K matrices in this process (gguf_blocks.kernel_weights)");
  m.def("threads", [] { return targ::pool().size(); });
  m.def("amx_status", [] { return targ::amx_grant().why; },
        "whether AMX tiles multiply at prefill in this process, and why not where they do not");
  m.def("prompt_attention_tiles", [](int head_dim) { return targ::attention_tiles_take(head_dim); }, nb::arg("head_dim"),
        "whether a prompt's attention (attention(..., tiles=True)) runs on AMX-BF16 tiles here at this head size");
  m.def("set_amx", &set_amx, nb::arg("mode"),
        "the prefill kernels' engine: 'amx' (AMX tiles, where granted), 'vnni', or 'ref' (the plain C++ tile "
        "engine, for tests); returns the previous one");
  m.def("tile_dots", &tile_dots, nb::arg("xq"), nb::arg("q"), nb::arg("scales"), nb::arg("biases"), nb::arg("bits"),
        nb::arg("simd_unpack") = true,
        "per-group int32 dot products of int8 rows xq (M x K, M a multiple of 16) with packed W through the AMX tile "
        "layout and the plain C++ tile engine: (M, K/32 * parts, N), parts 2 for Q6_K tiles (sub-blocks of 16)");
}
