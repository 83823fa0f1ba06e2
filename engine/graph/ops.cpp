#include "engine/graph/ops.hpp"

#include <algorithm>
#include <array>

namespace troupe::graph {

std::string tensor_type::str() const { return std::string(name(type)) + dims.str(); }

namespace {

constexpr std::array<std::string_view, static_cast<std::size_t>(op::delta_rule) + 1> op_names = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "tanh", "erf", "sigmoid", "silu", "gelu_tanh",
    "add", "sub", "mul", "div", "maximum", "minimum", "pow",
    "equal", "less", "less_equal", "greater",
    "where", "cast",
    "reduce_sum", "reduce_max", "reduce_mean", "softmax", "log_softmax", "arg_max",
    "reshape", "transpose", "slice", "concat", "broadcast",
    "matmul", "linear", "gather_rows", "scatter_rows", "rms_norm", "layer_norm", "rope", "attention",
    "all_reduce", "all_gather", "pipe_send", "pipe_recv",
    "top_k", "take_along", "linear_id", "ssm_conv", "ssm_scan", "delta_rule",
};

using infer_result = result<tensor_type, std::string>;

infer_result refuse(std::string why) { return unexpected(std::move(why)); }

bool is_plain(dtype t) { return !is_quantized(t); }
bool is_index(dtype t) { return t == dtype::i32 || t == dtype::i64; }
bool is_kv_element(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::q8_0; }

// A type is well formed when its element count is representable and a block type's last dimension
// holds whole blocks.
bool well_formed(const tensor_type& t) {
  const auto n = t.dims.checked_numel();
  if (!n) return false;
  if (is_quantized(t.type)) {
    if (t.dims.rank() == 0) return false;
    if (t.dims.back() % static_cast<std::int64_t>(info(t.type).block_elems) != 0) return false;
  }
  return storage_bytes(t.type, static_cast<std::uint64_t>(*n)).has_value();
}

std::optional<std::int64_t> norm_axis(std::int64_t axis, std::size_t rank) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= r) return std::nullopt;
  return axis < 0 ? axis + r : axis;
}

// NumPy broadcasting: dimensions align from the right; each pair is equal or one of them is 1.
std::optional<troupe::shape> broadcast_shapes(std::span<const tensor_type> ts) {
  std::size_t rank = 0;
  for (const auto& t : ts) rank = std::max(rank, t.dims.rank());
  std::array<std::int64_t, troupe::shape::max_rank> out{};
  out.fill(1);
  for (const auto& t : ts) {
    const std::size_t off = rank - t.dims.rank();
    for (std::size_t i = 0; i < t.dims.rank(); ++i) {
      const std::int64_t d = t.dims[i];
      std::int64_t& o = out[off + i];
      if (d == o || d == 1) continue;
      if (o == 1) { o = d; continue; }
      return std::nullopt;
    }
  }
  return troupe::shape(std::span<const std::int64_t>(out.data(), rank));
}

std::string types_str(std::span<const tensor_type> ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "" : ", ") + t.str();
  return s;
}

troupe::shape reduced(const troupe::shape& s, std::int64_t axis, bool keepdim) {
  std::vector<std::int64_t> d;
  for (std::size_t i = 0; i < s.rank(); ++i) {
    if (static_cast<std::int64_t>(i) == axis) {
      if (keepdim) d.push_back(1);
    } else {
      d.push_back(s[i]);
    }
  }
  return troupe::shape(std::span<const std::int64_t>(d));
}

infer_result infer_checked(op o, std::span<const tensor_type> in, const op_attrs& a) {
  switch (o) {
    case op::neg: case op::abs:
      if (!is_plain(in[0].type) || in[0].type == dtype::boolean) return refuse("needs a numeric input");
      return in[0];
    case op::exp: case op::log: case op::sqrt: case op::rsqrt: case op::recip: case op::tanh: case op::erf:
    case op::sigmoid: case op::silu: case op::gelu_tanh:
      if (!is_float(in[0].type)) return refuse("needs a float input");
      return in[0];
    case op::add: case op::sub: case op::mul: case op::div: case op::maximum: case op::minimum: case op::pow:
    case op::equal: case op::less: case op::less_equal: case op::greater: {
      if (in[0].type != in[1].type) return refuse("inputs differ in dtype");
      if (!is_plain(in[0].type)) return refuse("block-quantized inputs are weights, not operands");
      if (o == op::pow && !is_float(in[0].type)) return refuse("pow needs float inputs");
      const auto s = broadcast_shapes(in);
      if (!s) return refuse("shapes do not broadcast");
      const bool cmp = o == op::equal || o == op::less || o == op::less_equal || o == op::greater;
      return tensor_type{cmp ? dtype::boolean : in[0].type, *s};
    }
    case op::where: {
      if (in[0].type != dtype::boolean) return refuse("condition must be boolean");
      if (in[1].type != in[2].type || !is_plain(in[1].type)) return refuse("branches must share a plain dtype");
      const auto s = broadcast_shapes(in);
      if (!s) return refuse("shapes do not broadcast");
      return tensor_type{in[1].type, *s};
    }
    case op::cast:
      if (a.to == dtype::q8_0) {  // quantization of each 32-value block of the last axis (a KV cache's rows)
        if (in[0].type != dtype::f32 || in[0].dims.rank() < 1 || in[0].dims.back() % 32 != 0)
          return refuse("a cast to q8_0 takes f32 [..., 32 n]");
        return tensor_type{a.to, in[0].dims};
      }
      if (!is_plain(in[0].type) || !is_plain(a.to)) return refuse("cast is between plain dtypes (or f32 to q8_0)");
      return tensor_type{a.to, in[0].dims};
    case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max:
    case op::softmax: case op::log_softmax: {
      const auto ax = norm_axis(a.axis, in[0].dims.rank());
      if (!ax) return refuse("axis " + std::to_string(a.axis) + " out of range");
      if (!is_plain(in[0].type) || in[0].type == dtype::boolean) return refuse("needs a numeric input");
      if ((o == op::reduce_mean || o == op::softmax || o == op::log_softmax) && !is_float(in[0].type))
        return refuse("needs a float input");
      if (in[0].dims[*ax] == 0 && o != op::reduce_sum) return refuse("reduces an empty axis");
      if (o == op::softmax || o == op::log_softmax) return in[0];
      return tensor_type{o == op::arg_max ? dtype::i32 : in[0].type, reduced(in[0].dims, *ax, a.keepdim)};
    }
    case op::reshape: {
      if (!is_plain(in[0].type)) return refuse("reshape of a block-quantized value");
      const auto n = a.target.checked_numel();
      if (!n || *n != in[0].dims.numel())
        return refuse("target " + a.target.str() + " does not hold " + std::to_string(in[0].dims.numel()) + " elements");
      return tensor_type{in[0].type, a.target};
    }
    case op::transpose: {
      const std::size_t r = in[0].dims.rank();
      if (a.ints.size() != r) return refuse("permutation rank differs from the input's");
      std::vector<bool> seen(r, false);
      std::vector<std::int64_t> d(r);
      for (std::size_t i = 0; i < r; ++i) {
        const auto p = a.ints[i];
        if (p < 0 || p >= static_cast<std::int64_t>(r) || seen[p]) return refuse("not a permutation");
        seen[p] = true;
        d[i] = in[0].dims[p];
      }
      if (!is_plain(in[0].type)) return refuse("transpose of a block-quantized value");
      return tensor_type{in[0].type, troupe::shape(std::span<const std::int64_t>(d))};
    }
    case op::slice: {
      const auto ax = norm_axis(a.axis, in[0].dims.rank());
      if (!ax) return refuse("axis out of range");
      if (a.ints.size() != 2) return refuse("slice needs [begin, end)");
      if (!is_plain(in[0].type)) return refuse("slice of a block-quantized value");
      const auto b = a.ints[0], e = a.ints[1];
      if (b < 0 || b > e || e > in[0].dims[*ax]) return refuse("range [" + std::to_string(b) + ", " + std::to_string(e) + ") outside the axis");
      auto s = in[0].dims;
      s[*ax] = e - b;
      return tensor_type{in[0].type, s};
    }
    case op::concat: {
      if (in.empty()) return refuse("concat of nothing");
      const auto ax = norm_axis(a.axis, in[0].dims.rank());
      if (!ax) return refuse("axis out of range");
      auto s = in[0].dims;
      s[*ax] = 0;
      for (const auto& t : in) {
        if (t.type != in[0].type || !is_plain(t.type)) return refuse("inputs differ in dtype");
        if (t.dims.rank() != s.rank()) return refuse("inputs differ in rank");
        for (std::size_t i = 0; i < s.rank(); ++i)
          if (static_cast<std::int64_t>(i) != *ax && t.dims[i] != in[0].dims[i]) return refuse("inputs differ off the axis");
        s[*ax] += t.dims[*ax];
      }
      return tensor_type{in[0].type, s};
    }
    case op::broadcast: {
      const auto& t = in[0].dims;
      if (!is_plain(in[0].type)) return refuse("broadcast of a block-quantized value");
      if (a.target.rank() < t.rank()) return refuse("target has lower rank");
      const std::size_t off = a.target.rank() - t.rank();
      for (std::size_t i = 0; i < t.rank(); ++i)
        if (t[i] != 1 && t[i] != a.target[off + i]) return refuse(t.str() + " does not broadcast to " + a.target.str());
      if (!a.target.checked_numel()) return refuse("target too large");
      return tensor_type{in[0].type, a.target};
    }
    case op::matmul: {
      const auto &x = in[0].dims, &y = in[1].dims;
      if (!is_float(in[0].type) || in[0].type != in[1].type) return refuse("needs float inputs of one dtype");
      if (x.rank() < 2 || x.rank() != y.rank()) return refuse("needs equal ranks of at least 2");
      for (std::size_t i = 0; i + 2 < x.rank(); ++i)
        if (x[i] != y[i]) return refuse("batch dimensions differ");
      if (x[x.rank() - 1] != y[y.rank() - 2]) return refuse("inner dimensions differ");
      auto s = x;
      s[s.rank() - 1] = y[y.rank() - 1];
      return tensor_type{in[0].type, s};
    }
    case op::linear: {
      const auto &x = in[0].dims, &w = in[1].dims;
      if (!is_float(in[0].type)) return refuse("activations must be float");
      if (is_integer(in[1].type)) return refuse("weights must be float or block-quantized");
      if (x.rank() < 1 || w.rank() != 2) return refuse("needs x [..., K] and w [N, K]");
      if (w[1] != x.back()) return refuse("w " + w.str() + " does not take K = " + std::to_string(x.back()));
      return tensor_type{in[0].type, x.with_back(w[0])};
    }
    case op::gather_rows: {
      const auto &t = in[0].dims, &ids = in[1].dims;
      if (t.rank() != 2) return refuse("table must be [R, C]");
      if (!is_index(in[1].type)) return refuse("ids must be i32 or i64");
      if (ids.rank() + 1 > troupe::shape::max_rank) return refuse("ids rank too high");
      std::vector<std::int64_t> d(ids.dims().begin(), ids.dims().end());
      d.push_back(t[1]);
      return tensor_type{is_integer(in[0].type) ? in[0].type : dtype::f32, troupe::shape(std::span<const std::int64_t>(d))};
    }
    case op::scatter_rows: {
      const auto &d = in[0].dims, &ids = in[1].dims, &s = in[2].dims;
      if (in[0].type != in[2].type || (!is_plain(in[0].type) && in[0].type != dtype::q8_0))
        return refuse("dst and src must share a plain dtype (or q8_0)");
      if (in[0].type == dtype::q8_0 && (d.rank() < 2 || d.back() % 32 != 0)) return refuse("q8_0 rows must be [R, ..., 32 n]");
      if (!is_index(in[1].type) || ids.rank() != 1) return refuse("ids must be i32 or i64 [N]");
      if (d.rank() < 1 || s.rank() != d.rank() || s[0] != ids[0]) return refuse("src must be [N, ...] like dst's rows");
      for (std::size_t i = 1; i < d.rank(); ++i)
        if (s[i] != d[i]) return refuse("src rows differ from dst rows");
      return in[0];
    }
    case op::rms_norm: case op::layer_norm: {
      if (!is_float(in[0].type) || in[0].dims.rank() < 1) return refuse("x must be float [..., N]");
      for (std::size_t i = 1; i < in.size(); ++i)
        if (!is_float(in[i].type) || in[i].dims != troupe::shape{in[0].dims.back()}) return refuse("weight and bias must be float [N]");
      if (!(a.eps >= 0)) return refuse("eps must be non-negative");
      return in[0];
    }
    case op::rope: {
      const auto &x = in[0].dims, &p = in[1].dims, &f = in[2].dims;
      if (!is_float(in[0].type) || x.rank() != 3) return refuse("x must be float [T, H, D]");
      if (!is_index(in[1].type) || p != troupe::shape{x[0]}) return refuse("positions must be i32 or i64 [T]");
      if (in[2].type != dtype::f32 || f.rank() != 1 || 2 * f[0] > x[2]) return refuse("inv_freq must be f32 [R/2] with R <= D");
      return in[0];
    }
    case op::attention: {
      if (in.size() < 5 || in.size() > 7) return refuse("takes 5 inputs (6 with sinks, 7 with ALiBi slopes and distances)");
      const auto &q = in[0].dims, &k = in[1].dims, &v = in[2].dims, &ix = in[3].dims, &m = in[4].dims;
      if (in.size() >= 6 && (in[5].type != dtype::f32 || in[5].dims != troupe::shape{q.rank() == 3 ? q[1] : 0}))
        return refuse(in.size() == 6 ? "sinks must be f32 [Hq]" : "ALiBi slopes must be f32 [Hq]");
      if (in.size() == 7 && (in[6].type != dtype::f32 || in[6].dims != m)) return refuse("ALiBi distances must be f32 [R, T, C], as allow");
      if (!is_float(in[0].type)) return refuse("q must be float");
      for (int i : {1, 2}) {
        const auto t = in[static_cast<std::size_t>(i)].type;
        if (t != in[0].type && !(in[0].type == dtype::f32 && is_kv_element(t)))
          return refuse("k and v must have q's dtype, or be f16, bf16 or q8_0 (a KV cache's types) beside f32 queries");
      }
      if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3) return refuse("q must be [N, Hq, D], k and v [S, Hkv, D]");
      if ((in[1].type == dtype::q8_0 && k[2] % 32 != 0) || (in[2].type == dtype::q8_0 && v[2] % 32 != 0))
        return refuse("q8_0 keys and values hold whole 32-value blocks per head");
      if (k[2] != q[2] || v[0] != k[0] || v[1] != k[1]) return refuse("q, k, v disagree");
      if (k[1] == 0 || q[1] % k[1] != 0) return refuse("query heads must be a multiple of kv heads");
      if (!is_index(in[3].type) || ix.rank() != 2) return refuse("index must be i32 or i64 [R, C]");
      if (in[4].type != dtype::boolean || m.rank() != 3 || m[0] != ix[0] || m[2] != ix[1]) return refuse("allow must be boolean [R, T, C]");
      if (m[0] * m[1] != q[0]) return refuse("q must hold R x T tokens");
      if (a.softcap < 0) return refuse("softcap must be non-negative");
      if (a.ints.size() > 1 || (a.ints.size() == 1 && (a.ints[0] < 1 || a.ints[0] > v[2])))
        return refuse("ints, when given, must hold the value width, in [1, v's last dimension]");
      return tensor_type{in[0].type, troupe::shape{q[0], q[1], a.ints.empty() ? v[2] : a.ints[0]}};
    }
    case op::all_reduce:
      if (in[0].type != dtype::f32) return refuse("x must be f32");
      return in[0];
    case op::all_gather: {
      if (in[0].type != dtype::f32 || in[0].dims.rank() < 1) return refuse("x must be f32 [..., C]");
      if (a.ints.size() != 1 || a.ints[0] < 1 || a.ints[0] > 4096) return refuse("ints must hold the group size, in [1, 4096]");
      std::vector<std::int64_t> d(in[0].dims.dims().begin(), in[0].dims.dims().end());
      d.back() *= a.ints[0];
      return tensor_type{dtype::f32, troupe::shape(std::span<const std::int64_t>(d))};
    }
    case op::pipe_send:
      if (in[0].type != dtype::f32) return refuse("x must be f32");
      if (a.ints.size() != 1 || a.ints[0] < 0 || a.ints[0] > 4096) return refuse("ints must hold the peer stage, in [0, 4096]");
      return in[0];
    case op::pipe_recv:
      if (a.ints.size() != 1 || a.ints[0] < 0 || a.ints[0] > 4096) return refuse("ints must hold the peer stage, in [0, 4096]");
      return tensor_type{dtype::f32, a.target};
    case op::ssm_conv: {
      if (in.size() != 6) return refuse("takes 6 inputs: x, state, rows, pos, write, w");
      const auto &x = in[0].dims, &st = in[1].dims, &w = in[5].dims;
      if (in[0].type != dtype::f32 || x.rank() != 3) return refuse("x must be f32 [R, T, C]");
      const std::int64_t R = x[0], T = x[1], C = x[2];
      if (in[5].type != dtype::f32 || w.rank() != 2 || w[0] != C || w[1] < 1 || w[1] > 64) return refuse("w must be f32 [C, K], K in [1, 64]");
      const std::int64_t K = w[1];
      if (in[1].type != dtype::f32 || st.rank() != 2 || st[1] != (K - 1) * C) return refuse("state must be f32 [S, (K-1) C]");
      if (!is_index(in[2].type) || in[2].dims != troupe::shape{R}) return refuse("rows must be integer [R]");
      if (in[3].type != dtype::i32 || in[3].dims != troupe::shape{R * T} || in[4].type != dtype::i32 || in[4].dims != troupe::shape{R * T})
        return refuse("pos and write must be i32 [R T]");
      return tensor_type{dtype::f32, troupe::shape{R, T * C + (K - 1) * C}};
    }
    case op::ssm_scan: {
      if (in.size() != 9) return refuse("takes 9 inputs: x, dt, A, B, C, state, rows, pos, write");
      for (int k : {0, 1, 2, 3, 4, 5})
        if (in[static_cast<std::size_t>(k)].type != dtype::f32) return refuse("x, dt, A, B, C and state must be f32");
      const auto &x = in[0].dims, &dt = in[1].dims, &A = in[2].dims, &B = in[3].dims, &Cm = in[4].dims, &st = in[5].dims;
      if (x.rank() != 4) return refuse("x must be [R, T, H, P]");
      const std::int64_t R = x[0], T = x[1], H = x[2], P = x[3];
      if (dt != troupe::shape{R, T, H} || A != troupe::shape{H}) return refuse("dt must be [R, T, H] and A [H]");
      if (B.rank() != 4 || B[0] != R || B[1] != T || B != Cm || B[2] < 1 || H % B[2] != 0) return refuse("B and C must be [R, T, G, N] with G dividing H");
      const std::int64_t N = B[3];
      if (st.rank() != 2 || st[1] != H * P * N) return refuse("state must be [S, H P N]");
      if (!is_index(in[6].type) || in[6].dims != troupe::shape{R}) return refuse("rows must be integer [R]");
      if (in[7].type != dtype::i32 || in[7].dims != troupe::shape{R * T} || in[8].type != dtype::i32 || in[8].dims != troupe::shape{R * T})
        return refuse("pos and write must be i32 [R T]");
      return tensor_type{dtype::f32, troupe::shape{R, T * H * P + H * P * N}};
    }
    case op::delta_rule: {
      if (in.size() != 9) return refuse("takes 9 inputs: q, k, v, g, beta, state, rows, pos, write");
      for (int k : {0, 1, 2, 3, 4, 5})
        if (in[static_cast<std::size_t>(k)].type != dtype::f32) return refuse("q, k, v, g, beta and state must be f32");
      const auto &q = in[0].dims, &k = in[1].dims, &v = in[2].dims, &g = in[3].dims, &be = in[4].dims, &st = in[5].dims;
      if (q.rank() != 4 || k != q) return refuse("q and k must be [R, T, Hk, Dk]");
      const std::int64_t R = q[0], T = q[1], Hk = q[2], Dk = q[3];
      if (v.rank() != 4 || v[0] != R || v[1] != T || v[2] < 1 || v[2] % Hk != 0) return refuse("v must be [R, T, H, Dv] with Hk dividing H");
      const std::int64_t H = v[2], Dv = v[3];
      if (g != troupe::shape{R, T, H} || be != g) return refuse("g and beta must be [R, T, H]");
      if (st.rank() != 2 || st[1] != H * Dv * Dk) return refuse("state must be [S, H Dv Dk]");
      if (!is_index(in[6].type) || in[6].dims != troupe::shape{R}) return refuse("rows must be integer [R]");
      if (in[7].type != dtype::i32 || in[7].dims != troupe::shape{R * T} || in[8].type != dtype::i32 || in[8].dims != troupe::shape{R * T})
        return refuse("pos and write must be i32 [R T]");
      return tensor_type{dtype::f32, troupe::shape{R, T * H * Dv + H * Dv * Dk}};
    }
    case op::top_k: {
      const auto& x = in[0].dims;
      if (!is_float(in[0].type) || x.rank() < 1) return refuse("x must be float [..., E]");
      if (a.ints.size() != 1 || a.ints[0] < 1 || a.ints[0] > x.back()) return refuse("ints must hold k, in [1, E]");
      return tensor_type{dtype::i32, x.with_back(a.ints[0])};
    }
    case op::take_along: {
      const auto &x = in[0].dims, &ix = in[1].dims;
      if (!is_plain(in[0].type) || x.rank() < 1) return refuse("x must be a plain dtype [..., E]");
      if (!is_index(in[1].type) || ix.rank() != x.rank()) return refuse("idx must be i32 or i64 of x's rank");
      for (std::size_t i = 0; i + 1 < x.rank(); ++i)
        if (x[i] != ix[i]) return refuse("leading dimensions differ");
      return tensor_type{in[0].type, ix};
    }
    case op::linear_id: {
      const auto &x = in[0].dims, &w = in[1].dims, &ids = in[2].dims;
      if (in[0].type != dtype::f32) return refuse("activations must be f32");
      if (is_integer(in[1].type)) return refuse("weights must be float or block-quantized");
      if (w.rank() != 3) return refuse("needs w [E, N, K]");
      if (!is_index(in[2].type) || ids.rank() != 2) return refuse("ids must be i32 or i64 [T, k]");
      const bool shared = x.rank() == 2 && x[0] == ids[0];
      const bool per_pick = x.rank() == 3 && x[0] == ids[0] && x[1] == ids[1];
      if (!shared && !per_pick) return refuse("x must be [T, K] or [T, k, K] for ids [T, k]");
      if (x.back() != w[2]) return refuse("w " + w.str() + " does not take K = " + std::to_string(x.back()));
      return tensor_type{dtype::f32, troupe::shape{ids[0], ids[1], w[1]}};
    }
  }
  return refuse("unknown op");
}

}  // namespace

std::string_view op_name(op o) {
  const auto i = static_cast<std::size_t>(o);
  return i < op_names.size() ? op_names[i] : "unknown";
}

int arity(op o) {
  switch (o) {
    case op::add: case op::sub: case op::mul: case op::div: case op::maximum: case op::minimum: case op::pow:
    case op::equal: case op::less: case op::less_equal: case op::greater:
    case op::matmul: case op::linear: case op::gather_rows: case op::rms_norm:
      return 2;
    case op::take_along:
      return 2;
    case op::where: case op::scatter_rows: case op::layer_norm: case op::rope: case op::linear_id:
      return 3;
    case op::attention:
      return -1;  // 5, 6 with sinks or 7 with ALiBi: checked by its shape rule
    case op::ssm_conv:
    case op::ssm_scan:
    case op::delta_rule:
      return -1;  // 6, 9 and 9: checked by their shape rules
    case op::concat:
      return -1;
    case op::pipe_recv:
      return 0;
    default:
      return 1;
  }
}

result<tensor_type, std::string> infer(op o, std::span<const tensor_type> inputs, const op_attrs& attrs) {
  if (static_cast<std::size_t>(o) >= op_names.size()) return refuse("unknown op");
  const int n = arity(o);
  if (n >= 0 && inputs.size() != static_cast<std::size_t>(n))
    return refuse("takes " + std::to_string(n) + " inputs, got " + std::to_string(inputs.size()));
  for (const auto& t : inputs)
    if (!well_formed(t)) return refuse("ill-formed input type " + t.str());
  auto r = infer_checked(o, inputs, attrs);
  if (!r) return refuse(r.error() + " (inputs: " + types_str(inputs) + ")");
  if (!well_formed(*r)) return refuse("output type " + r->str() + " is ill-formed");
  return r;
}

}  // namespace troupe::graph
