#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/lowering.hpp"
#include "engine/compile/fusion.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "engine/compile/passes.hpp"
#include "engine/exec/cpu/kernels.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/thread_pool.hpp"


namespace troupe::exec::cpu {

namespace {

using graph::op;
using instr = std::function<std::optional<exec_error>()>;

struct executable {
  const weight_source* weights = nullptr;
  std::map<std::string, tensor> states;
  std::map<std::string, packed_matrix> packed;  // by weight role
  std::map<std::string, std::vector<packed_matrix>> experts;  // a linear_id weight [E, N, K]: one per expert
};

struct entry {
  executable_id exe;
  graph::graph g;
  compile::target_plan tp;  // the pruned graph, its buffer plan and the fusion candidates
  tensor arena;
  std::vector<std::byte*> ptr;  // per value
  std::vector<instr> program;
  std::deque<packed_matrix> own_packed;  // folded weights packed for this entry (stable addresses)
};

std::optional<exec_error> fail(exec_error_code c, std::string where, std::string why) {
  return exec_error{c, std::move(where), std::move(why)};
}

// Calls fn(out_index, in_offsets...) over every element of `out` with per-input strides.
template <std::size_t N, class Fn>
void for_each_broadcast(const troupe::shape& out, const std::array<std::vector<std::int64_t>, N>& strides, Fn&& fn) {
  const std::size_t r = out.rank();
  const std::int64_t n = out.numel();
  if (r == 0) {
    std::array<std::int64_t, N> off{};
    fn(0, off);
    return;
  }
  std::vector<std::int64_t> idx(r, 0);
  std::array<std::int64_t, N> off{};
  for (std::int64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (std::size_t d = r; d-- > 0;) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < out[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      idx[d] = 0;
    }
  }
}

double load_any(dtype t, const std::byte* p, std::int64_t i) {
  switch (t) {
    case dtype::f32: return reinterpret_cast<const float*>(p)[i];
    case dtype::i32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case dtype::i64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
    case dtype::boolean: return p[i] != std::byte{0};
    default: return load_element(t, p, i);
  }
}

template <class T>
T apply_binary(op o, T a, T b) {
  switch (o) {
    case op::add: return a + b;
    case op::sub: return a - b;
    case op::mul: return a * b;
    case op::div: return a / b;
    case op::maximum: return std::isnan(a) || std::isnan(b) ? static_cast<T>(NAN) : std::max(a, b);  // NaN if either is, as the oracle
    case op::minimum: return std::isnan(a) || std::isnan(b) ? static_cast<T>(NAN) : std::min(a, b);
    default: return a;
  }
}

unary_kind to_unary(op o) {
  switch (o) {
    case op::neg: return unary_kind::neg;
    case op::abs: return unary_kind::abs;
    case op::exp: return unary_kind::exp;
    case op::log: return unary_kind::log;
    case op::sqrt: return unary_kind::sqrt;
    case op::rsqrt: return unary_kind::rsqrt;
    case op::recip: return unary_kind::recip;
    case op::tanh: return unary_kind::tanh;
    case op::erf: return unary_kind::erf;
    case op::sigmoid: return unary_kind::sigmoid;
    case op::silu: return unary_kind::silu;
    default: return unary_kind::gelu_tanh;
  }
}

}  // namespace

struct cpu_executor::impl {
  cpu_options opt;
  isa level;
  thread_pool pool;
  std::vector<std::unique_ptr<executable>> exes;
  std::vector<std::unique_ptr<entry>> entries;
  // Guards what memory() reads (the executables, entries, states and packed weights) against load()
  // and add_entry() growing them: memory() is asked from other actors' threads while the driver's
  // thread compiles. Steps only read the structure, so they take no lock.
  mutable std::mutex structure;

  explicit impl(cpu_options o) : opt(o), level(o.level && usable(*o.level) ? *o.level : best_isa()), pool(o.threads) {}

  result<void, exec_error> lower(entry& en, executable& ex);
  instr lower_eqn(entry& en, executable& ex, std::size_t i,
                  const std::vector<std::int64_t>& residual_of, const std::vector<std::int64_t>& gated_of,
                  std::optional<exec_error>& err);
};

double logprob_bound(dtype weights) {
  switch (weights) {
    case dtype::f32: case dtype::f16: return 2e-4;
    case dtype::bf16: return 4e-2;
    default: return packable(weights) ? 0.25 : 1e-2;
  }
}

cpu_executor::cpu_executor(cpu_options opt) : impl_(std::make_unique<impl>(opt)) {}
cpu_executor::~cpu_executor() = default;
isa cpu_executor::level() const { return impl_->level; }
int cpu_executor::threads() const { return impl_->pool.size(); }
std::size_t cpu_executor::kernel_calls(entry_id entry) const {
  return entry.value < impl_->entries.size() ? impl_->entries[entry.value]->program.size() : 0;
}

result<executable_id, exec_error> cpu_executor::load(const weight_source& weights) {
  const std::lock_guard lock(impl_->structure);
  auto ex = std::make_unique<executable>();
  ex->weights = &weights;
  impl_->exes.push_back(std::move(ex));
  return executable_id{static_cast<std::uint32_t>(impl_->exes.size() - 1)};
}

result<void, exec_error> cpu_executor::reset_states(executable_id exe) {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  for (auto& [_, t] : impl_->exes[exe.value]->states) std::memset(t.data(), 0, t.bytes());
  return {};
}

result<tensor, exec_error> cpu_executor::read_state(executable_id exe, const std::string& name) const {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  const auto& st = impl_->exes[exe.value]->states;
  const auto it = st.find(name);
  if (it == st.end()) return unexpected(exec_error{exec_error_code::unknown_id, "state " + name, "no entry declares it"});
  return it->second;
}

memory_report cpu_executor::memory() const {
  const std::lock_guard lock(impl_->structure);
  memory_report m;
  for (const auto& ex : impl_->exes) {
    for (const auto& [_, t] : ex->states) m.state_bytes += t.bytes();
    for (const auto& [_, p] : ex->packed) m.weight_bytes += p.bytes();
    for (const auto& [_, ps] : ex->experts)
      for (const auto& p : ps) m.weight_bytes += p.bytes();
  }
  for (const auto& en : impl_->entries) {
    m.scratch_bytes += en->arena.bytes();
    for (const auto& [_, t] : en->tp.pruned.folded) m.weight_bytes += t.bytes();
    for (const auto& p : en->own_packed) m.weight_bytes += p.bytes();
  }
  return m;
}

result<entry_id, exec_error> cpu_executor::add_entry(executable_id exe, const graph::graph& g) {
  const std::lock_guard lock(impl_->structure);
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  auto& ex = *impl_->exes[exe.value];
  auto en = std::make_unique<entry>();
  en->exe = exe;
  en->g = g;
  const auto& gg = en->g;

  auto planned = compile::plan_for_target(gg, [&](const graph::weight_role& r) { return ex.weights->find(r); });
  if (!planned) {
    const bool missing = planned.error().reason.find("no tensor") != std::string::npos;
    return unexpected(exec_error{missing ? exec_error_code::missing_weight : exec_error_code::unsupported, planned.error().where, planned.error().reason});
  }
  en->tp = std::move(*planned);

  // States: one buffer per name per executable, shared by every entry that declares it.
  for (const auto& s : gg.states()) {
    const auto& t = gg.info(s.in).type;
    if (!computable_type(t.type))
      return unexpected(exec_error{exec_error_code::unsupported, "state " + s.name, "dtype " + std::string(troupe::name(t.type))});
    auto it = ex.states.find(s.name);
    if (it == ex.states.end()) {
      ex.states.emplace(s.name, tensor(t.type, t.dims));
    } else if (it->second.type() != t.type || it->second.shape() != t.dims) {
      return unexpected(exec_error{exec_error_code::state_conflict, "state " + s.name,
                                   "declared " + t.str() + " here and " + graph::tensor_type{it->second.type(), it->second.shape()}.str() + " before"});
    }
  }

  en->arena = tensor(dtype::u8, {std::max<std::int64_t>(en->tp.plan.arena_bytes, 64)});

  // Resolve every value's bytes.
  en->ptr.assign(gg.values().size(), nullptr);
  for (const auto& l : gg.literals()) en->ptr[l.value.index] = const_cast<std::byte*>(l.data.data());
  for (const auto& w : gg.weights()) en->ptr[w.value.index] = const_cast<std::byte*>(ex.weights->find(w.role)->data());
  for (auto& [v, t] : en->tp.pruned.folded) en->ptr[v] = t.data();
  for (const auto& s : gg.states()) en->ptr[s.in.index] = ex.states.at(s.name).data();
  for (std::uint32_t v = 0; v < gg.values().size(); ++v) {
    if (en->tp.plan.kind[v] == compile::storage::arena) en->ptr[v] = en->arena.data() + en->tp.plan.offset[v];
    if (en->tp.plan.kind[v] == compile::storage::alias) en->ptr[v] = en->ptr[en->tp.plan.alias_of[v]];
  }
  if (auto r = impl_->lower(*en, ex); !r) return unexpected(r.error());
  impl_->entries.push_back(std::move(en));
  return entry_id{static_cast<std::uint32_t>(impl_->entries.size() - 1)};
}

result<void, exec_error> cpu_executor::impl::lower(entry& en, executable& ex) {
  const auto& g = en.g;
  if (auto e = check_value_types(g, en.tp.pruned.runs, "CPU")) return unexpected(*e);
  const auto choice = compile::choose_fusions(g, en.tp, en.ptr);
  const auto& fused = choice.fused;
  const auto& residual_of = choice.residual_side;
  const auto& gated_of = choice.gated_of;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!en.tp.pruned.runs[i] || fused[i]) continue;
    std::optional<exec_error> err;
    auto f = lower_eqn(en, ex, i, residual_of, gated_of, err);
    if (err) return unexpected(*err);
    if (f) en.program.push_back(std::move(f));
  }
  return {};
}

instr cpu_executor::impl::lower_eqn(entry& en, executable& ex, std::size_t i,
                                    const std::vector<std::int64_t>& residual_of, const std::vector<std::int64_t>& gated_of,
                                    std::optional<exec_error>& err) {
  const auto& g = en.g;
  const auto& e = g.equations()[i];
  const std::string where = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")";
  auto P = [&](graph::value_id v) { return en.ptr[v.index]; };
  auto T = [&](graph::value_id v) -> const graph::tensor_type& { return g.info(v).type; };
  std::byte* out = P(e.out);
  const auto ot = T(e.out);
  const std::int64_t n = ot.dims.numel();
  const isa lv = level;
  thread_pool* pool_ptr = &pool;

  // A linear as one matmul, storing into y (plus r, the residual epilogue, when set).
  auto lower_linear = [&](const graph::equation& le, float* y, const float* r) -> instr {
    const auto wv = le.inputs[1];
    const auto& wt = T(wv);
    const packed_matrix* pm = nullptr;
    const auto wb = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& w) { return w.value == wv; });
    auto pack = [&](const tensor_view& view) -> std::optional<packed_matrix> {
      auto pk = packed_matrix::pack(view);
      if (!pk) {
        err = exec_error{exec_error_code::unsupported, where, "cannot pack the weight: " + pk.error()};
        return std::nullopt;
      }
      return std::move(*pk);
    };
    if (wb != g.weights().end()) {
      const auto key = wb->role.str();
      auto it = ex.packed.find(key);
      if (it == ex.packed.end()) {
        auto pk = pack(*ex.weights->find(wb->role));
        if (!pk) return nullptr;
        it = ex.packed.emplace(key, std::move(*pk)).first;
      }
      pm = &it->second;
    } else if (en.tp.pruned.constant[wv.index]) {
      auto pk = pack(tensor_view(wt.type, wt.dims, P(wv)));
      if (!pk) return nullptr;
      en.own_packed.push_back(std::move(*pk));
      pm = &en.own_packed.back();
    } else {
      err = exec_error{exec_error_code::unsupported, where, "a linear weight must be known at prepare"};
      return nullptr;
    }
    const std::int64_t K = wt.dims[1], N = wt.dims[0];
    const std::int64_t M = K == 0 ? 0 : T(le.inputs[0]).dims.numel() / K;
    const auto* x = reinterpret_cast<const float*>(P(le.inputs[0]));
    return [=]() -> std::optional<exec_error> {
      matmul(*pm, x, K, M, y, N, *pool_ptr, lv, r, N);
      return std::nullopt;
    };
  };

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
          gated(k, gp, up, n, reinterpret_cast<float*>(out), lv);
          return std::nullopt;
        };
      }
      const auto* a = P(e.inputs[0]);
      const auto* b = P(e.inputs[1]);
      const auto code = e.code;
      if (at.type == dtype::f32 && ot.type == dtype::f32 && code != op::pow) {
        const auto* fa = reinterpret_cast<const float*>(a);
        const auto* fb = reinterpret_cast<const float*>(b);
        auto* fo = reinterpret_cast<float*>(out);
        if (at.dims == ot.dims && bt.dims == ot.dims)
          return [=]() -> std::optional<exec_error> {
            for (std::int64_t j = 0; j < n; ++j) fo[j] = apply_binary(code, fa[j], fb[j]);
            return std::nullopt;
          };
        if (at.dims == ot.dims && bt.dims.numel() == 1)
          return [=]() -> std::optional<exec_error> {
            const float s = fb[0];
            for (std::int64_t j = 0; j < n; ++j) fo[j] = apply_binary(code, fa[j], s);
            return std::nullopt;
          };
        if (at.dims == ot.dims && bt.dims.rank() >= 1 && ot.dims.rank() >= 1 && bt.dims.numel() == ot.dims.back() &&
            bt.dims.back() == ot.dims.back()) {
          const std::int64_t row = ot.dims.back();
          return [=]() -> std::optional<exec_error> {
            for (std::int64_t r = 0; r < n / std::max<std::int64_t>(row, 1); ++r)
              for (std::int64_t j = 0; j < row; ++j) fo[r * row + j] = apply_binary(code, fa[r * row + j], fb[j]);
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
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t j = 0; j < n; ++j) store_element(to, out, j, load_any(from, x, j));
        return std::nullopt;
      };
    }
    case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max: case op::softmax: case op::log_softmax: {
      const auto& it = T(e.inputs[0]);
      const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
      std::int64_t outer = 1, len = it.dims[axis], inner = 1;
      for (std::int64_t d = 0; d < axis; ++d) outer *= it.dims[d];
      for (std::size_t d = axis + 1; d < it.dims.rank(); ++d) inner *= it.dims[d];
      const auto* x = P(e.inputs[0]);
      const auto code = e.code;
      const auto tin = it.type, tout = ot.type;
      if ((code == op::softmax || code == op::log_softmax) && inner == 1 && tin == dtype::f32)
        return [=]() -> std::optional<exec_error> {
          softmax_rows(reinterpret_cast<const float*>(x), outer, len, code == op::log_softmax, reinterpret_cast<float*>(out), lv);
          return std::nullopt;
        };
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t p = 0; p < outer; ++p)
          for (std::int64_t k = 0; k < inner; ++k) {
            auto at = [&](std::int64_t j) { return load_any(tin, x, (p * len + j) * inner + k); };
            if (code == op::softmax || code == op::log_softmax) {
              double m = -INFINITY, s = 0;
              for (std::int64_t j = 0; j < len; ++j) m = std::max(m, at(j));
              for (std::int64_t j = 0; j < len; ++j) s += std::exp(at(j) - m);
              for (std::int64_t j = 0; j < len; ++j)
                store_element(tout, out, (p * len + j) * inner + k, code == op::log_softmax ? at(j) - m - std::log(s) : std::exp(at(j) - m) / s);
              continue;
            }
            double r = code == op::reduce_max ? at(0) : 0;
            std::int64_t best = 0;
            for (std::int64_t j = 0; j < len; ++j) {
              const double v = at(j);
              if (code == op::reduce_sum || code == op::reduce_mean) r += v;
              else if (code == op::reduce_max) r = std::isnan(r) || std::isnan(v) ? NAN : std::max(r, v);
              else if (j > 0 && !std::isnan(at(best)) && (std::isnan(v) || v > at(best))) best = j;
            }
            if (code == op::reduce_mean) r /= static_cast<double>(len);
            if (code == op::arg_max) r = static_cast<double>(best);
            store_element(tout, out, p * inner + k, r);
          }
        return std::nullopt;
      };
    }
    case op::reshape:
      return nullptr;  // the same bytes (planned as an alias)
    case op::transpose: case op::slice: case op::concat: case op::broadcast: {
      // Movement: element copies through index arithmetic, by element size.
      const std::size_t es = *storage_bytes(ot.type, 1);
      const auto odims = ot.dims;
      if (e.code == op::concat) {
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(ot.dims.rank()) : e.attrs.axis;
        std::int64_t outer = 1, inner = 1;
        for (std::int64_t d = 0; d < axis; ++d) outer *= ot.dims[d];
        for (std::size_t d = axis + 1; d < ot.dims.rank(); ++d) inner *= ot.dims[d];
        std::vector<std::pair<const std::byte*, std::int64_t>> parts;
        for (auto v : e.inputs) parts.emplace_back(P(v), T(v).dims[axis] * inner);
        const std::int64_t row = ot.dims[axis] * inner;
        return [=]() -> std::optional<exec_error> {
          for (std::int64_t o = 0; o < outer; ++o) {
            std::int64_t at = 0;
            for (const auto& [src, len] : parts) {
              std::memcpy(out + (o * row + at) * es, src + o * len * es, len * es);
              at += len;
            }
          }
          return std::nullopt;
        };
      }
      const auto& it = T(e.inputs[0]);
      std::vector<std::int64_t> st;
      std::int64_t base = 0;
      if (e.code == op::transpose) {
        const auto in_st = dense_strides(it.dims);
        for (auto p : e.attrs.ints) st.push_back(in_st[p]);
      } else if (e.code == op::slice) {
        const std::int64_t axis = e.attrs.axis < 0 ? e.attrs.axis + static_cast<std::int64_t>(it.dims.rank()) : e.attrs.axis;
        st = dense_strides(it.dims);
        base = e.attrs.ints[0] * st[axis];
      } else {
        st = broadcast_strides(it.dims, ot.dims);
      }
      const auto* x = P(e.inputs[0]);
      const std::array<std::vector<std::int64_t>, 1> strides = {st};
      return [=]() -> std::optional<exec_error> {
        for_each_broadcast<1>(odims, strides, [&](std::int64_t j, const std::array<std::int64_t, 1>& off) {
          std::memcpy(out + j * es, x + (base + off[0]) * es, es);
        });
        return std::nullopt;
      };
    }
    case op::matmul: {
      const auto& as = T(e.inputs[0]).dims;
      const auto& bs = T(e.inputs[1]).dims;
      const std::int64_t M = as[as.rank() - 2], K = as.back(), N = bs.back();
      const std::int64_t batch = n / std::max<std::int64_t>(M * N, 1);
      const auto* a = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* b = reinterpret_cast<const float*>(P(e.inputs[1]));
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t z = 0; z < batch; ++z)
          for (std::int64_t r = 0; r < M; ++r)
            for (std::int64_t c = 0; c < N; ++c) {
              float s = 0;
              for (std::int64_t k = 0; k < K; ++k) s += a[(z * M + r) * K + k] * b[(z * K + k) * N + c];
              y[(z * M + r) * N + c] = s;
            }
        return std::nullopt;
      };
    }
    case op::linear:
      return lower_linear(e, reinterpret_cast<float*>(out), nullptr);
    case op::gather_rows: {
      const auto& tt = T(e.inputs[0]);
      const tensor_view table(tt.type, tt.dims, P(e.inputs[0]));
      const auto* ids = P(e.inputs[1]);
      const auto id_type = T(e.inputs[1]).type;
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = tt.dims[0];
      const std::size_t row_bytes = table.row_bytes();
      const bool plain = ot.type == tt.type;
      std::vector<std::int32_t> scratch(static_cast<std::size_t>(count));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id < 0 || id >= static_cast<double>(R))
            return fail(exec_error_code::index_out_of_range, where, "row " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(R) + ")");
          scratch[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(id);
        }
        if (plain) {
          for (std::int64_t j = 0; j < count; ++j) std::memcpy(out + j * row_bytes, table.data() + scratch[j] * row_bytes, row_bytes);
        } else {
          cpu::gather_rows(table, scratch.data(), count, reinterpret_cast<float*>(out));
        }
        return std::nullopt;
      };
    }
    case op::top_k: {
      const auto& xd = T(e.inputs[0]).dims;
      const std::int64_t E = xd.back(), rows = E == 0 ? 0 : xd.numel() / E, k = e.attrs.ints[0];
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      auto* y = reinterpret_cast<std::int32_t*>(out);
      std::vector<std::int32_t> order(static_cast<std::size_t>(E));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * E;
          for (std::int64_t j = 0; j < E; ++j) order[j] = static_cast<std::int32_t>(j);
          std::partial_sort(order.begin(), order.begin() + k, order.end(),
                            [xr](std::int32_t i, std::int32_t j) { return graph::top_k_before(xr[i], i, xr[j], j); });
          std::copy_n(order.begin(), k, y + r * k);
        }
        return std::nullopt;
      };
    }
    case op::take_along: {
      const auto& xt = T(e.inputs[0]);
      const std::int64_t E = xt.dims.back(), k = ot.dims.back(), rows = k == 0 ? 0 : n / k;
      const std::size_t es = info(xt.type).block_bytes;
      const auto* x = P(e.inputs[0]);
      const auto* ix = P(e.inputs[1]);
      const auto ix_type = T(e.inputs[1]).type;
      return [=]() -> std::optional<exec_error> {
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < k; ++j) {
            const double id = load_any(ix_type, ix, r * k + j);
            if (id < 0 || id >= static_cast<double>(E))
              return fail(exec_error_code::index_out_of_range, where, "index " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
            std::memcpy(out + (r * k + j) * es, x + (r * E + static_cast<std::int64_t>(id)) * es, es);
          }
        return std::nullopt;
      };
    }
    case op::linear_id: {
      const auto wv = e.inputs[1];
      const auto& wt = T(wv);
      const auto wb = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& w) { return w.value == wv; });
      if (wb == g.weights().end()) {
        err = exec_error{exec_error_code::unsupported, where, "an expert weight must be a stored weight"};
        return nullptr;
      }
      const std::int64_t E = wt.dims[0], N = wt.dims[1], K = wt.dims[2];
      const auto key = wb->role.str();
      auto it = ex.experts.find(key);
      if (it == ex.experts.end()) {
        // Each expert's [N, K] matrix is packed on its own, from its bytes in the stored tensor.
        const auto full = *ex.weights->find(wb->role);
        const auto per = *storage_bytes(wt.type, static_cast<std::uint64_t>(N * K));
        std::vector<packed_matrix> mats;
        mats.reserve(static_cast<std::size_t>(E));
        for (std::int64_t x = 0; x < E; ++x) {
          auto pk = packed_matrix::pack(tensor_view(wt.type, troupe::shape{N, K}, full.data() + static_cast<std::size_t>(x) * per));
          if (!pk) {
            err = exec_error{exec_error_code::unsupported, where, "cannot pack expert " + std::to_string(x) + ": " + pk.error()};
            return nullptr;
          }
          mats.push_back(std::move(*pk));
        }
        it = ex.experts.emplace(key, std::move(mats)).first;
      }
      const std::vector<packed_matrix>* mats = &it->second;
      const std::int64_t Tn = ot.dims[0], k = ot.dims[1];
      const bool shared = T(e.inputs[0]).dims.rank() == 2;
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* ids = P(e.inputs[2]);
      const auto id_type = T(e.inputs[2]).type;
      auto* y = reinterpret_cast<float*>(out);
      // Picks grouped by expert: each selected expert runs one product over all its tokens, so a
      // prefill reads each expert's weights once and a decode reads only the selected experts'.
      std::vector<std::int32_t> chosen(static_cast<std::size_t>(Tn * k));
      std::vector<std::int64_t> start(static_cast<std::size_t>(E + 1)), fill(static_cast<std::size_t>(E)), order(static_cast<std::size_t>(Tn * k));
      std::vector<float> xs, ys;
      std::vector<matmul_job> jobs;
      return [=]() mutable -> std::optional<exec_error> {
        std::fill(start.begin(), start.end(), 0);
        for (std::int64_t p = 0; p < Tn * k; ++p) {
          const double id = load_any(id_type, ids, p);
          if (id >= static_cast<double>(E))
            return fail(exec_error_code::index_out_of_range, where, "expert " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
          chosen[p] = id < 0 ? -1 : static_cast<std::int32_t>(id);
          if (chosen[p] < 0) {
            std::fill_n(y + p * N, N, 0.0f);  // another rank's expert
            continue;
          }
          ++start[chosen[p] + 1];
        }
        for (std::int64_t x2 = 0; x2 < E; ++x2) start[x2 + 1] += start[x2];
        std::copy(start.begin(), start.end() - 1, fill.begin());
        for (std::int64_t p = 0; p < Tn * k; ++p)
          if (chosen[p] >= 0) order[fill[chosen[p]]++] = p;
        // One product per selected expert, all in one dispatch. A lone pick (decode) reads its row in
        // place and writes its output directly; an expert with several gathers them first.
        std::int64_t gathered = 0;
        for (std::int64_t x2 = 0; x2 < E; ++x2)
          if (start[x2 + 1] - start[x2] > 1) gathered += start[x2 + 1] - start[x2];
        xs.resize(static_cast<std::size_t>(gathered * K));
        ys.resize(static_cast<std::size_t>(gathered * N));
        jobs.clear();
        std::int64_t at = 0;
        for (std::int64_t x2 = 0; x2 < E; ++x2) {
          const std::int64_t m = start[x2 + 1] - start[x2];
          if (m == 0) continue;
          const std::int64_t* picks = order.data() + start[x2];
          if (m == 1) {
            const std::int64_t p = picks[0];
            jobs.push_back({&(*mats)[x2], x + (shared ? p / k : p) * K, K, 1, y + p * N, N});
            continue;
          }
          for (std::int64_t i = 0; i < m; ++i)
            std::memcpy(xs.data() + (at + i) * K, x + (shared ? picks[i] / k : picks[i]) * K, K * sizeof(float));
          jobs.push_back({&(*mats)[x2], xs.data() + at * K, K, m, ys.data() + at * N, N});
          at += m;
        }
        matmul_batch(jobs, *pool_ptr, lv);
        at = 0;
        for (std::int64_t x2 = 0; x2 < E; ++x2) {
          const std::int64_t m = start[x2 + 1] - start[x2];
          if (m <= 1) continue;
          const std::int64_t* picks = order.data() + start[x2];
          for (std::int64_t i = 0; i < m; ++i) std::memcpy(y + picks[i] * N, ys.data() + (at + i) * N, N * sizeof(float));
          at += m;
        }
        return std::nullopt;
      };
    }
    case op::all_reduce: {
      collective* group = opt.group;
      if (group == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a tensor-parallel shard's graph needs the executor's group (cpu_options::group)"};
        return {};
      }
      const auto* x = P(e.inputs[0]);
      return [=]() -> std::optional<exec_error> {
        if (x != out) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
        if (auto r = group->all_reduce_sum(std::span(reinterpret_cast<float*>(out), static_cast<std::size_t>(n))); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    case op::all_gather: {
      collective* group = opt.group;
      if (group == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a tensor-parallel shard's graph needs the executor's group (cpu_options::group)"};
        return {};
      }
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto& xd = T(e.inputs[0]).dims;
      const std::int64_t C = xd.back(), M = C == 0 ? 0 : xd.numel() / C, R = e.attrs.ints[0];
      std::vector<float> all(static_cast<std::size_t>(R * M * C));
      return [=]() mutable -> std::optional<exec_error> {
        if (auto r = group->all_gather(std::span(x, static_cast<std::size_t>(M * C)), all); !r)
          return fail(exec_error_code::device_error, where, r.error());
        auto* y = reinterpret_cast<float*>(out);
        for (std::int64_t r = 0; r < R; ++r)
          for (std::int64_t m = 0; m < M; ++m) std::memcpy(y + m * R * C + r * C, all.data() + (r * M + m) * C, static_cast<std::size_t>(C) * sizeof(float));
        return std::nullopt;
      };
    }
    case op::pipe_send: {
      collective* pipe = opt.pipe;
      if (pipe == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a pipeline stage's graph needs the executor's pipe (cpu_options::pipe)"};
        return {};
      }
      const auto* x = P(e.inputs[0]);
      const int to = static_cast<int>(e.attrs.ints[0]);
      return [=]() -> std::optional<exec_error> {
        if (x != out) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
        if (auto r = pipe->send(std::span(reinterpret_cast<const float*>(out), static_cast<std::size_t>(n)), to); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    case op::pipe_recv: {
      collective* pipe = opt.pipe;
      if (pipe == nullptr) {
        err = exec_error{exec_error_code::unsupported, where, "a pipeline stage's graph needs the executor's pipe (cpu_options::pipe)"};
        return {};
      }
      const int from = static_cast<int>(e.attrs.ints[0]);
      return [=]() -> std::optional<exec_error> {
        if (auto r = pipe->recv(std::span(reinterpret_cast<float*>(out), static_cast<std::size_t>(n)), from); !r)
          return fail(exec_error_code::device_error, where, r.error());
        return std::nullopt;
      };
    }
    case op::scatter_rows: {
      const auto& dt = T(e.inputs[0]);
      const auto* dst = P(e.inputs[0]);
      const auto* ids = P(e.inputs[1]);
      const auto* src = P(e.inputs[2]);
      const auto id_type = T(e.inputs[1]).type;
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = dt.dims[0];
      const std::size_t total = *storage_bytes(dt.type, static_cast<std::uint64_t>(dt.dims.numel()));
      const std::size_t row_bytes = R ? total / static_cast<std::size_t>(R) : 0;
      const bool in_place = dst == out;
      std::vector<char> seen(static_cast<std::size_t>(R), 0);
      return [=]() mutable -> std::optional<exec_error> {
        // Check every id before writing, so a refused step leaves the state as it was.
        std::fill(seen.begin(), seen.end(), 0);
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id < 0) continue;
          if (id >= static_cast<double>(R))
            return fail(exec_error_code::index_out_of_range, where, "slot " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(R) + ")");
          if (seen[static_cast<std::size_t>(id)]++)
            return fail(exec_error_code::index_out_of_range, where, "slot " + std::to_string(static_cast<std::int64_t>(id)) + " written twice");
        }
        if (!in_place) std::memcpy(out, dst, total);
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id >= 0) std::memcpy(out + static_cast<std::int64_t>(id) * row_bytes, src + j * row_bytes, row_bytes);
        }
        return std::nullopt;
      };
    }
    case op::rms_norm: case op::layer_norm: {
      const std::int64_t N = ot.dims.back();
      const std::int64_t rows = N ? n / N : 0;
      const auto* x = reinterpret_cast<const float*>(P(e.inputs[0]));
      const auto* w = reinterpret_cast<const float*>(P(e.inputs[1]));
      const auto* b = e.code == op::layer_norm ? reinterpret_cast<const float*>(P(e.inputs[2])) : nullptr;
      if (T(e.inputs[1]).type != dtype::f32 || (b && T(e.inputs[2]).type != dtype::f32)) {
        err = exec_error{exec_error_code::unsupported, where, "norm weights must be f32 (or constant, folded to f32)"};
        return nullptr;
      }
      const auto eps = static_cast<float>(e.attrs.eps);
      auto* y = reinterpret_cast<float*>(out);
      return [=]() -> std::optional<exec_error> {
        if (b) layer_norm(x, w, b, rows, N, eps, y, lv);
        else rms_norm(x, w, rows, N, eps, y, lv);
        return std::nullopt;
      };
    }
    case op::rope: {
      const std::int64_t Tn = ot.dims[0], H = ot.dims[1], D = ot.dims[2];
      const auto* x = P(e.inputs[0]);
      const auto* pos = P(e.inputs[1]);
      const auto pos_type = T(e.inputs[1]).type;
      const auto* inv = reinterpret_cast<const float*>(P(e.inputs[2]));
      const std::int64_t half = T(e.inputs[2]).dims[0];
      const bool neox = e.attrs.neox;
      const auto scale = static_cast<float>(e.attrs.scale);
      std::vector<std::int32_t> p32(static_cast<std::size_t>(Tn));
      return [=]() mutable -> std::optional<exec_error> {
        for (std::int64_t t = 0; t < Tn; ++t) p32[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(load_any(pos_type, pos, t));
        if (x != out) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
        rope(reinterpret_cast<float*>(out), Tn, H, D, p32.data(), inv, half, neox, scale, lv);
        return std::nullopt;
      };
    }
    case op::attention: {
      attention_args a;
      a.q = reinterpret_cast<const float*>(P(e.inputs[0]));
      a.k = reinterpret_cast<const float*>(P(e.inputs[1]));
      a.v = reinterpret_cast<const float*>(P(e.inputs[2]));
      a.out = reinterpret_cast<float*>(out);
      const auto& qs = T(e.inputs[0]).dims;
      const auto& ks = T(e.inputs[1]).dims;
      const auto& ms = T(e.inputs[4]).dims;
      a.Hq = qs[1];
      a.D = qs[2];
      a.Hkv = ks[1];
      a.Dv = ot.dims[2];
      a.Vw = T(e.inputs[2]).dims[2];
      a.R = ms[0];
      a.T = ms[1];
      a.C = ms[2];
      a.scale = static_cast<float>(e.attrs.scale);
      a.softcap = static_cast<float>(e.attrs.softcap);
      const std::int64_t S = ks[0];
      const auto* index = P(e.inputs[3]);
      const auto index_type = T(e.inputs[3]).type;
      a.allow = reinterpret_cast<const std::uint8_t*>(P(e.inputs[4]));
      if (e.inputs.size() > 5) a.sinks = reinterpret_cast<const float*>(P(e.inputs[5]));
      std::vector<std::int32_t> ix(static_cast<std::size_t>(a.R * a.C));
      return [=]() mutable -> std::optional<exec_error> {
        // An index is checked where some query may read it; elsewhere it is replaced by row 0.
        for (std::int64_t r = 0; r < a.R; ++r)
          for (std::int64_t c = 0; c < a.C; ++c) {
            const double v = load_any(index_type, index, r * a.C + c);
            bool used = false;
            for (std::int64_t t = 0; t < a.T && !used; ++t) used = a.allow[(r * a.T + t) * a.C + c] != 0;
            if (used && (v < 0 || v >= static_cast<double>(S)))
              return fail(exec_error_code::index_out_of_range, where, "kv row " + std::to_string(static_cast<std::int64_t>(v)) + " outside [0, " + std::to_string(S) + ")");
            ix[static_cast<std::size_t>(r * a.C + c)] = used ? static_cast<std::int32_t>(v) : 0;
          }
        attention_args b = a;
        b.index = ix.data();
        attention(b, *pool_ptr, lv);
        return std::nullopt;
      };
    }
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

result<step_outputs, exec_error> cpu_executor::step(entry_id id, const step_inputs& in) {
  if (id.value >= impl_->entries.size()) return unexpected(exec_error{exec_error_code::unknown_id, "entry", "not added here"});
  auto& en = *impl_->entries[id.value];
  const auto& g = en.g;
  if (auto e = check_slots(g, in)) return unexpected(*e);
  for (const auto& s : g.slots()) {
    const auto& v = in.slots.at(s.slot.name);
    if (en.ptr[s.value.index] && en.tp.plan.kind[s.value.index] == compile::storage::arena) std::memcpy(en.ptr[s.value.index], v.data(), v.bytes());
  }
  for (auto& f : en.program)
    if (auto e = f()) return unexpected(*e);
  if (auto e = check_witnesses(g, [&](graph::value_id v) -> const std::byte* { return en.ptr[v.index]; })) return unexpected(*e);
  // A state updated in place needs nothing more; one computed elsewhere is copied into its buffer.
  auto& states = impl_->exes[en.exe.value]->states;
  for (const auto& s : g.states()) {
    auto& buf = states.at(s.name);
    if (en.ptr[s.out.index] != buf.data()) std::memmove(buf.data(), en.ptr[s.out.index], buf.bytes());
  }
  step_outputs out;
  for (const auto& o : g.outputs()) {
    const auto& t = g.info(o.value).type;
    tensor r(t.type, t.dims);
    if (r.bytes()) std::memcpy(r.data(), en.ptr[o.value.index], r.bytes());
    out.outputs.emplace(o.name, std::move(r));
  }
  return out;
}

}  // namespace troupe::exec::cpu
