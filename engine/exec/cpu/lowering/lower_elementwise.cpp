// Elementwise: unary and binary arithmetic, comparisons, where, cast (the fused residual and gated epilogues of a linear start here).
#include "engine/exec/cpu/lowering/lower.hpp"

#include "engine/core/half.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

namespace troupe::exec::cpu::lowering {

namespace {

// The vector kernel's kind for an f32 arithmetic op; none for comparisons and pow.
std::optional<binary_kind> float_binary(op o) {
  switch (o) {
    case op::add: return binary_kind::add;
    case op::sub: return binary_kind::sub;
    case op::mul: return binary_kind::mul;
    case op::div: return binary_kind::div;
    case op::maximum: return binary_kind::maximum;
    case op::minimum: return binary_kind::minimum;
    default: return std::nullopt;
  }
}

// A broadcast binary op's walk, collapsed: runs of output dims that both operands step through alike
// merge into one (size-1 dims drop out), so [N, H, P] * [H, 1] becomes N x H runs of P, each with b one
// value. The innermost dim is the run the vector kernel takes (each operand contiguous over it or
// one value); the outer dims, with each operand's stride, enumerate the runs.
struct broadcast_walk {
  std::vector<std::int64_t> dims, sa, sb;  // the outer dims, outermost first, and each operand's strides
  std::int64_t inner = 1, runs = 1;
  bool scalar_a = false, scalar_b = false;
};

std::optional<broadcast_walk> collapse_broadcast(const troupe::shape& out, const std::vector<std::int64_t>& sa,
                                                 const std::vector<std::int64_t>& sb) {
  struct group {
    std::int64_t n, a, b;  // size, and each operand's stride over it
  };
  std::vector<group> gs;  // innermost first
  for (std::size_t d = out.rank(); d-- > 0;) {
    const std::int64_t n = out[d];
    if (n == 1) continue;
    if (!gs.empty() && sa[d] == gs.back().a * gs.back().n && sb[d] == gs.back().b * gs.back().n) {
      gs.back().n *= n;
      continue;
    }
    gs.push_back({n, sa[d], sb[d]});
  }
  broadcast_walk w;
  if (gs.empty()) return w;  // one element: a run of 1 with both operands at offset 0
  const auto& in = gs.front();
  if ((in.a != 0 && in.a != 1) || (in.b != 0 && in.b != 1)) return std::nullopt;  // not a contiguous layout
  w.inner = in.n;
  w.scalar_a = in.a == 0;
  w.scalar_b = in.b == 0;
  for (std::size_t i = gs.size(); i-- > 1;) {
    w.dims.push_back(gs[i].n);
    w.sa.push_back(gs[i].a);
    w.sb.push_back(gs[i].b);
    w.runs *= gs[i].n;
  }
  return w;
}

// Calls run(offset in a, offset in b, offset out, length) over the walk's runs, split over the pool in
// whole runs (a long single run splits inside itself).
template <class F>
void run_broadcast(const broadcast_walk& w, thread_pool& pool, F&& run) {
  if (w.runs == 1) {
    split_range(pool, w.inner, 16384, 64, [&](std::int64_t f, std::int64_t l) {
      run(w.scalar_a ? 0 : f, w.scalar_b ? 0 : f, f, l - f);
    });
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(w.inner, 1));
  split_range(pool, w.runs, grain, 1, [&](std::int64_t first, std::int64_t last) {
    const std::size_t m = w.dims.size();
    std::array<std::int64_t, 8> small{};  // a step's tensors have few dims: no allocation per op
    std::vector<std::int64_t> big(m > small.size() ? m : 0);
    std::int64_t* idx = m > small.size() ? big.data() : small.data();
    std::int64_t oa = 0, ob = 0, rest = first;
    for (std::size_t d = m; d-- > 0;) {
      idx[d] = rest % w.dims[d];
      rest /= w.dims[d];
      oa += idx[d] * w.sa[d];
      ob += idx[d] * w.sb[d];
    }
    for (std::int64_t r = first; r < last; ++r) {
      run(oa, ob, r * w.inner, w.inner);
      for (std::size_t d = m; d-- > 0;) {
        oa += w.sa[d];
        ob += w.sb[d];
        if (++idx[d] < w.dims[d]) break;
        oa -= w.sa[d] * w.dims[d];
        ob -= w.sb[d] * w.dims[d];
        idx[d] = 0;
      }
    }
  });
}

// Comparisons and minimum/maximum over integer and boolean operands (masks: a prefill's [T, C] causal
// mask is T x C of them) along the walk's runs, split over the pool, each run a plain loop over typed
// values that the compiler vectorizes. The per-element load_any/store_element walk took about 7 ns an
// element: half a second a layer-shared mask at 8192 tokens.
template <class In, class Out, class F>
void typed_binary(const broadcast_walk& w, thread_pool& pool, const std::byte* a, const std::byte* b, std::byte* out, F f) {
  const auto* pa = reinterpret_cast<const In*>(a);
  const auto* pb = reinterpret_cast<const In*>(b);
  auto* po = reinterpret_cast<Out*>(out);
  run_broadcast(w, pool, [&](std::int64_t oa, std::int64_t ob, std::int64_t o, std::int64_t len) {
    const In* x = pa + oa;
    const In* y = pb + ob;
    Out* z = po + o;
    if (w.scalar_a && w.scalar_b) {
      const Out v = f(x[0], y[0]);
      for (std::int64_t j = 0; j < len; ++j) z[j] = v;
    } else if (w.scalar_a) {
      const In xv = x[0];
      for (std::int64_t j = 0; j < len; ++j) z[j] = f(xv, y[j]);
    } else if (w.scalar_b) {
      const In yv = y[0];
      for (std::int64_t j = 0; j < len; ++j) z[j] = f(x[j], yv);
    } else {
      for (std::int64_t j = 0; j < len; ++j) z[j] = f(x[j], y[j]);
    }
  });
}

// The typed form of a comparison or minimum/maximum whose operands are both i32, i64 or boolean (the
// result boolean for a comparison, else the operands' type); nullptr where the generic walk applies.
template <class In>
std::function<void(thread_pool&)> integer_binary(op code, dtype out_type, const broadcast_walk& w, const std::byte* a,
                                                 const std::byte* b, std::byte* out) {
  using B = std::uint8_t;
  const bool cmp = code == op::equal || code == op::less || code == op::less_equal || code == op::greater;
  if (cmp && out_type != dtype::boolean) return nullptr;
  if constexpr (std::is_same_v<In, B>)
    if (cmp) return nullptr;  // booleans compare as 0/1 whatever byte holds them: the generic walk
  switch (code) {
    case op::equal: return [=](thread_pool& p) { typed_binary<In, B>(w, p, a, b, out, [](In x, In y) { return B(x == y); }); };
    case op::less: return [=](thread_pool& p) { typed_binary<In, B>(w, p, a, b, out, [](In x, In y) { return B(x < y); }); };
    case op::less_equal: return [=](thread_pool& p) { typed_binary<In, B>(w, p, a, b, out, [](In x, In y) { return B(x <= y); }); };
    case op::greater: return [=](thread_pool& p) { typed_binary<In, B>(w, p, a, b, out, [](In x, In y) { return B(x > y); }); };
    case op::minimum:
    case op::maximum: {
      const bool lo = code == op::minimum;
      if constexpr (std::is_same_v<In, B>) {  // boolean: stored 0/1, read as any byte != 0
        if (lo) return [=](thread_pool& p) { typed_binary<B, B>(w, p, a, b, out, [](B x, B y) { return B((x != 0) & (y != 0)); }); };
        return [=](thread_pool& p) { typed_binary<B, B>(w, p, a, b, out, [](B x, B y) { return B((x != 0) | (y != 0)); }); };
      } else {
        if (lo) return [=](thread_pool& p) { typed_binary<In, In>(w, p, a, b, out, [](In x, In y) { return x < y ? x : y; }); };
        return [=](thread_pool& p) { typed_binary<In, In>(w, p, a, b, out, [](In x, In y) { return x < y ? y : x; }); };
      }
    }
    default: return nullptr;
  }
}

}  // namespace

instr lower_elementwise(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  auto lower_linear = [&c](const graph::equation& le, float* y, const float* r) { return lower_linear_into(c, le, y, r); };
  switch (e.code) {
    case op::neg: case op::abs: case op::exp: case op::log: case op::sqrt: case op::rsqrt: case op::recip: case op::tanh:
    case op::erf: case op::sigmoid: case op::silu: case op::gelu_tanh: {
      const auto* x = P(e.inputs[0]);
      if (ot.type == dtype::f32) {
        const auto k = to_unary(e.code);
        return [=]() -> std::optional<exec_error> {
          unary(k, reinterpret_cast<const float*>(x), n, reinterpret_cast<float*>(out), lv);
          return std::nullopt;
        };
      }
      const auto code = e.code;
      const auto t = ot.type;
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t j = 0; j < n; ++j) {
          const double v = load_any(t, x, j);
          store_element(t, out, j, code == op::neg ? -v : std::fabs(v));
        }
        return std::nullopt;
      };
    }
    case op::add: case op::sub: case op::mul: case op::div: case op::maximum: case op::minimum: case op::pow:
    case op::equal: case op::less: case op::less_equal: case op::greater: {
      const auto& at = T(e.inputs[0]);
      const auto& bt = T(e.inputs[1]);
      if (residual_of[i] >= 0) {
        const auto side = static_cast<std::size_t>(residual_of[i]);
        const auto& le = g.equations()[static_cast<std::size_t>(en.tp.residual_linear[i])];
        return lower_linear(le, reinterpret_cast<float*>(out), reinterpret_cast<const float*>(P(e.inputs[1 - side])));
      }
      // A gated feed-forward's middle: act(g) * u in one pass.
      if (gated_of[i] >= 0) {
        const auto& ae = g.equations()[static_cast<std::size_t>(gated_of[i])];
        const auto* gp = reinterpret_cast<const float*>(P(ae.inputs[0]));
        const auto* up = reinterpret_cast<const float*>(P(e.inputs[0] == ae.out ? e.inputs[1] : e.inputs[0]));
        const auto k = to_unary(ae.code);
        return [=]() -> std::optional<exec_error> {
          split_range(*pool_ptr, n, 8192, 64, [&](std::int64_t f, std::int64_t l) { gated(k, gp + f, up + f, l - f, reinterpret_cast<float*>(out) + f, lv); });
          return std::nullopt;
        };
      }
      const auto* a = P(e.inputs[0]);
      const auto* b = P(e.inputs[1]);
      const auto code = e.code;
      const auto kind = float_binary(code);
      if (at.type == dtype::f32 && bt.type == dtype::f32 && ot.type == dtype::f32 && kind) {
        const auto plan = collapse_broadcast(ot.dims, broadcast_strides(at.dims, ot.dims), broadcast_strides(bt.dims, ot.dims));
        if (plan) {
          const auto* fa = reinterpret_cast<const float*>(a);
          const auto* fb = reinterpret_cast<const float*>(b);
          auto* fo = reinterpret_cast<float*>(out);
          const auto k = *kind;
          return [=]() -> std::optional<exec_error> {
            run_broadcast(*plan, *pool_ptr, [&](std::int64_t oa, std::int64_t ob, std::int64_t o, std::int64_t len) {
              binary(k, fa + oa, plan->scalar_a, fb + ob, plan->scalar_b, len, fo + o, lv);
            });
            return std::nullopt;
          };
        }
      }
      const bool cmp_code = code == op::equal || code == op::less || code == op::less_equal || code == op::greater;
      if (at.type == bt.type && (at.type == dtype::i32 || at.type == dtype::i64 || at.type == dtype::boolean) &&
          (cmp_code || ot.type == at.type)) {
        if (const auto plan = collapse_broadcast(ot.dims, broadcast_strides(at.dims, ot.dims), broadcast_strides(bt.dims, ot.dims))) {
          std::function<void(thread_pool&)> run;
          if (at.type == dtype::i32) run = integer_binary<std::int32_t>(code, ot.type, *plan, a, b, out);
          else if (at.type == dtype::i64) run = integer_binary<std::int64_t>(code, ot.type, *plan, a, b, out);
          else run = integer_binary<std::uint8_t>(code, ot.type, *plan, a, b, out);
          if (run)
            return [=]() -> std::optional<exec_error> {
              run(*pool_ptr);
              return std::nullopt;
            };
        }
      }
      const std::array<std::vector<std::int64_t>, 2> st = {broadcast_strides(at.dims, ot.dims), broadcast_strides(bt.dims, ot.dims)};
      const auto ta = at.type, tout = ot.type;
      const auto odims = ot.dims;
      return [=]() -> std::optional<exec_error> {
        std::optional<exec_error> bad;
        for_each_broadcast<2>(odims, st, [&](std::int64_t j, const std::array<std::int64_t, 2>& off) {
          const double x = load_any(ta, a, off[0]), y = load_any(ta, b, off[1]);
          double r;
          switch (code) {
            case op::equal: r = x == y; break;
            case op::less: r = x < y; break;
            case op::less_equal: r = x <= y; break;
            case op::greater: r = x > y; break;
            case op::pow: r = std::pow(x, y); break;
            case op::div:
              if (is_integer(ta)) {
                if (y == 0) { bad = exec_error{exec_error_code::index_out_of_range, where, "integer division by zero"}; r = 0; break; }
                r = std::trunc(x / y);
              } else {
                r = x / y;
              }
              break;
            default: r = apply_binary(code, x, y);
          }
          store_element(tout, out, j, r);
        });
        return bad;
      };
    }
    case op::where: {
      const std::array<std::vector<std::int64_t>, 3> st = {broadcast_strides(T(e.inputs[0]).dims, ot.dims),
                                                           broadcast_strides(T(e.inputs[1]).dims, ot.dims),
                                                           broadcast_strides(T(e.inputs[2]).dims, ot.dims)};
      const auto *c = P(e.inputs[0]), *a = P(e.inputs[1]), *b = P(e.inputs[2]);
      const auto t = ot.type;
      const auto odims = ot.dims;
      return [=]() -> std::optional<exec_error> {
        for_each_broadcast<3>(odims, st, [&](std::int64_t j, const std::array<std::int64_t, 3>& off) {
          store_element(t, out, j, c[off[0]] != std::byte{0} ? load_any(t, a, off[1]) : load_any(t, b, off[2]));
        });
        return std::nullopt;
      };
    }
    case op::cast: {
      const auto* x = P(e.inputs[0]);
      const auto from = T(e.inputs[0]).type, to = ot.type;
      // The KV cache's writes (f32 rows to f16, bf16 or q8_0), split over the pool in whole rows.
      if (from == dtype::f32 && (to == dtype::f16 || to == dtype::bf16 || to == dtype::q8_0)) {
        const std::int64_t row = ot.dims.rank() ? ot.dims.back() : 1, rows = row ? n / row : 0;
        const auto rb = static_cast<std::int64_t>(*storage_bytes(to, static_cast<std::uint64_t>(row)));
        return [=]() -> std::optional<exec_error> {
          const auto* src = reinterpret_cast<const float*>(x);
          const std::int64_t per = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(row, 1));
          pool_ptr->parallel_for((rows + per - 1) / per, [&](std::int64_t c, int) {
            for (std::int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
              const float* xr = src + r * row;
              std::byte* yr = out + r * rb;
              if (to == dtype::f16) {
                to_f16(xr, row, reinterpret_cast<std::uint16_t*>(yr), lv);
              } else if (to == dtype::bf16) {
                auto* h = reinterpret_cast<std::uint16_t*>(yr);
                for (std::int64_t j = 0; j < row; ++j) h[j] = f32_to_bf16(xr[j]);
              } else {
                (void)quantize_row(dtype::q8_0, xr, yr, row);  // whole blocks: the op's type check
              }
            }
          });
          return std::nullopt;
        };
      }
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t j = 0; j < n; ++j) store_element(to, out, j, load_any(from, x, j));
        return std::nullopt;
      };
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

}  // namespace troupe::exec::cpu::lowering
