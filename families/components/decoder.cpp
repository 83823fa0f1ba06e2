#include "families/components/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace troupe::families {

using graph::op;
using graph::value_id;

std::optional<troupe::shape> attention_shape(role r, const attention_params& a, std::int64_t H) {
  const std::int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  switch (r) {
    case role::attn_q: return troupe::shape{a.output_gate ? 2 * q : q, H};
    case role::attn_k:
    case role::attn_v: return troupe::shape{kv, H};
    case role::attn_qkv: return troupe::shape{q + 2 * kv, H};
    case role::attn_q_bias: return troupe::shape{q};
    case role::attn_k_bias:
    case role::attn_v_bias: return troupe::shape{kv};
    case role::attn_qkv_bias: return troupe::shape{q + 2 * kv};
    case role::attn_output: return troupe::shape{H, q};
    case role::attn_output_bias: return troupe::shape{H};
    case role::attn_q_norm:
    case role::attn_k_norm: return troupe::shape{!a.qk_norm_full ? a.head_dim : r == role::attn_q_norm ? q : kv};
    default: return std::nullopt;
  }
}

std::optional<troupe::shape> ffn_shape(role r, std::int64_t F, std::int64_t H) {
  switch (r) {
    case role::ffn_gate:
    case role::ffn_up: return troupe::shape{F, H};
    case role::ffn_gate_up: return troupe::shape{2 * F, H};
    case role::ffn_down: return troupe::shape{H, F};
    case role::ffn_gate_bias:
    case role::ffn_up_bias: return troupe::shape{F};
    case role::ffn_down_bias: return troupe::shape{H};
    default: return std::nullopt;
  }
}

value_id decoder_trace::projection(value_id x, role r, std::int32_t layer, bool reduce) {
  auto& b = ctx_.b;
  auto y = ctx_.linear(x, r, layer);
  if (reduce) y = b.all_reduce(y);
  if (const auto bias = bias_of(r); ctx_.has(bias, layer)) y = b.add(y, ctx_.vector_f32(bias, layer));
  return y;
}

value_id decoder_trace::encode_index() {
  if (encode_index_.valid()) return encode_index_;
  const std::int64_t rows = ctx_.shape().rows(), T = ctx_.shape().tokens();
  tensor ix(dtype::i32, {rows, T});
  for (std::int64_t i = 0; i < rows * T; ++i) ix.as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
  return encode_index_ = ctx_.b.literal(std::move(ix), "encode_index");
}

value_id decoder_trace::read_index() {
  if (read_index_.valid()) return read_index_;
  auto& b = ctx_.b;
  const auto m = ctx_.read_map();
  // -1 marks an empty position: read slot 0 there; the mask excludes it.
  read_index_ = b.where(b.binary(op::less_equal, b.scalar(0, dtype::i32), m), m, b.scalar(0, dtype::i32));
  return read_index_;
}

// allow[r, t, j]: may token t of row r attend to key j? In a step, key j is the row's position j,
// held at read_map[r, j] (-1: nothing there); in encode, key j is token j of the row itself.
value_id decoder_trace::allow_mask(std::int64_t window, bool causal) {
  if (auto it = masks_.find({window, causal}); it != masks_.end()) return it->second;
  auto& b = ctx_.b;
  const auto& s = ctx_.shape();
  const std::int64_t rows = s.rows(), T = s.tokens();
  const auto qpos = b.reshape(ctx_.positions(), {rows, T, 1});
  const auto kpos = key_positions();
  value_id valid;
  if (ctx_.stateful()) {
    valid = b.reshape(b.binary(op::less_equal, b.scalar(0, dtype::i32), ctx_.read_map()), {rows, 1, s.capacity()});
  } else {
    valid = b.reshape(b.binary(op::less, b.scalar(0, dtype::i32), ctx_.token_mask()), {rows, 1, T});
  }
  if (!causal) {
    // An encoder: every present key of the row, whatever its position.
    if (ctx_.stateful()) {
      b.fail(graph::bad_declaration{"bidirectional attention runs in the encode program only"});
      return valid;
    }
    auto allow = b.broadcast(valid, {rows, T, T});
    b.label(allow, "mask.bidirectional");
    return masks_[{window, causal}] = allow;
  }
  // Causal and present; a position given attend_until (an image's rows) sees keys up to it too.
  auto qbound = qpos;
  if (ctx_.carries("attend_until"))
    if (const auto until = ctx_.request_input("attend_until", {dtype::i32, {rows * T, 1}}); until.valid())
      qbound = b.binary(op::maximum, qpos, b.reshape(until, {rows, T, 1}));
  auto allow = b.binary(op::minimum, b.binary(op::less_equal, kpos, qbound), valid);
  if (window > 0) {
    // key j is visible to position p when p - j < window
    const auto lo = b.sub(qpos, b.scalar(static_cast<double>(window), dtype::i32));
    allow = b.binary(op::minimum, allow, b.binary(op::greater, kpos, lo));
  }
  b.label(allow, window > 0 ? "mask.window" + std::to_string(window) : "mask.causal");
  return masks_[{window, causal}] = allow;
}

value_id decoder_trace::rope_freqs(const rope_config& r) {
  const auto key = std::make_pair(r.theta, r.dims);
  if (auto it = ropes_.find(key); it != ropes_.end()) return it->second.first;
  auto& b = ctx_.b;
  const auto table = make_rope_table(r, ctx_.shape().capacity());
  tensor t(dtype::f32, {static_cast<std::int64_t>(table.inv_freq.size())});
  std::memcpy(t.data(), table.inv_freq.data(), t.bytes());
  auto inv = b.literal(std::move(t), "rope.inv_freq");
  if (ctx_.has(role::rope_freqs)) inv = b.div(inv, ctx_.vector_f32(role::rope_freqs));
  ropes_[key] = {inv, table.scale};
  return inv;
}

value_id decoder_trace::rope_table(const rope_config& r, double& scale) {
  const auto inv = rope_freqs(r);
  scale = ropes_[{r.theta, r.dims}].second;
  return inv;
}

value_id decoder_trace::key_positions() {
  if (key_positions_.valid()) return key_positions_;
  auto& b = ctx_.b;
  const auto& s = ctx_.shape();
  if (ctx_.stateful()) {  // the read map's column c holds position c
    const std::int64_t C = s.capacity();
    tensor iota(dtype::i32, {C});
    for (std::int64_t j = 0; j < C; ++j) iota.as<std::int32_t>()[j] = static_cast<std::int32_t>(j);
    key_positions_ = b.literal(std::move(iota), "key_positions");
  } else {
    key_positions_ = b.reshape(ctx_.positions(), {s.rows(), 1, s.tokens()});
  }
  return key_positions_;
}

value_id decoder_trace::alibi_distances() {
  if (alibi_distances_.valid()) return alibi_distances_;
  auto& b = ctx_.b;
  const auto& s = ctx_.shape();
  const std::int64_t rows = s.rows(), T = s.tokens();
  const auto qpos = b.reshape(ctx_.positions(), {rows, T, 1});
  alibi_distances_ = b.cast(b.sub(key_positions(), qpos), dtype::f32);
  b.label(alibi_distances_, "alibi.distances");
  return alibi_distances_;
}

// ALiBi's slopes for heads [offset, offset + heads) of `total` (llama.cpp's, as HF BLOOM's
// build_alibi_tensor): the closest power of two n at or below `total`, m0 = 2^(-max_bias / n) for the
// first n heads (m0^(h+1)), m1 = 2^(-max_bias / 2n) for the rest (m1^(2 (h - n) + 1)).
static tensor alibi_slopes(std::int64_t total, std::int64_t offset, std::int64_t heads, double max_bias) {
  std::int64_t n = 1;
  while (n * 2 <= total) n *= 2;
  const double m0 = std::pow(2.0, -max_bias / static_cast<double>(n)), m1 = std::pow(2.0, -max_bias / 2.0 / static_cast<double>(n));
  tensor t(dtype::f32, {heads});
  for (std::int64_t i = 0; i < heads; ++i) {
    const std::int64_t h = offset + i;
    t.as<float>()[i] = static_cast<float>(h < n ? std::pow(m0, static_cast<double>(h + 1)) : std::pow(m1, static_cast<double>(2 * (h - n) + 1)));
  }
  return t;
}

value_id decoder_trace::attend(value_id q, value_id k, value_id v, std::int32_t layer, std::int64_t window, double scale,
                               double softcap, value_id sinks, bool causal, std::int64_t value_dims, value_id alibi) {
  auto& b = ctx_.b;
  const bool shared = value_dims > 0;  // the values are a prefix of each key: no state of their own
  value_id keys, values, index;
  if (ctx_.stateful()) {
    const std::int64_t S = ctx_.shape().kv_slots();
    const auto kt = b.type_of(k).dims;  // copies: declaring values below may move the type table
    const std::string kname = "kv.k." + std::to_string(layer), vname = "kv.v." + std::to_string(layer);
    // The cache's element type: the new rows are rounded to it as they are written (model::with_kv_type).
    const dtype kvt = ctx_.kv_type;
    auto stored = [&](value_id x) { return kvt == dtype::f32 ? x : b.cast(x, kvt); };
    keys = b.scatter_rows(b.state_input(kname, {kvt, {S, kt[1], kt[2]}}), ctx_.write_map(), stored(k));
    b.state_output(kname, keys);
    if (shared) {
      values = keys;
    } else {
      const auto vt = b.type_of(v).dims;
      values = b.scatter_rows(b.state_input(vname, {kvt, {S, vt[1], vt[2]}}), ctx_.write_map(), stored(v));
      b.state_output(vname, values);
    }
    index = read_index();
  } else {
    keys = k;  // encode: each row attends to its own tokens
    values = shared ? k : v;
    index = encode_index();
  }
  if (alibi.valid()) {
    graph::op_attrs a;
    a.scale = scale;
    a.softcap = softcap;
    if (value_dims > 0) a.ints = {value_dims};
    return b.apply(op::attention, {q, keys, values, index, allow_mask(window, causal), alibi, alibi_distances()}, a);
  }
  return b.attention(q, keys, values, index, allow_mask(window, causal), scale, softcap, sinks, value_dims);
}

value_id decoder_trace::attention(value_id x, std::int32_t layer, const attention_params& p) {
  auto& b = ctx_.b;
  const auto& s = ctx_.shape();
  const std::int64_t rows = s.rows(), T = s.tokens(), N = rows * T, D = p.head_dim;
  value_id q, k, v;
  if (ctx_.has(role::attn_qkv, layer) && ctx_.stored(role::attn_qkv, layer) == stored_as::qkv_per_head) {
    // HF BLOOM's query_key_value: [q | k | v] per head (heads = kv_heads)
    const auto qkv = b.reshape(projection(x, role::attn_qkv, layer), {N, p.heads, 3 * D});
    q = b.reshape(b.slice(qkv, 2, 0, D), {N, p.heads * D});
    k = b.reshape(b.slice(qkv, 2, D, 2 * D), {N, p.kv_heads * D});
    v = b.reshape(b.slice(qkv, 2, 2 * D, 3 * D), {N, p.kv_heads * D});
  } else if (ctx_.has(role::attn_qkv, layer)) {
    const auto qkv = projection(x, role::attn_qkv, layer);
    q = b.slice(qkv, 1, 0, p.heads * D);
    k = b.slice(qkv, 1, p.heads * D, (p.heads + p.kv_heads) * D);
    v = b.slice(qkv, 1, (p.heads + p.kv_heads) * D, (p.heads + 2 * p.kv_heads) * D);
  } else {
    q = projection(x, role::attn_q, layer);
    k = projection(x, role::attn_k, layer);
    v = projection(x, role::attn_v, layer);
  }
  if (p.clip_qkv > 0) {
    const auto lo = b.scalar(-p.clip_qkv), hi = b.scalar(p.clip_qkv);
    auto clip = [&](value_id x) { return b.binary(op::minimum, b.binary(op::maximum, x, lo), hi); };
    q = clip(q);
    k = clip(k);
    v = clip(v);
  }
  value_id gate;
  if (p.output_gate) {  // per head [q | gate]
    const auto qg = b.reshape(q, {N, p.heads, 2 * D});
    gate = b.reshape(b.slice(qg, 2, D, 2 * D), {N, p.heads * D});
    q = b.slice(qg, 2, 0, D);
  }
  if (p.qk_norm && p.qk_norm_full) {  // one norm over every head's dims together, before the split
    q = b.rms_norm(q, ctx_.vector_f32(role::attn_q_norm, layer), p.norm_eps);
    k = b.rms_norm(k, ctx_.vector_f32(role::attn_k_norm, layer), p.norm_eps);
  }
  q = b.reshape(q, {N, p.heads, D});
  k = b.reshape(k, {N, p.kv_heads, D});
  v = b.reshape(v, {N, p.kv_heads, D});
  if (p.qk_norm && !p.qk_norm_full) {
    q = b.rms_norm(q, ctx_.vector_f32(role::attn_q_norm, layer), p.norm_eps);
    k = b.rms_norm(k, ctx_.vector_f32(role::attn_k_norm, layer), p.norm_eps);
  }
  if (p.rope.dims > 0) {
    double scale = 1.0;
    const auto inv = rope_table(p.rope, scale);
    const bool interleaved = ctx_.stored(ctx_.has(role::attn_q, layer) ? role::attn_q : role::attn_qkv, layer) == stored_as::rope_interleaved;
    q = b.rope(q, ctx_.positions(), inv, !interleaved, scale);
    k = b.rope(k, ctx_.positions(), inv, !interleaved, scale);
  }
  b.label(q, "q");
  b.label(k, "k");

  const auto slopes = p.alibi ? b.literal(alibi_slopes(p.alibi_heads > 0 ? p.alibi_heads : p.heads, p.alibi_offset, p.heads, p.alibi_max_bias),
                                          "alibi.slopes")
                             : value_id{};
  auto att = attend(q, k, v, layer, p.sliding_window, p.scale, p.softcap, p.sinks ? ctx_.vector_f32(role::attn_sinks, layer) : value_id{},
                    p.causal, 0, slopes);
  att = b.reshape(att, {N, p.heads * D});
  if (p.output_gate) att = b.mul(att, b.unary(op::sigmoid, gate));
  auto out = projection(att, role::attn_output, layer, p.reduce_output);
  if (p.output_scale != 1.0) out = b.mul(out, b.scalar(p.output_scale));
  b.label(out, "attn_out");
  return out;
}

value_id decoder_trace::activate(value_id x, activation act) {
  auto& b = ctx_.b;
  if (act == activation::silu) return b.unary(op::silu, x);
  if (act == activation::relu_sqr) {
    const auto r = b.binary(op::maximum, x, b.scalar(0.0));
    return b.mul(r, r);
  }
  if (act != activation::gelu) return b.unary(op::gelu_tanh, x);
  const auto phi = b.add(b.scalar(1.0), b.unary(op::erf, b.mul(x, b.scalar(0.70710678118654752440))));
  return b.mul(b.mul(x, phi), b.scalar(0.5));
}

value_id decoder_trace::feed_forward(value_id x, std::int32_t layer, const ffn_params& p) {
  auto& b = ctx_.b;
  value_id h;
  if (!p.gated) {
    h = activate(projection(x, role::ffn_up, layer), p.act);
  } else if (ctx_.has(role::ffn_gate_up, layer)) {
    const auto gu = projection(x, role::ffn_gate_up, layer);
    const auto width = b.type_of(gu).dims.back() / 2;
    const auto last = static_cast<std::int64_t>(b.type_of(gu).dims.rank()) - 1;
    h = b.mul(activate(b.slice(gu, last, 0, width), p.act), b.slice(gu, last, width, 2 * width));
  } else {
    auto g = projection(x, role::ffn_gate, layer);
    if (p.gate_scale != 1.0) g = b.mul(g, b.scalar(p.gate_scale));
    h = b.mul(activate(g, p.act), projection(x, role::ffn_up, layer));
  }
  auto out = projection(h, role::ffn_down, layer, p.reduce_output);
  if (p.down_scale != 1.0) out = b.mul(out, b.scalar(p.down_scale));
  b.label(out, "ffn_out");
  return out;
}

value_id decoder_trace::standard_layer(value_id x, std::int32_t layer, const stack_params& p, const block_fn& mixer,
                                       const block_fn& ffn) {
  auto& b = ctx_.b;
  b.push_scope("layers." + std::to_string(layer));
  auto a = mixer(*this, p.pre_norms ? norm(x, role::attn_norm, layer, p) : x, layer);
  if (p.sandwich_norms) a = norm(a, role::post_attention_norm, layer, p);
  if (p.residual_scale != 1.0) a = b.mul(a, b.scalar(p.residual_scale));
  const auto h = b.add(x, a);
  if (!ffn) {  // a mixer-only layer (Mamba2's)
    b.label(h, "out");
    b.pop_scope();
    return h;
  }
  auto f = ffn(*this, p.pre_norms ? norm(h, role::ffn_norm, layer, p) : h, layer);
  if (p.sandwich_norms) f = norm(f, role::post_ffw_norm, layer, p);
  if (p.residual_scale != 1.0) f = b.mul(f, b.scalar(p.residual_scale));
  const auto out = b.add(h, f);
  b.label(out, "out");
  b.pop_scope();
  return out;
}

value_id decoder_trace::norm(value_id x, role r, std::int32_t layer, const stack_params& p) {
  auto& b = ctx_.b;
  if (!p.layer_norm) return b.rms_norm(x, ctx_.vector_f32(r, layer), p.norm_eps);
  if (ctx_.has(bias_of(r), layer)) return b.layer_norm(x, ctx_.vector_f32(r, layer), ctx_.vector_f32(bias_of(r), layer), p.norm_eps);
  // No bias stored (MPT): a zero one, one literal per width.
  const auto width = b.type_of(x).dims.back();
  auto& zero = zero_bias_[width];
  if (!zero.valid()) {
    tensor z(dtype::f32, {width});
    std::fill_n(z.as<float>(), width, 0.0f);
    zero = b.literal(std::move(z), "norm.zero_bias");
  }
  return b.layer_norm(x, ctx_.vector_f32(r, layer), zero, p.norm_eps);
}

void decoder_trace::standard_stack(const stack_params& p, const block_fn& mixer, const block_fn& ffn,
                                   const std::function<bool(std::int32_t)>& has_ffn) {
  auto& b = ctx_.b;
  const auto& s = ctx_.shape();
  const std::int64_t rows = s.rows(), T = s.tokens(), N = rows * T;
  graph::value_id x;
  if (p.stage > 0) {
    // A later pipeline stage: the residual stream as the stage before left it.
    if (!ctx_.stateful()) {
      b.fail(graph::bad_declaration{"a pipeline stage runs the step program only"});
      return;
    }
    (void)ctx_.positions();  // every stage reads the step's positions and KV maps, never its tokens
    x = b.pipe_recv(troupe::shape{N, p.hidden}, p.stage - 1);
    b.label(x, "stage_in");
  } else {
    x = b.gather_rows(ctx_.weight(role::token_embd), ctx_.token_ids());
    if (b.type_of(x).type != dtype::f32) x = b.cast(x, dtype::f32);
    if (p.embed_scale != 1.0) x = b.mul(x, b.scalar(p.embed_scale));
    if (p.embeds_input) {
      // Rows given as embeddings (an image's): they replace the token's, unscaled.
      const auto e = ctx_.request_input("embeds", {dtype::f32, {N, p.hidden}});
      const auto m = ctx_.request_input("embed_mask", {dtype::i32, {N, 1}});
      if (e.valid() != m.valid()) {
        b.fail(graph::bad_declaration{"embeds and embed_mask are carried together"});
        return;
      }
      if (e.valid()) x = b.where(b.binary(op::less, b.scalar(0, dtype::i32), m), e, x);
    }
    if (ctx_.has(role::token_embd_norm)) x = norm(x, role::token_embd_norm, -1, p);  // BLOOM's norm of the embeddings
    b.label(x, "embed");
  }
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(p.layers) && b.ok(); ++l)
    x = standard_layer(x, l, p, mixer, !has_ffn || has_ffn(l) ? ffn : block_fn{});
  if (p.stage + 1 < p.stages) {
    if (!ctx_.stateful()) {
      b.fail(graph::bad_declaration{"a pipeline stage runs the step program only"});
      return;
    }
    x = b.pipe_send(x, p.stage + 1);
    b.output("stage_out", x);
    return;
  }
  auto h = norm(x, role::output_norm, -1, p);
  b.label(h, "output_norm");
  if (!ctx_.stateful()) {
    b.output("hidden", h);
    return;
  }
  if (s.hidden_carry()) b.output("hidden", h);
  if (s.logits() == logit_rows::last) h = b.reshape(b.slice(b.reshape(h, {rows, T, p.hidden}), 1, T - 1, T), {rows, p.hidden});
  (void)N;
  auto logits = b.linear(h, ctx_.weight(ctx_.has(role::output) ? role::output : role::token_embd));
  if (p.vocab_split > 1) logits = b.all_gather(logits, p.vocab_split);  // each rank computed its rows of the head
  if (p.logit_scale != 1.0) logits = b.div(logits, b.scalar(p.logit_scale));
  if (p.final_softcap > 0) {
    const auto cap = b.scalar(p.final_softcap);
    logits = b.mul(b.unary(op::tanh, b.div(logits, cap)), cap);
  }
  b.label(logits, "logits");
  b.output("logits", logits);
}

}  // namespace troupe::families
