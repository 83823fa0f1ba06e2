#include "engine/eval/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "engine/core/quant.hpp"
#include "engine/graph/recurrent_math.hpp"

namespace troupe::eval {

void map_const_source::add(graph::weight_role role, tensor t) { items_.emplace_back(std::move(role), std::move(t)); }

std::optional<tensor_view> map_const_source::find(const graph::weight_role& role) const {
  for (const auto& [r, t] : items_)
    if (r == role) return t.view();
  return std::nullopt;
}

std::string eval_error::message() const { return where + ": " + reason; }

namespace {

// The recurrent ops' walk over a step's rows (recurrent_math.hpp: use_of_row): run(r, s0, write_row)
// for each row that uses its state, s0 its carried state of `width` values in the pool `st` (null for a
// fresh row). A row index past the pool is the error returned.
template <class F>
std::optional<std::string> for_each_state_row(const std::vector<double>& st, std::int64_t width, const std::vector<double>& rows,
                                              const std::vector<double>& pos, const std::vector<double>& wr, std::int64_t R, std::int64_t T,
                                              F&& run) {
  const auto S = static_cast<std::int64_t>(st.size()) / width;
  const std::vector<std::int32_t> write(wr.begin(), wr.end()), at(pos.begin(), pos.end());
  for (std::int64_t r = 0; r < R; ++r) {
    const auto row = static_cast<std::int64_t>(rows[static_cast<std::size_t>(r)]);
    const auto use = graph::recurrent::use_of_row(row, S, write.data(), at.data(), r, T);
    if (use.bad) return "state row " + std::to_string(row) + " outside [0, " + std::to_string(S) + ")";
    if (use.skip) continue;
    run(r, use.fresh ? static_cast<const double*>(nullptr) : st.data() + row * width, write.data() + r * T);
  }
  return std::nullopt;
}

using graph::op;
using graph::value_id;

// Every element of a plain tensor, or a dequantized block tensor, as doubles.
std::vector<double> to_doubles(const tensor_view& v) {
  const auto n = v.numel();
  std::vector<double> out(static_cast<std::size_t>(n));
  if (is_quantized(v.type())) {
    const std::int64_t row = v.shape().back();
    std::vector<float> buf(static_cast<std::size_t>(row));
    const std::size_t row_bytes = v.row_bytes();
    for (std::int64_t r = 0; r * row < n; ++r) {
      (void)dequantize_row(v.type(), v.data() + r * row_bytes, buf.data(), row);
      for (std::int64_t i = 0; i < row; ++i) out[r * row + i] = buf[i];
    }
    return out;
  }
  for (std::int64_t i = 0; i < n; ++i) out[i] = load_element(v.type(), v.data(), i);
  return out;
}

tensor from_doubles(const graph::tensor_type& t, const std::vector<double>& xs) {
  tensor out(t.type, t.dims);
  for (std::size_t i = 0; i < xs.size(); ++i) store_element(t.type, out.data(), static_cast<std::int64_t>(i), xs[i]);
  return out;
}

// Row-major strides of a shape, as element counts.
std::vector<std::int64_t> strides_of(const troupe::shape& s) {
  std::vector<std::int64_t> st(s.rank(), 1);
  for (std::size_t i = s.rank(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// Maps each output index to an input index under NumPy broadcasting.
class broadcaster {
 public:
  broadcaster(const troupe::shape& in, const troupe::shape& out) : out_(out) {
    const auto st = strides_of(in);
    const std::size_t off = out.rank() - in.rank();
    stride_.assign(out.rank(), 0);
    for (std::size_t i = 0; i < in.rank(); ++i) stride_[off + i] = in[i] == 1 ? 0 : st[i];
  }
  std::int64_t operator()(std::int64_t flat) const {
    std::int64_t idx = 0;
    for (std::size_t i = out_.rank(); i-- > 0;) {
      const std::int64_t d = out_[i];
      idx += (flat % d) * stride_[i];
      flat /= d;
    }
    return idx;
  }

 private:
  troupe::shape out_;
  std::vector<std::int64_t> stride_;
};

double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// outer x axis x inner decomposition of a shape around an axis.
struct axis_split { std::int64_t outer, len, inner; };
axis_split split_at(const troupe::shape& s, std::int64_t axis) {
  axis_split r{1, s[axis], 1};
  for (std::int64_t i = 0; i < axis; ++i) r.outer *= s[i];
  for (std::size_t i = axis + 1; i < s.rank(); ++i) r.inner *= s[i];
  return r;
}

std::int64_t norm_axis(std::int64_t axis, std::size_t rank) { return axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis; }

class interpreter {
 public:
  interpreter(const graph::graph& g, const eval_inputs& in) : g_(g), in_(in), vals_(g.values().size()) {}

  result<evaluation, eval_error> run(const eval_options& opt) {
    group_ = opt.group;
    pipe_ = opt.pipe;
    if (auto r = bind_sources(); !r) return unexpected(r.error());
    for (std::size_t i = 0; i < g_.equations().size(); ++i) {
      const auto& e = g_.equations()[i];
      where_ = "eqn " + std::to_string(i) + " (" + std::string(graph::op_name(e.code)) + ")";
      auto r = compute(e);
      if (!r) return unexpected(r.error());
      vals_[e.out.index] = std::move(*r);
    }
    for (const auto& w : g_.witnesses()) {
      const auto o = std::find_if(g_.outputs().begin(), g_.outputs().end(), [&](const auto& b) { return b.name == w.output; });
      if (o == g_.outputs().end()) continue;
      const auto v = view_of(o->value);
      if (auto why = graph::witness_fails(w, v.type(), v.data(), v.numel())) {
        where_ = "witness " + w.output;
        return fail(eval_error_code::invalid_witness, *why);
      }
    }
    evaluation ev;
    for (const auto& o : g_.outputs()) ev.outputs.emplace(o.name, vals_[o.value.index]);
    for (const auto& s : g_.states()) ev.states.emplace(s.name, vals_[s.out.index]);
    if (opt.keep_values) ev.values = std::move(vals_);
    return ev;
  }

 private:
  collective* group_ = nullptr;
  collective* pipe_ = nullptr;
  unexpected<eval_error> fail(eval_error_code c, std::string why) const { return unexpected(eval_error{c, where_, std::move(why)}); }

  result<void, eval_error> check_type(const tensor_view& v, value_id id) {
    const auto& t = g_.info(id).type;
    if (v.type() != t.type || v.shape() != t.dims)
      return fail(eval_error_code::type_mismatch, "expects " + t.str() + ", got " + graph::tensor_type{v.type(), v.shape()}.str());
    return {};
  }

  result<void, eval_error> bind_sources() {
    for (const auto& s : g_.slots()) {
      where_ = "slot " + s.slot.name;
      const auto it = in_.slots.find(s.slot.name);
      if (it == in_.slots.end()) return fail(eval_error_code::missing_slot, "not bound");
      if (auto r = check_type(it->second, s.value); !r) return r;
      vals_[s.value.index] = tensor::copy_of(it->second);
    }
    for (const auto& s : g_.states()) {
      where_ = "state " + s.name;
      const auto it = in_.states.find(s.name);
      if (it == in_.states.end()) return fail(eval_error_code::missing_state, "not bound");
      if (auto r = check_type(it->second, s.in); !r) return r;
      vals_[s.in.index] = tensor::copy_of(it->second);
    }
    for (const auto& w : g_.weights()) {
      where_ = "weight " + w.role.str();
      const auto v = in_.weights ? in_.weights->find(w.role) : std::nullopt;
      if (!v) return fail(eval_error_code::missing_weight, "no tensor for this role");
      if (auto r = check_type(*v, w.value); !r) return r;
      weight_views_.emplace(w.value.index, *v);
    }
    for (const auto& l : g_.literals()) vals_[l.value.index] = l.data;
    return {};
  }

  // The stored bytes of an input: weights stay as views, everything else was materialized.
  tensor_view view_of(value_id v) const {
    const auto it = weight_views_.find(v.index);
    return it != weight_views_.end() ? it->second : vals_[v.index].view();
  }
  std::vector<double> doubles(value_id v) const { return to_doubles(view_of(v)); }
  const graph::tensor_type& type_of(value_id v) const { return g_.info(v).type; }

  result<tensor, eval_error> compute(const graph::equation& e) {
    const auto& ot = type_of(e.out);
    const auto& in = e.inputs;
    const auto& a = e.attrs;
    const std::int64_t n = ot.dims.numel();
    switch (e.code) {
      case op::neg: case op::abs: case op::exp: case op::log: case op::sqrt: case op::rsqrt: case op::recip:
      case op::tanh: case op::erf: case op::sigmoid: case op::silu: case op::gelu_tanh: {
        auto x = doubles(in[0]);
        for (auto& v : x) v = unary(e.code, v);
        return from_doubles(ot, x);
      }
      case op::add: case op::sub: case op::mul: case op::div: case op::maximum: case op::minimum: case op::pow:
      case op::equal: case op::less: case op::less_equal: case op::greater: {
        const auto x = doubles(in[0]), y = doubles(in[1]);
        const broadcaster bx(type_of(in[0]).dims, ot.dims), by(type_of(in[1]).dims, ot.dims);
        const bool integral = is_integer(type_of(in[0]).type);
        std::vector<double> out(n);
        for (std::int64_t i = 0; i < n; ++i) {
          const double p = x[bx(i)], q = y[by(i)];
          if (e.code == op::div && integral) {
            if (q == 0) return fail(eval_error_code::division_by_zero, "integer division by zero");
            out[i] = std::trunc(p / q);
          } else {
            out[i] = binary(e.code, p, q);
          }
        }
        return from_doubles(ot, out);
      }
      case op::where: {
        const auto c = doubles(in[0]), x = doubles(in[1]), y = doubles(in[2]);
        const broadcaster bc(type_of(in[0]).dims, ot.dims), bx(type_of(in[1]).dims, ot.dims), by(type_of(in[2]).dims, ot.dims);
        std::vector<double> out(n);
        for (std::int64_t i = 0; i < n; ++i) out[i] = c[bc(i)] != 0 ? x[bx(i)] : y[by(i)];
        return from_doubles(ot, out);
      }
      case op::cast: {
        if (!is_quantized(ot.type)) return from_doubles(ot, doubles(in[0]));
        // f32 rows to q8_0 blocks (a KV cache's write): ggml's reference quantization, row by row.
        const auto x = view_of(in[0]);
        tensor out(ot.type, ot.dims);
        const std::int64_t row = ot.dims.back(), rows = row == 0 ? 0 : ot.dims.numel() / row;
        for (std::int64_t r = 0; r < rows; ++r)
          if (auto q = quantize_row(ot.type, reinterpret_cast<const float*>(x.data()) + r * row, out.data() + r * out.view().row_bytes(), row); !q)
            return fail(eval_error_code::type_mismatch, q.error().message());
        return out;
      }
      case op::reduce_sum: case op::reduce_max: case op::reduce_mean: case op::arg_max:
        return reduce(e.code, in[0], norm_axis(a.axis, type_of(in[0]).dims.rank()), ot);
      case op::softmax: case op::log_softmax:
        return softmax(in[0], norm_axis(a.axis, ot.dims.rank()), e.code == op::log_softmax, ot);
      case op::reshape: {
        tensor t = tensor::copy_of(view_of(in[0]));
        return std::move(t).reshaped(ot.dims);
      }
      case op::transpose: {
        const auto& is = type_of(in[0]).dims;
        const auto ist = strides_of(is);
        const auto x = doubles(in[0]);
        std::vector<double> out(n);
        for (std::int64_t i = 0; i < n; ++i) {
          std::int64_t flat = i, src = 0;
          for (std::size_t d = ot.dims.rank(); d-- > 0;) {
            src += (flat % ot.dims[d]) * ist[a.ints[d]];
            flat /= ot.dims[d];
          }
          out[i] = x[src];
        }
        return from_doubles(ot, out);
      }
      case op::slice: {
        const auto ax = norm_axis(a.axis, ot.dims.rank());
        const auto sp = split_at(type_of(in[0]).dims, ax);
        const auto x = doubles(in[0]);
        const std::int64_t len = a.ints[1] - a.ints[0];
        std::vector<double> out(n);
        for (std::int64_t o = 0; o < sp.outer; ++o)
          for (std::int64_t j = 0; j < len; ++j)
            for (std::int64_t k = 0; k < sp.inner; ++k)
              out[(o * len + j) * sp.inner + k] = x[(o * sp.len + a.ints[0] + j) * sp.inner + k];
        return from_doubles(ot, out);
      }
      case op::concat: {
        const auto ax = norm_axis(a.axis, ot.dims.rank());
        const auto so = split_at(ot.dims, ax);
        std::vector<double> out(n);
        std::int64_t at = 0;
        for (auto v : in) {
          const auto x = doubles(v);
          const std::int64_t len = type_of(v).dims[ax];
          for (std::int64_t o = 0; o < so.outer; ++o)
            for (std::int64_t j = 0; j < len; ++j)
              for (std::int64_t k = 0; k < so.inner; ++k) out[(o * so.len + at + j) * so.inner + k] = x[(o * len + j) * so.inner + k];
          at += len;
        }
        return from_doubles(ot, out);
      }
      case op::broadcast: {
        const auto x = doubles(in[0]);
        const broadcaster b(type_of(in[0]).dims, ot.dims);
        std::vector<double> out(n);
        for (std::int64_t i = 0; i < n; ++i) out[i] = x[b(i)];
        return from_doubles(ot, out);
      }
      case op::matmul: {
        const auto& as = type_of(in[0]).dims;
        const auto& bs = type_of(in[1]).dims;
        const std::int64_t M = as[as.rank() - 2], K = as.back(), N = bs.back();
        const std::int64_t batch = M * K == 0 ? n / std::max<std::int64_t>(M * N, 1) : as.numel() / (M * K);
        const auto x = doubles(in[0]), y = doubles(in[1]);
        std::vector<double> out(n, 0.0);
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (std::int64_t k = 0; k < K; ++k) s += x[(b * M + i) * K + k] * y[(b * K + k) * N + j];
              out[(b * M + i) * N + j] = s;
            }
        return from_doubles(ot, out);
      }
      case op::linear: {
        const std::int64_t K = type_of(in[0]).dims.back(), N = type_of(in[1]).dims[0];
        const std::int64_t M = K == 0 ? (N == 0 ? 0 : n / N) : type_of(in[0]).dims.numel() / K;
        const auto x = doubles(in[0]), w = doubles(in[1]);
        std::vector<double> out(n);
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[j * K + k];
            out[m * N + j] = s;
          }
        return from_doubles(ot, out);
      }
      case op::gather_rows: return gather_rows(in[0], in[1], ot);
      case op::scatter_rows: return scatter_rows(in[0], in[1], in[2]);
      case op::rms_norm: case op::layer_norm: return norm(e, ot);
      case op::rope: return rope(e, ot);
      case op::attention: return attention(e, ot);
      case op::all_reduce: {
        if (group_ == nullptr) return fail(eval_error_code::no_group, "the graph is a tensor-parallel shard: evaluate it with its group");
        tensor t = tensor::copy_of(view_of(in[0]));
        if (auto r = group_->all_reduce_sum(std::span(t.as<float>(), static_cast<std::size_t>(n))); !r)
          return fail(eval_error_code::no_group, r.error());
        return t;
      }
      case op::all_gather: {
        if (group_ == nullptr) return fail(eval_error_code::no_group, "the graph is a tensor-parallel shard: evaluate it with its group");
        const tensor x = tensor::copy_of(view_of(in[0]));
        const auto& xd = type_of(in[0]).dims;
        const std::int64_t C = xd.back(), M = C == 0 ? 0 : xd.numel() / C, R = a.ints[0];
        std::vector<float> all(static_cast<std::size_t>(R * M * C));
        if (auto r = group_->all_gather(std::span(x.as<float>(), static_cast<std::size_t>(M * C)), all); !r)
          return fail(eval_error_code::no_group, r.error());
        tensor t(dtype::f32, ot.dims);
        for (std::int64_t r = 0; r < R; ++r)
          for (std::int64_t m = 0; m < M; ++m)
            std::copy_n(all.data() + (r * M + m) * C, C, t.as<float>() + m * R * C + r * C);
        return t;
      }
      case op::pipe_send: {
        if (pipe_ == nullptr) return fail(eval_error_code::no_group, "the graph is a pipeline stage: evaluate it with its pipe");
        tensor t = tensor::copy_of(view_of(in[0]));
        if (auto r = pipe_->send(std::span<const float>(t.as<float>(), static_cast<std::size_t>(n)), static_cast<int>(a.ints[0])); !r)
          return fail(eval_error_code::no_group, r.error());
        return t;
      }
      case op::top_k: {
        const auto& xd = type_of(in[0]).dims;
        const std::int64_t E = xd.back(), rows = E == 0 ? 0 : xd.numel() / E, k = a.ints[0];
        const auto x = doubles(in[0]);
        std::vector<double> out(static_cast<std::size_t>(rows * k));
        std::vector<std::int64_t> order(static_cast<std::size_t>(E));
        for (std::int64_t r = 0; r < rows; ++r) {
          for (std::int64_t j = 0; j < E; ++j) order[j] = j;
          auto before = [&](std::int64_t i, std::int64_t j) { return graph::top_k_before(x[r * E + i], i, x[r * E + j], j); };
          std::stable_sort(order.begin(), order.end(), before);
          for (std::int64_t j = 0; j < k; ++j) out[r * k + j] = static_cast<double>(order[j]);
        }
        return from_doubles(ot, out);
      }
      case op::take_along: {
        const auto& xd = type_of(in[0]).dims;
        const std::int64_t E = xd.back(), k = ot.dims.back(), rows = k == 0 ? 0 : n / k;
        const auto x = doubles(in[0]), ix = doubles(in[1]);
        std::vector<double> out(static_cast<std::size_t>(n));
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < k; ++j) {
            const double id = ix[r * k + j];
            if (id < 0 || id >= static_cast<double>(E))
              return fail(eval_error_code::index_out_of_range, "index " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
            out[r * k + j] = x[r * E + static_cast<std::int64_t>(id)];
          }
        return from_doubles(ot, out);
      }
      case op::linear_id: {
        const auto& wd = type_of(in[1]).dims;
        const std::int64_t E = wd[0], N = wd[1], K = wd[2];
        const std::int64_t T = ot.dims[0], k = ot.dims[1];
        const bool shared = type_of(in[0]).dims.rank() == 2;
        const auto x = doubles(in[0]), w = doubles(in[1]), ids = doubles(in[2]);
        std::vector<double> out(static_cast<std::size_t>(n), 0.0);
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t j = 0; j < k; ++j) {
            const double id = ids[t * k + j];
            if (id < 0) continue;  // another rank's expert: zeros
            if (id >= static_cast<double>(E))
              return fail(eval_error_code::index_out_of_range, "expert " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(E) + ")");
            const auto e = static_cast<std::int64_t>(id);
            const double* xr = x.data() + (shared ? t : t * k + j) * K;
            for (std::int64_t c = 0; c < N; ++c) {
              double s = 0;
              const double* wr = w.data() + (e * N + c) * K;
              for (std::int64_t q = 0; q < K; ++q) s += xr[q] * wr[q];
              out[(t * k + j) * N + c] = s;
            }
          }
        return from_doubles(ot, out);
      }
      case op::ssm_conv: {
        const auto& xd = type_of(in[0]).dims;
        const std::int64_t R = xd[0], T = xd[1], C = xd[2], K = type_of(in[5]).dims[1];
        const auto x = doubles(in[0]), st = doubles(in[1]), w = doubles(in[5]);
        std::vector<double> out(static_cast<std::size_t>(n), 0.0), window(static_cast<std::size_t>(K * C));
        const std::int64_t per = T * C + (K - 1) * C;
        const auto bad = for_each_state_row(st, (K - 1) * C, doubles(in[2]), doubles(in[3]), doubles(in[4]), R, T,
                                            [&](std::int64_t r, const double* s0, const std::int32_t* write) {
                                              graph::recurrent::ssm_conv_row<double>(x.data() + r * T * C, s0, w.data(), write, T, C, K,
                                                                                     out.data() + r * per, window.data());
                                            });
        if (bad) return fail(eval_error_code::index_out_of_range, *bad);
        return from_doubles(ot, out);
      }
      case op::ssm_scan: {
        const auto& xd = type_of(in[0]).dims;
        const auto& bd = type_of(in[3]).dims;
        const std::int64_t R = xd[0], T = xd[1], H = xd[2], P = xd[3], G = bd[2], N = bd[3];
        const auto x = doubles(in[0]), dt = doubles(in[1]), A = doubles(in[2]), B = doubles(in[3]), Cm = doubles(in[4]), st = doubles(in[5]);
        std::vector<double> out(static_cast<std::size_t>(n), 0.0);
        const std::int64_t per = T * H * P + H * P * N;
        const auto bad = for_each_state_row(st, H * P * N, doubles(in[6]), doubles(in[7]), doubles(in[8]), R, T,
                                            [&](std::int64_t r, const double* s0, const std::int32_t* write) {
                                              graph::recurrent::ssm_scan_row<double>(x.data() + r * T * H * P, dt.data() + r * T * H, A.data(),
                                                                                     B.data() + r * T * G * N, Cm.data() + r * T * G * N, s0, write, T,
                                                                                     H, P, G, N, out.data() + r * per, 0, H);
                                            });
        if (bad) return fail(eval_error_code::index_out_of_range, *bad);
        return from_doubles(ot, out);
      }
      case op::delta_rule: {
        const auto& qd = type_of(in[0]).dims;
        const auto& vd = type_of(in[2]).dims;
        const std::int64_t R = qd[0], T = qd[1], Hk = qd[2], Dk = qd[3], H = vd[2], Dv = vd[3];
        const auto q = doubles(in[0]), k = doubles(in[1]), v = doubles(in[2]), g = doubles(in[3]), be = doubles(in[4]), st = doubles(in[5]);
        std::vector<double> out(static_cast<std::size_t>(n), 0.0);
        const std::int64_t per = T * H * Dv + H * Dv * Dk;
        const auto bad = for_each_state_row(st, H * Dv * Dk, doubles(in[6]), doubles(in[7]), doubles(in[8]), R, T,
                                            [&](std::int64_t r, const double* s0, const std::int32_t* write) {
                                              graph::recurrent::delta_rule_row<double>(q.data() + r * T * Hk * Dk, k.data() + r * T * Hk * Dk,
                                                                                       v.data() + r * T * H * Dv, g.data() + r * T * H,
                                                                                       be.data() + r * T * H, s0, write, T, Hk, Dk, H, Dv,
                                                                                       out.data() + r * per, 0, H);
                                            });
        if (bad) return fail(eval_error_code::index_out_of_range, *bad);
        return from_doubles(ot, out);
      }
      case op::pipe_recv: {
        if (pipe_ == nullptr) return fail(eval_error_code::no_group, "the graph is a pipeline stage: evaluate it with its pipe");
        tensor t(dtype::f32, ot.dims);
        if (auto r = pipe_->recv(std::span<float>(t.as<float>(), static_cast<std::size_t>(n)), static_cast<int>(a.ints[0])); !r)
          return fail(eval_error_code::no_group, r.error());
        return t;
      }
    }
    return fail(eval_error_code::type_mismatch, "unknown op");
  }

  static double unary(op o, double x) {
    switch (o) {
      case op::neg: return -x;
      case op::abs: return std::fabs(x);
      case op::exp: return std::exp(x);
      case op::log: return std::log(x);
      case op::sqrt: return std::sqrt(x);
      case op::rsqrt: return 1.0 / std::sqrt(x);
      case op::recip: return 1.0 / x;
      case op::tanh: return std::tanh(x);
      case op::erf: return std::erf(x);
      case op::sigmoid: return 1.0 / (1.0 + std::exp(-x));
      case op::silu: return x / (1.0 + std::exp(-x));
      case op::gelu_tanh: return gelu_tanh(x);
      default: return x;
    }
  }

  static double binary(op o, double x, double y) {
    switch (o) {
      case op::add: return x + y;
      case op::sub: return x - y;
      case op::mul: return x * y;
      case op::div: return x / y;
      case op::maximum: return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y);
      case op::minimum: return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y);
      case op::pow: return std::pow(x, y);
      case op::equal: return x == y;
      case op::less: return x < y;
      case op::less_equal: return x <= y;
      case op::greater: return x > y;
      default: return 0;
    }
  }

  result<tensor, eval_error> reduce(op o, value_id v, std::int64_t axis, const graph::tensor_type& ot) {
    const auto sp = split_at(type_of(v).dims, axis);
    const auto x = doubles(v);
    std::vector<double> out(sp.outer * sp.inner);
    for (std::int64_t p = 0; p < sp.outer; ++p)
      for (std::int64_t k = 0; k < sp.inner; ++k) {
        auto at = [&](std::int64_t j) { return x[(p * sp.len + j) * sp.inner + k]; };
        double r = 0;
        if (o == op::reduce_sum || o == op::reduce_mean) {
          for (std::int64_t j = 0; j < sp.len; ++j) r += at(j);
          if (o == op::reduce_mean) r /= static_cast<double>(sp.len);
        } else if (o == op::reduce_max) {
          r = at(0);
          for (std::int64_t j = 1; j < sp.len; ++j) r = std::isnan(r) || std::isnan(at(j)) ? NAN : std::max(r, at(j));
        } else {  // arg_max: the first index of the largest value; NaN counts as largest
          std::int64_t best = 0;
          for (std::int64_t j = 1; j < sp.len; ++j) {
            if (std::isnan(at(best))) break;
            if (std::isnan(at(j)) || at(j) > at(best)) best = j;
          }
          r = static_cast<double>(best);
        }
        out[p * sp.inner + k] = r;
      }
    return from_doubles(ot, out);
  }

  result<tensor, eval_error> softmax(value_id v, std::int64_t axis, bool log, const graph::tensor_type& ot) {
    const auto sp = split_at(ot.dims, axis);
    auto x = doubles(v);
    for (std::int64_t p = 0; p < sp.outer; ++p)
      for (std::int64_t k = 0; k < sp.inner; ++k) {
        auto at = [&](std::int64_t j) -> double& { return x[(p * sp.len + j) * sp.inner + k]; };
        double m = -INFINITY;
        for (std::int64_t j = 0; j < sp.len; ++j) m = std::max(m, at(j));
        double s = 0;
        for (std::int64_t j = 0; j < sp.len; ++j) s += std::exp(at(j) - m);
        for (std::int64_t j = 0; j < sp.len; ++j) at(j) = log ? at(j) - m - std::log(s) : std::exp(at(j) - m) / s;
      }
    return from_doubles(ot, x);
  }

  result<tensor, eval_error> gather_rows(value_id table, value_id ids_v, const graph::tensor_type& ot) {
    const auto tv = view_of(table);
    const std::int64_t R = tv.shape()[0], C = tv.shape()[1];
    const auto ids = doubles(ids_v);
    tensor out(ot.type, ot.dims);
    std::vector<float> row(static_cast<std::size_t>(C));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const double id = ids[i];
      if (id < 0 || id >= static_cast<double>(R))
        return fail(eval_error_code::index_out_of_range, "id " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(R) + ")");
      const auto r = static_cast<std::int64_t>(id);
      if (is_quantized(tv.type())) {
        (void)dequantize_row(tv.type(), tv.data() + r * tv.row_bytes(), row.data(), C);
        std::memcpy(out.data() + i * C * sizeof(float), row.data(), C * sizeof(float));
      } else if (tv.type() == ot.type) {
        std::memcpy(out.data() + i * tv.row_bytes(), tv.data() + r * tv.row_bytes(), tv.row_bytes());
      } else {
        for (std::int64_t c = 0; c < C; ++c)
          store_element(ot.type, out.data(), static_cast<std::int64_t>(i) * C + c, load_element(tv.type(), tv.data(), r * C + c));
      }
    }
    return out;
  }

  result<tensor, eval_error> scatter_rows(value_id dst, value_id ids_v, value_id src) {
    tensor out = tensor::copy_of(view_of(dst));
    const auto sv = view_of(src);
    const std::int64_t R = out.shape()[0];
    const std::size_t row_bytes = R == 0 ? 0 : out.bytes() / static_cast<std::size_t>(R);
    const auto ids = doubles(ids_v);
    std::vector<char> written(static_cast<std::size_t>(R), 0);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) continue;
      if (ids[i] >= static_cast<double>(R))
        return fail(eval_error_code::index_out_of_range, "row " + std::to_string(static_cast<std::int64_t>(ids[i])) + " outside [0, " + std::to_string(R) + ")");
      const auto r = static_cast<std::size_t>(ids[i]);
      if (written[r]) return fail(eval_error_code::duplicate_index, "row " + std::to_string(r) + " written twice");
      written[r] = 1;
      std::memcpy(out.data() + r * row_bytes, sv.data() + i * row_bytes, row_bytes);
    }
    return out;
  }

  result<tensor, eval_error> norm(const graph::equation& e, const graph::tensor_type& ot) {
    const std::int64_t N = ot.dims.back();
    const std::int64_t rows = N == 0 ? 0 : ot.dims.numel() / N;
    auto x = doubles(e.inputs[0]);
    const auto w = doubles(e.inputs[1]);
    const auto b = e.code == op::layer_norm ? doubles(e.inputs[2]) : std::vector<double>(N, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      double* row = x.data() + r * N;
      double mean = 0;
      if (e.code == op::layer_norm) {
        for (std::int64_t i = 0; i < N; ++i) mean += row[i];
        mean /= static_cast<double>(N);
      }
      double ss = 0;
      for (std::int64_t i = 0; i < N; ++i) ss += (row[i] - mean) * (row[i] - mean);
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(N) + e.attrs.eps);
      for (std::int64_t i = 0; i < N; ++i) row[i] = (row[i] - mean) * inv * w[i] + b[i];
    }
    return from_doubles(ot, x);
  }

  result<tensor, eval_error> rope(const graph::equation& e, const graph::tensor_type& ot) {
    const std::int64_t T = ot.dims[0], H = ot.dims[1], D = ot.dims[2];
    auto x = doubles(e.inputs[0]);
    const auto pos = doubles(e.inputs[1]);
    const auto inv_freq = doubles(e.inputs[2]);
    const auto half = static_cast<std::int64_t>(inv_freq.size());
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        double* v = x.data() + (t * H + h) * D;
        for (std::int64_t i = 0; i < half; ++i) {
          const double theta = pos[t] * inv_freq[i];
          const double c = std::cos(theta) * e.attrs.scale, s = std::sin(theta) * e.attrs.scale;
          const std::int64_t i0 = e.attrs.neox ? i : 2 * i, i1 = e.attrs.neox ? i + half : 2 * i + 1;
          const double x0 = v[i0], x1 = v[i1];
          v[i0] = x0 * c - x1 * s;
          v[i1] = x0 * s + x1 * c;
        }
      }
    return from_doubles(ot, x);
  }

  result<tensor, eval_error> attention(const graph::equation& e, const graph::tensor_type& ot) {
    const auto& qs = type_of(e.inputs[0]).dims;
    const auto& ks = type_of(e.inputs[1]).dims;
    const auto& ms = type_of(e.inputs[4]).dims;
    const std::int64_t Hq = qs[1], D = qs[2], S = ks[0], Hkv = ks[1], R = ms[0], T = ms[1], C = ms[2], Dv = ot.dims[2];
    const std::int64_t Vw = type_of(e.inputs[2]).dims[2];  // a v row's width; the values are its first Dv
    const auto q = doubles(e.inputs[0]), k = doubles(e.inputs[1]), v = doubles(e.inputs[2]);
    const auto index = doubles(e.inputs[3]), allow = doubles(e.inputs[4]);
    std::vector<double> out(ot.dims.numel(), 0.0), score(static_cast<std::size_t>(C));
    const std::int64_t group = Hq / Hkv;
    const bool alibi = e.inputs.size() == 7;
    const std::vector<double> sinks = e.inputs.size() == 6 ? doubles(e.inputs[5]) : std::vector<double>{};
    const std::vector<double> slopes = alibi ? doubles(e.inputs[5]) : std::vector<double>{};
    const std::vector<double> dist = alibi ? doubles(e.inputs[6]) : std::vector<double>{};
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < C; ++c) {
        bool used = false;
        for (std::int64_t t = 0; t < T; ++t) used = used || allow[(r * T + t) * C + c] != 0;
        const double row = index[r * C + c];
        if (used && (row < 0 || row >= static_cast<double>(S)))
          return fail(eval_error_code::index_out_of_range, "kv row " + std::to_string(static_cast<std::int64_t>(row)) + " outside [0, " + std::to_string(S) + ")");
      }
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t n = r * T + t;
        const double* a = allow.data() + n * C;
        for (std::int64_t h = 0; h < Hq; ++h) {
          const std::int64_t kh = h / group;
          const double* qv = q.data() + (n * Hq + h) * D;
          double m = -INFINITY;
          bool any = false;
          for (std::int64_t c = 0; c < C; ++c) {
            if (a[c] == 0) continue;
            const auto row = static_cast<std::int64_t>(index[r * C + c]);
            const double* kv = k.data() + (row * Hkv + kh) * D;
            double s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
            s *= e.attrs.scale;
            if (e.attrs.softcap > 0) s = e.attrs.softcap * std::tanh(s / e.attrs.softcap);
            if (alibi) s += slopes[static_cast<std::size_t>(h)] * dist[static_cast<std::size_t>(n * C + c)];
            score[c] = s;
            m = std::max(m, s);
            any = true;
          }
          if (!any) continue;
          if (!sinks.empty()) m = std::max(m, sinks[static_cast<std::size_t>(h)]);
          double sum = sinks.empty() ? 0.0 : std::exp(sinks[static_cast<std::size_t>(h)] - m);
          for (std::int64_t c = 0; c < C; ++c)
            if (a[c] != 0) sum += std::exp(score[c] - m);
          double* o = out.data() + (n * Hq + h) * Dv;
          for (std::int64_t c = 0; c < C; ++c) {
            if (a[c] == 0) continue;
            const double p = std::exp(score[c] - m) / sum;
            const double* vv = v.data() + (static_cast<std::int64_t>(index[r * C + c]) * Hkv + kh) * Vw;
            for (std::int64_t d = 0; d < Dv; ++d) o[d] += p * vv[d];
          }
        }
      }
    return from_doubles(ot, out);
  }

  const graph::graph& g_;
  const eval_inputs& in_;
  std::vector<tensor> vals_;
  std::map<std::uint32_t, tensor_view> weight_views_;
  std::string where_;
};

}  // namespace

result<evaluation, eval_error> evaluate(const graph::graph& g, const eval_inputs& in, const eval_options& opt) {
  return interpreter(g, in).run(opt);
}

}  // namespace troupe::eval
