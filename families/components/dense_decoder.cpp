#include "families/components/dense_decoder.hpp"

#include <algorithm>
#include <cstring>

#include "families/components/mla.hpp"
#include "families/components/mtp.hpp"

namespace troupe::families {

namespace {
void add_kv(std::vector<state_decl>& kv, const attention_params& a, std::int64_t l, dtype t) {
  if (a.mla.kv_lora_rank > 0) {  // latent: one shared [c, k_pe] per token, whose c is the value too
    kv.push_back({"kv.k." + std::to_string(l), t, {1, a.mla.kv_lora_rank + a.head_dim}});
    return;
  }
  kv.push_back({"kv.k." + std::to_string(l), t, {a.kv_heads, a.head_dim}});
  kv.push_back({"kv.v." + std::to_string(l), t, {a.kv_heads, a.head_dim}});
}
}  // namespace

dense_decoder::dense_decoder(dense_decoder_spec spec, families::weight_map weights)
    : spec_(std::move(spec)), weights_(std::move(weights)) {
  std::vector<state_decl> kv;
  for (std::int64_t l = 0; l < spec_.stack.layers; ++l) {
    const auto k = spec_.kind(l);
    if (spec_.attends(l)) add_kv(kv, spec_.attention[l], l, spec_.kv_type);
    if (spec_.mamba2_at(l)) add_mamba2_states(kv, spec_.mamba2, l);
    else if (k == dense_decoder_spec::layer_kind::gated_delta) add_gated_delta_states(kv, spec_.gated_delta, l);
    else if (k == dense_decoder_spec::layer_kind::shortconv_ffn) add_shortconv_states(kv, spec_.shortconv, l);
  }
  schema_.add_program(program::step, std::move(kv));
  if (spec_.stack.embeds_input) {
    (void)schema_.declare({.name = "embeds", .element = dtype::f32, .width = {spec_.stack.hidden}, .presence = input_presence::optional});
    (void)schema_.declare({.name = "embed_mask", .element = dtype::i32, .width = {1}, .presence = input_presence::optional});
  }
  if (spec_.stack.span_input)
    (void)schema_.declare({.name = "attend_until", .element = dtype::i32, .width = {1}, .pad = -1.0, .presence = input_presence::optional});
  if (!spec_.recurrent()) schema_.add_program(program::encode, {});  // a recurrent mixer runs forward only
  if (spec_.mtp_layers > 0) {
    std::vector<state_decl> mtp;
    add_kv(mtp, spec_.attention[spec_.stack.layers], spec_.stack.layers, spec_.kv_type);
    schema_.add_program(program::draft, std::move(mtp));
  }
}

void dense_decoder::trace_into(const step_spec& spec, graph::builder& b) const {
  trace_context ctx(b, weights_, spec);
  ctx.kv_type = spec_.kv_type;
  decoder_trace t(ctx);
  const auto mixer = [this](decoder_trace& d, graph::value_id x, std::int32_t l) {
    if (spec_.kind(l) == dense_decoder_spec::layer_kind::parallel_ffn)  // Falcon-H1: both over the same input, summed
      return d.ctx().b.add(d.attention(x, l, spec_.attention[l]), mamba2_mixer(d, x, l, spec_.mamba2));
    if (spec_.mamba2_at(l)) return mamba2_mixer(d, x, l, spec_.mamba2);
    if (spec_.kind(l) == dense_decoder_spec::layer_kind::shortconv_ffn) return shortconv_mixer(d, x, l, spec_.shortconv);
    if (spec_.kind(l) == dense_decoder_spec::layer_kind::gated_delta) return gated_delta_mixer(d, x, l, spec_.gated_delta);
    if (spec_.kind(l) == dense_decoder_spec::layer_kind::ffn_only) {  // Nemotron-H's MLP or routed block
      if (const auto* m = spec_.routed(l)) return moe_feed_forward(d, x, l, *m);
      return d.feed_forward(x, l, spec_.ffn);
    }
    const auto& a = spec_.attention[l];
    return a.mla.kv_lora_rank > 0 ? mla_attention(d, x, l, a) : d.attention(x, l, a);
  };
  const auto ffn = [this](decoder_trace& d, graph::value_id x, std::int32_t l) {
    if (const auto* m = spec_.routed(l)) return moe_feed_forward(d, x, l, *m);
    return d.feed_forward(x, l, spec_.ffn);
  };
  if (spec.program == program::draft) {
    mtp_stack(t, spec_.stack, static_cast<std::int32_t>(spec_.stack.layers), mixer, ffn, spec_.mtp);
    return;
  }
  if (!spec_.kinds.empty()) {
    t.standard_stack(spec_.stack, mixer, ffn, [this](std::int32_t l) { return spec_.ffn_after_mixer(l); });
    return;
  }
  t.standard_stack(spec_.stack, mixer, ffn);
}

namespace {
dense_decoder_spec without_mtp(dense_decoder_spec s) {
  if (s.mtp_layers == 0) return s;
  s.attention.resize(static_cast<std::size_t>(s.stack.layers));
  if (s.moe.size() > static_cast<std::size_t>(s.stack.layers)) s.moe.resize(static_cast<std::size_t>(s.stack.layers));
  s.mtp_layers = 0;
  return s;
}
}  // namespace

std::unique_ptr<dense_decoder> dense_decoder::drop_mtp() const {
  std::vector<weight_entry> keep;
  for (const auto& e : weights_.entries())
    if (e.role.layer < spec_.stack.layers) keep.push_back(e);
  return std::unique_ptr<dense_decoder>(new dense_decoder(without_mtp(spec_), weights_.derive(std::move(keep), {})));
}

std::optional<model_error> missing_in_layer(const weight_map& w, std::int64_t layer, std::span<const role> roles) {
  const auto l = static_cast<std::int32_t>(layer);
  for (const auto r : roles)
    if (!w.has({r, l})) return model_error{weight_error{weight_error_code::missing, {r, l}, "(layer " + std::to_string(layer) + ")", "", ""}};
  return std::nullopt;
}

expected_shape_fn dense_decoder_shapes(const dense_decoder_spec& s) {
  return [s](role r, std::int32_t layer) -> std::optional<troupe::shape> {
    const std::int64_t H = s.stack.hidden, V = s.stack.vocab;
    if (r == role::token_embd || r == role::output) return troupe::shape{V, H};
    if (r == role::output_norm || r == role::output_norm_bias || r == role::token_embd_norm || r == role::token_embd_norm_bias) return troupe::shape{H};
    if (auto m = mtp_shape(r, H, V)) return m;
    if (r == role::rope_freqs) return troupe::shape{s.attention.empty() ? 0 : s.attention[0].rope.dims / 2};
    if (s.mamba2_at(layer)) {
      if (r == role::attn_norm || (r == role::ffn_norm && s.ffn_after_mixer(layer))) return troupe::shape{H};
      if (auto m = mamba2_shape(r, s.mamba2, H)) return m;
      if (s.kind(layer) == dense_decoder_spec::layer_kind::parallel_ffn && layer < static_cast<std::int32_t>(s.attention.size()))
        return attention_shape(r, s.attention[layer], H);
      return std::nullopt;  // the feed-forward's roles: checked by the family or the routed shape rule
    }
    if (s.kind(layer) == dense_decoder_spec::layer_kind::shortconv_ffn) {
      if (r == role::attn_norm || r == role::ffn_norm) return troupe::shape{H};
      return shortconv_shape(r, s.shortconv, H);
    }
    if (s.kind(layer) == dense_decoder_spec::layer_kind::gated_delta) {
      if (r == role::attn_norm || r == role::ffn_norm) return troupe::shape{H};
      return gated_delta_shape(r, s.gated_delta, H);
    }
    if (layer < 0 || layer >= static_cast<std::int32_t>(s.attention.size())) return std::nullopt;
    const auto& a = s.attention[layer];
    if (a.mla.kv_lora_rank > 0)
      if (auto m = mla_shape(r, a, H)) return m;
    if (r == role::attn_norm || r == role::ffn_norm || r == role::post_attention_norm || r == role::post_ffw_norm || r == role::attn_norm_bias ||
        r == role::ffn_norm_bias)
      return troupe::shape{H};
    return attention_shape(r, a, H);  // feed-forward roles: checked by the family (their width is its config)
  };
}

result<std::unique_ptr<model>, model_error> make_dense_decoder(dense_decoder_spec spec, const load::weight_store& store,
                                                               std::span<const name_rule> rules, const weight_rewrite& rewrite) {
  const auto base = dense_decoder_shapes(spec);
  const std::int64_t H = spec.stack.hidden;
  const std::int64_t F = spec.ffn.width;
  auto shapes = [&](role r, std::int32_t layer) -> std::optional<troupe::shape> {
    if (const auto* m = spec.routed(layer))
      if (auto s = moe_shape(r, *m, H)) return s;
    if (auto s = ffn_shape(r, F, H)) return s;
    return base(r, layer);
  };
  const auto all_layers = static_cast<std::int32_t>(spec.stack.layers + spec.mtp_layers);
  auto map = weight_map::build(store, rules, all_layers, shapes);
  if (!map) return unexpected(model_error{map.error()});
  // Mamba2 roles whose stored shape differs by form: their element counts.
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec.stack.layers); ++l) {
    if (!spec.mamba2_at(l)) continue;
    for (const role r : {role::ssm_conv1d, role::ssm_a, role::ssm_d, role::ssm_norm}) {
      const auto* e = map->find({r, l});
      const auto want = mamba2_numel(r, spec.mamba2);
      if (e && want && e->view.shape().numel() != *want)
        return unexpected(model_error{weight_error{weight_error_code::shape_mismatch, {r, l}, e->key, std::to_string(*want) + " elements",
                                                   e->view.shape().str()}});
    }
    for (const role r : {role::ssm_in, role::ssm_conv1d, role::ssm_dt_bias, role::ssm_d, role::ssm_norm, role::ssm_out})
      if (!map->has({r, l}) && (r != role::ssm_norm || spec.mamba2.gated_norm))
        return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, "(Mamba2 layer " + std::to_string(l) + ")", "", ""}});
    if (!map->has({role::ssm_a, l}) && !map->has({role::ssm_a_log, l}))
      return unexpected(model_error{weight_error{weight_error_code::missing, {role::ssm_a, l}, "(A or A_log)", "", ""}});
  }
  // Short-convolution layers (LFM2): whole, the conv weight of C x K elements in either form.
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec.stack.layers); ++l) {
    if (spec.kind(l) != dense_decoder_spec::layer_kind::shortconv_ffn) continue;
    for (const role r : {role::ssm_in, role::ssm_conv1d, role::ssm_out})
      if (!map->has({r, l}))
        return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, "(short-convolution layer " + std::to_string(l) + ")", "", ""}});
    const auto* e = map->find({role::ssm_conv1d, l});
    if (e->view.shape().numel() != shortconv_numel(spec.shortconv))
      return unexpected(model_error{weight_error{weight_error_code::shape_mismatch, {role::ssm_conv1d, l}, e->key,
                                                 std::to_string(shortconv_numel(spec.shortconv)) + " elements", e->view.shape().str()}});
  }
  // Gated DeltaNet layers: the same, with the projections in either form.
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec.stack.layers); ++l) {
    if (spec.kind(l) != dense_decoder_spec::layer_kind::gated_delta) continue;
    auto missing = [&](role r, const char* what) {
      return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, std::string("(Gated DeltaNet layer ") + std::to_string(l) + what + ")", "", ""}});
    };
    for (const role r : {role::ssm_conv1d, role::ssm_a}) {
      const auto* e = map->find({r, l});
      const auto want = gated_delta_numel(r, spec.gated_delta);
      if (e && want && e->view.shape().numel() != *want)
        return unexpected(model_error{weight_error{weight_error_code::shape_mismatch, {r, l}, e->key, std::to_string(*want) + " elements",
                                                   e->view.shape().str()}});
    }
    for (const role r : {role::ssm_ba, role::ssm_conv1d, role::ssm_dt_bias, role::ssm_norm, role::ssm_out})
      if (!map->has({r, l})) return missing(r, "");
    if (!map->has({role::ssm_in, l}) && !(map->has({role::attn_qkv, l}) && map->has({role::attn_gate, l})))
      return missing(role::ssm_in, ": in_proj_qkvz, or attn_qkv and attn_gate");
    if (!map->has({role::ssm_a, l}) && !map->has({role::ssm_a_log, l})) return missing(role::ssm_a, ": A or A_log");
  }
  if (rewrite) {
    auto rewritten = rewrite(*map);
    if (!rewritten) return unexpected(model_error{rewritten.error()});
    map = std::move(rewritten);
  }
  if (std::any_of(spec.attention.begin(), spec.attention.end(), [](const auto& a) { return a.mla.kv_lora_rank > 0; })) {
    auto absorbed = absorb_kv_b(*map, spec.attention);
    if (!absorbed) return unexpected(model_error{absorbed.error()});
    map = std::move(absorbed);
    for (std::int32_t l = 0; l < all_layers; ++l)
      for (const role r : {role::attn_k_b, role::attn_v_b})
        if (!map->has({r, l}))
          return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, "(or attn_kv_b)", shapes(r, l)->str(), ""}});
  }
  // A routed model's name table holds both feed-forwards as optional: each layer must have its own.
  for (const auto& m : spec.moe)
    if (m.experts > 0) spec.config.experts = m.experts, spec.config.experts_per_token = m.used;
  for (std::int32_t l = static_cast<std::int32_t>(spec.stack.layers); l < all_layers; ++l)
    for (const role r : {role::nextn_eh_proj, role::nextn_enorm, role::nextn_hnorm, role::nextn_shared_head_norm})
      if (!map->has({r, l}))
        return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, "(the multi-token-prediction layer)",
                                                   shapes(r, l)->str(), ""}});
  if (!spec.moe.empty()) {
    for (std::int32_t l = 0; l < all_layers; ++l) {
      const auto k = spec.kind(l);
      if (!spec.ffn_after_mixer(l) && k != dense_decoder_spec::layer_kind::ffn_only) continue;  // no feed-forward
      const auto* m = spec.routed(l);
      std::vector<role> need = m ? std::vector<role>{role::ffn_gate_inp, role::ffn_up_exps, role::ffn_down_exps}
                                 : std::vector<role>{role::ffn_up, role::ffn_down};
      if (m && m->shared_width > 0) need.insert(need.end(), {role::ffn_up_shexp, role::ffn_down_shexp});
      if (m && m->shared_width > 0 && m->shared_gate_proj) need.push_back(role::ffn_gate_shexp);
      for (const auto r : need) {
        const bool fused_dense = !m && map->has({role::ffn_gate_up, l});
        if (!map->has({r, l}) && !fused_dense) {
          const auto want = shapes(r, l);
          return unexpected(model_error{weight_error{weight_error_code::missing, {r, l}, "(layer " + std::to_string(l) + ")",
                                                     want ? want->str() : "any", ""}});
        }
      }
    }
  }
  return std::unique_ptr<model>(new dense_decoder(std::move(spec), std::move(*map)));
}

namespace {

// Rows [r0, r1) of a [R, C] matrix or elements [r0, r1) of a vector: a view into the same bytes.
tensor_view rows_of(const tensor_view& v, std::int64_t r0, std::int64_t r1) {
  if (v.shape().rank() == 1) {
    const auto off = *storage_bytes(v.type(), static_cast<std::uint64_t>(r0));
    return tensor_view(v.type(), troupe::shape{r1 - r0}, v.data() + off);
  }
  return tensor_view(v.type(), troupe::shape{r1 - r0, v.shape()[1]}, v.data() + static_cast<std::size_t>(r0) * v.row_bytes());
}

// Several row ranges of one tensor, stacked, as owned bytes (a fused projection's parts).
std::shared_ptr<const tensor> stack_rows(const tensor_view& v, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::int64_t rows = 0;
  for (const auto& [a, b] : ranges) rows += b - a;
  auto t = std::make_shared<tensor>(v.type(), v.shape().rank() == 1 ? troupe::shape{rows} : troupe::shape{rows, v.shape()[1]});
  std::byte* dst = t->data();
  for (const auto& [a, b] : ranges) {
    const auto part = rows_of(v, a, b);
    std::memcpy(dst, part.data(), part.bytes());
    dst += part.bytes();
  }
  return t;
}

// Columns [c0, c1) of a [R, C] matrix as owned bytes; block formats need whole blocks.
result<std::shared_ptr<const tensor>, std::string> columns_of(const tensor_view& v, std::int64_t c0, std::int64_t c1) {
  const auto block = static_cast<std::int64_t>(info(v.type()).block_elems);
  if (c0 % block != 0 || c1 % block != 0)
    return unexpected("columns [" + std::to_string(c0) + ", " + std::to_string(c1) + ") cut " + std::string(name(v.type())) +
                      " blocks of " + std::to_string(block));
  const std::int64_t R = v.shape()[0];
  auto t = std::make_shared<tensor>(v.type(), troupe::shape{R, c1 - c0});
  const auto skip = *storage_bytes(v.type(), static_cast<std::uint64_t>(c0));
  const auto take = *storage_bytes(v.type(), static_cast<std::uint64_t>(c1 - c0));
  for (std::int64_t r = 0; r < R; ++r)
    std::memcpy(t->data() + static_cast<std::size_t>(r) * take, v.data() + static_cast<std::size_t>(r) * v.row_bytes() + skip, take);
  return std::shared_ptr<const tensor>(std::move(t));
}


using part = std::pair<tensor_view, std::shared_ptr<const tensor>>;  // the view, and the bytes it owns (if any)

// A weight read as [R, C] (C = 1 for a vector or [R, 1]), whatever its stored rank: the leading
// dimension is the one a split cuts.
tensor_view as_rows(const tensor_view& v, std::int64_t R) {
  const std::int64_t C = R > 0 ? v.shape().numel() / R : 0;
  return tensor_view(v.type(), troupe::shape{R, C}, v.data());
}

// The row ranges of a weight, stacked, in the weight's own rank (its leading dimension shortened).
part rows_part(const tensor_view& v, std::int64_t R, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  const auto flat = as_rows(v, R);
  std::vector<std::int64_t> d(v.shape().dims().begin(), v.shape().dims().end());
  std::int64_t rows = 0;
  for (const auto& [a, b] : ranges) rows += b - a;
  d[0] = d[0] * rows / R;  // [R, ...] keeps `rows` rows; [G, D / G] read as [D] keeps G rows / R of them
  const auto out = troupe::shape(std::span<const std::int64_t>(d));
  if (ranges.size() == 1) {
    const auto sub = rows_of(flat, ranges[0].first, ranges[0].second);
    return {tensor_view(v.type(), out, sub.data()), nullptr};
  }
  auto t = stack_rows(flat, ranges);
  return {tensor_view(v.type(), out, t->data()), t};
}

}  // namespace

// A Mamba2 layer's weight for rank `rank` of `size`: the z, x, B, C and dt rows of ssm_in, the x, B and
// C channels of the conv, the heads' dt bias, A and D, the norm's and the output projection's share of
// the inner width. A rank's rows of a Mamba2 layer: its heads' z, x, dt and channels, and the B/C rows of its groups:
// its share of them when the groups split over the ranks, or (fewer groups than ranks, each rank's heads
// within one group) its one group's, which the ranks sharing the group each hold.
static result<part, std::string> mamba2_part(const weight_entry& e, const mamba2_params& m, int rank, int size) {
  const std::int64_t D = m.inner, GN = m.groups * m.state, H = m.heads;
  const std::int64_t d = D / size, h = H / size;
  const std::int64_t gn = m.groups % size == 0 ? GN / size : m.state;
  const std::int64_t g0 = m.groups % size == 0 ? rank * gn : rank / (size / m.groups) * m.state;
  const std::pair<std::int64_t, std::int64_t> xs{rank * d, (rank + 1) * d}, bs{g0, g0 + gn}, hs{rank * h, (rank + 1) * h};
  auto shift = [](std::pair<std::int64_t, std::int64_t> p, std::int64_t by) { return std::pair{p.first + by, p.second + by}; };
  const auto& v = e.view;
  switch (e.role.kind) {
    case role::ssm_in:  // [z D | x D | B G N | C G N | dt H]
      return rows_part(v, 2 * D + 2 * GN + H, {xs, shift(xs, D), shift(bs, 2 * D), shift(bs, 2 * D + GN), shift(hs, 2 * D + 2 * GN)});
    case role::ssm_conv1d:
    case role::ssm_conv1d_bias:  // channels [x D | B G N | C G N]
      return rows_part(v, D + 2 * GN, {xs, shift(bs, D), shift(bs, D + GN)});
    case role::ssm_dt_bias:
    case role::ssm_a:
    case role::ssm_a_log:
    case role::ssm_d: return rows_part(v, H, {hs});
    case role::ssm_norm: {  // [D] or [G, D / G], read as its D channels
      const tensor_view flat(v.type(), troupe::shape{D}, v.data());
      return rows_part(flat, D, {xs});
    }
    case role::ssm_out: {
      auto t = columns_of(v, xs.first, xs.second);
      if (!t) return unexpected(t.error());
      return part{(*t)->view(), *t};
    }
    default: return part{v, nullptr};
  }
}

// A Gated DeltaNet layer's weight for rank `rank` of `size` (key heads split evenly, each with its value
// heads): its key heads' groups of in_proj_qkvz and in_proj_ba, their q, k and v rows of attn_qkv and
// channels of the conv, their value heads' gate rows, dt bias and A, and the output projection's columns.
static result<part, std::string> gated_delta_part(const weight_entry& e, const gated_delta_params& g, int rank, int size) {
  const std::int64_t kw = g.key_width(), vw = g.value_width(), Hk = g.key_heads, H = g.value_heads;
  const std::pair<std::int64_t, std::int64_t> ks{rank * kw / size, (rank + 1) * kw / size}, vs{rank * vw / size, (rank + 1) * vw / size};
  const std::pair<std::int64_t, std::int64_t> hs{rank * H / size, (rank + 1) * H / size};
  auto shift = [](std::pair<std::int64_t, std::int64_t> p, std::int64_t by) { return std::pair{p.first + by, p.second + by}; };
  const auto& v = e.view;
  const std::int64_t kh0 = rank * Hk / size, kh1 = (rank + 1) * Hk / size;
  switch (e.role.kind) {
    case role::ssm_in: {  // per key head [q | k | v | z]: this rank's key heads, contiguous
      const std::int64_t per = 2 * kw + 2 * vw;
      return rows_part(v, per, {{kh0 * per / Hk, kh1 * per / Hk}});
    }
    case role::ssm_ba: return rows_part(v, 2 * H, {{kh0 * 2 * H / Hk, kh1 * 2 * H / Hk}});  // per key head [b | a]
    case role::attn_qkv:
    case role::ssm_conv1d: return rows_part(v, 2 * kw + vw, {ks, shift(ks, kw), shift(vs, 2 * kw)});
    case role::attn_gate: return rows_part(v, vw, {vs});
    case role::ssm_dt_bias:
    case role::ssm_a:
    case role::ssm_a_log: return rows_part(v, H, {hs});
    case role::ssm_out: {
      auto t = columns_of(v, vs.first, vs.second);
      if (!t) return unexpected(t.error());
      return part{(*t)->view(), *t};
    }
    default: return part{v, nullptr};
  }
}

result<std::unique_ptr<model>, model_error> dense_decoder::shard(int rank, int size) const {
  if (spec_.mtp_layers > 0) return drop_mtp()->shard(rank, size);
  auto refuse = [&](std::string why) {
    return unexpected(model_error{config_error{spec_.config.family, "tensor_parallel", std::move(why)}});
  };
  if (size < 1 || rank < 0 || rank >= size) return refuse("rank " + std::to_string(rank) + " of " + std::to_string(size));
  if (spec_.stack.stages != 1) return refuse("a pipeline stage is not split further: shard the model, then stage the shard");
  dense_decoder_spec s = spec_;
  const std::int64_t F = spec_.ffn.width;
  if (F % size != 0) return refuse("the feed-forward width " + std::to_string(F) + " does not split " + std::to_string(size) + " ways");
  using kind = dense_decoder_spec::layer_kind;
  const auto attends = [&](std::int64_t l) { return spec_.attends(l); };
  const auto has_kind = [&](kind k) { return std::any_of(spec_.kinds.begin(), spec_.kinds.end(), [k](kind x) { return x == k; }); };
  // Recurrent layers split by heads; their states follow their heads (each rank declares its part).
  if (has_kind(kind::shortconv_ffn)) return refuse("short-convolution layers (LFM2) are not split across ranks");
  if (has_kind(kind::mamba2) || has_kind(kind::mamba2_ffn) || has_kind(kind::parallel_ffn)) {
    auto& m = s.mamba2;
    if (m.heads % size != 0) return refuse(std::to_string(m.heads) + " Mamba2 heads do not split " + std::to_string(size) + " ways");
    // B/C groups split over the ranks, or (fewer groups than ranks) each rank holds its heads' one group.
    if (m.groups % size != 0 && size % m.groups != 0)
      return refuse(std::to_string(m.groups) + " Mamba2 B/C groups neither split " + std::to_string(size) + " ways nor divide the ranks");
    // The gated norm: its groups split over the ranks, or one group spans them all (its sum of squares
    // all-reduced); a norm group over some ranks but not all would need a subgroup.
    const std::int64_t ng = m.gated_norm_groups();
    if (ng % size != 0 && ng != 1)
      return refuse("the Mamba2 gated norm spans " + std::to_string(ng) + " groups, which neither split " + std::to_string(size) +
                    " ways nor are one over every rank");
    if (m.gated_norm && ng % size != 0) m.norm_ranks = size;
    m.norm_groups = ng % size == 0 ? ng / size : 1;
    m.inner /= size;
    m.heads /= size;
    m.groups = m.groups % size == 0 ? m.groups / size : 1;
    m.reduce_output = size > 1;
  }
  if (has_kind(kind::gated_delta)) {
    auto& g = s.gated_delta;
    if (g.key_heads % size != 0)
      return refuse(std::to_string(g.key_heads) + " linear-attention key heads do not split " + std::to_string(size) + " ways");
    g.key_heads /= size;
    g.value_heads /= size;
    g.reduce_output = size > 1;
  }
  for (std::size_t li = 0; li < s.attention.size(); ++li) {
    auto& a = s.attention[li];
    if (!s.kinds.empty() && !attends(static_cast<std::int64_t>(li))) continue;  // a recurrent or MLP layer: no heads here
    if (a.qk_norm_full && size > 1) return refuse("q and k are normed over all heads together, which a split by heads cannot do");
    if (a.heads % size != 0) return refuse(std::to_string(a.heads) + " query heads do not split " + std::to_string(size) + " ways");
    if (a.kv_heads % size != 0 && size % a.kv_heads != 0)
      return refuse(std::to_string(a.kv_heads) + " key/value heads neither split " + std::to_string(size) + " ways nor share evenly");
    if (a.alibi) {  // the shard's heads keep their slopes
      if (a.alibi_heads == 0) a.alibi_heads = a.heads;
      a.alibi_offset += rank * (a.heads / size);
    }
    a.heads /= size;
    a.kv_heads = a.kv_heads >= size ? a.kv_heads / size : 1;
    a.reduce_output = size > 1;
  }
  s.ffn.width = F / size;
  s.ffn.reduce_output = size > 1;
  for (auto& m : s.moe) {
    if (m.experts == 0) continue;
    if (spec_.expert_parallel) {
      if (m.experts % size != 0) return refuse(std::to_string(m.experts) + " experts do not split " + std::to_string(size) + " ways");
      if (m.shared_width % size != 0)
        return refuse("the shared experts' width " + std::to_string(m.shared_width) + " does not split " + std::to_string(size) + " ways");
      m.local_experts = m.experts / size;
      m.expert_offset = rank * m.local_experts;
      m.shared_width /= size;
      m.reduce_output = size > 1;
      continue;
    }
    if (m.width % size != 0) return refuse("the experts' width " + std::to_string(m.width) + " does not split " + std::to_string(size) + " ways");
    if (m.shared_width % size != 0)
      return refuse("the shared experts' width " + std::to_string(m.shared_width) + " does not split " + std::to_string(size) + " ways");
    m.width /= size;
    m.shared_width /= size;
    m.reduce_output = size > 1;
  }
  // The head is split by vocabulary rows when they divide (each rank computes its slice of the logits,
  // an all_gather joins them); otherwise every rank holds it whole.
  const std::int64_t V = spec_.stack.vocab;
  const bool split_head = size > 1 && V % size == 0;
  s.stack.vocab_split = split_head ? size : 1;
  for (std::size_t li = 0; li < s.attention.size(); ++li)
    if (s.kinds.empty() || attends(static_cast<std::int64_t>(li))) {  // the first attention layer's KV
      if (s.attention[li].mla.kv_lora_rank == 0) s.config.kv_elems_per_token_per_layer = 2 * s.attention[li].kv_heads * s.attention[li].head_dim;
      break;
    }

  std::vector<weight_entry> out;
  std::vector<std::shared_ptr<const tensor>> owned;
  for (const auto& e : weights_.entries()) {
    weight_entry w = e;
    const auto r = e.role.kind;
    const std::int32_t l = e.role.layer;
    if (spec_.mamba2_at(l) && is_mamba2_role(r)) {
      auto v = mamba2_part(e, spec_.mamba2, rank, size);
      if (!v) return refuse(e.key + ": " + v.error());
      if (v->second) owned.push_back(v->second);
      w.view = v->first;
      out.push_back(std::move(w));
      continue;
    }
    if (spec_.kind(l) == kind::gated_delta && (r == role::ssm_in || r == role::attn_qkv || r == role::attn_gate || r == role::ssm_ba ||
                                               r == role::ssm_conv1d || r == role::ssm_dt_bias || r == role::ssm_a || r == role::ssm_a_log ||
                                               r == role::ssm_out)) {
      auto v = gated_delta_part(e, spec_.gated_delta, rank, size);
      if (!v) return refuse(e.key + ": " + v.error());
      if (v->second) owned.push_back(v->second);
      w.view = v->first;
      out.push_back(std::move(w));
      continue;
    }
    if (l < 0 || l >= static_cast<std::int32_t>(spec_.attention.size())) {
      if (r == role::output && split_head) {
        w.view = rows_of(e.view, rank * V / size, (rank + 1) * V / size);
      } else if (r == role::token_embd && split_head && !weights_.has({role::output, -1})) {
        // Tied: the embedding stays whole for the lookup; the head is a role of its own over its rows.
        weight_entry head = e;
        head.role = {role::output, -1};
        head.view = rows_of(e.view, rank * V / size, (rank + 1) * V / size);
        out.push_back(std::move(head));
      }
      out.push_back(std::move(w));  // embeddings, the final norm: whole on every rank
      continue;
    }
    const auto& a = spec_.attention[static_cast<std::size_t>(l)];
    const std::int64_t D = a.head_dim, hq = a.heads / size;
    const std::int64_t kv_l = a.kv_heads >= size ? a.kv_heads / size : 1;
    const std::int64_t kv0 = a.kv_heads >= size ? rank * kv_l : rank / (size / a.kv_heads);
    // With an output gate each head's rows are [q | gate]: twice as many per head.
    const std::int64_t qh_rows = a.output_gate ? 2 * D : D;
    const std::pair<std::int64_t, std::int64_t> q_rows{rank * hq * qh_rows, (rank + 1) * hq * qh_rows};
    const std::pair<std::int64_t, std::int64_t> o_cols{rank * hq * D, (rank + 1) * hq * D};
    const std::pair<std::int64_t, std::int64_t> kv_rows{kv0 * D, (kv0 + kv_l) * D};
    const std::int64_t f = F / size;
    const std::pair<std::int64_t, std::int64_t> f_rows{rank * f, (rank + 1) * f};
    if (a.mla.kv_lora_rank > 0 && (r == role::attn_q || r == role::attn_q_b || r == role::attn_k_b || r == role::attn_v_b || r == role::attn_output)) {
      // Latent attention splits by query head; the latent projection and the cache stay whole.
      const std::int64_t qh = a.mla.nope + a.head_dim;
      if (r == role::attn_q || r == role::attn_q_b) {
        w.view = rows_of(e.view, rank * hq * qh, (rank + 1) * hq * qh);
      } else if (r == role::attn_output) {
        auto t = columns_of(e.view, rank * hq * a.mla.v_dim, (rank + 1) * hq * a.mla.v_dim);
        if (!t) return refuse(e.key + ": " + t.error());
        w.view = (*t)->view();
        owned.push_back(std::move(*t));
      } else {
        const auto& d3 = e.view.shape();
        const auto per = *storage_bytes(e.view.type(), static_cast<std::uint64_t>(d3[1] * d3[2]));
        w.view = tensor_view(e.view.type(), troupe::shape{hq, d3[1], d3[2]}, e.view.data() + static_cast<std::size_t>(rank * hq) * per);
      }
    } else if (r == role::attn_sinks) {
      w.view = rows_of(e.view, rank * hq, (rank + 1) * hq);  // each query head's own sink
    } else if (const auto* mb = spec_.routed(l); mb && (r == role::ffn_gate_exps_bias || r == role::ffn_up_exps_bias || r == role::ffn_down_exps_bias)) {
      const std::int64_t E = mb->experts;
      if (spec_.expert_parallel) {  // this rank's experts' rows
        const std::int64_t local = E / size;
        const auto per = e.view.row_bytes();
        w.view = tensor_view(e.view.type(), troupe::shape{local, e.view.shape()[1]}, e.view.data() + static_cast<std::size_t>(rank * local) * per);
      } else if (r == role::ffn_down_exps_bias) {
        // Added after the products, before the all_reduce: on one rank only, zeros elsewhere.
        if (rank != 0) {
          auto z = std::make_shared<tensor>(e.view.type(), e.view.shape());
          w.view = z->view();
          owned.push_back(std::move(z));
        }
      } else {  // gate and up: each expert's columns of this rank's width
        const std::int64_t cut = mb->width / size;
        auto t = columns_of(e.view, rank * cut, (rank + 1) * cut);
        if (!t) return refuse(e.key + ": " + t.error());
        w.view = (*t)->view();
        owned.push_back(std::move(*t));
      }
    } else if (r == role::attn_q || r == role::attn_q_bias) {
      w.view = rows_of(e.view, q_rows.first, q_rows.second);
    } else if (r == role::attn_k || r == role::attn_v || r == role::attn_k_bias || r == role::attn_v_bias) {
      w.view = rows_of(e.view, kv_rows.first, kv_rows.second);
    } else if ((r == role::attn_qkv || r == role::attn_qkv_bias) && e.stored == stored_as::qkv_per_head) {
      w.view = rows_of(e.view, rank * hq * 3 * D, (rank + 1) * hq * 3 * D);  // this rank's heads, each [q | k | v]
    } else if (r == role::attn_qkv || r == role::attn_qkv_bias) {
      const std::int64_t q = a.heads * D, kv = a.kv_heads * D;
      auto t = stack_rows(e.view, {q_rows, {q + kv_rows.first, q + kv_rows.second}, {q + kv + kv_rows.first, q + kv + kv_rows.second}});
      w.view = t->view();
      owned.push_back(std::move(t));
    } else if (r == role::ffn_gate || r == role::ffn_up || r == role::ffn_gate_bias || r == role::ffn_up_bias) {
      w.view = rows_of(e.view, f_rows.first, f_rows.second);
    } else if (r == role::ffn_gate_up || r == role::ffn_gate_up_bias) {
      auto t = stack_rows(e.view, {f_rows, {F + f_rows.first, F + f_rows.second}});
      w.view = t->view();
      owned.push_back(std::move(t));
    } else if (const auto* m = spec_.routed(l); m && (r == role::ffn_gate_exps || r == role::ffn_up_exps || r == role::ffn_down_exps ||
                                                       r == role::ffn_gate_shexp || r == role::ffn_up_shexp || r == role::ffn_down_shexp)) {
      const bool shexp = r == role::ffn_gate_shexp || r == role::ffn_up_shexp || r == role::ffn_down_shexp;
      if (spec_.expert_parallel && !shexp) {
        // Whole experts: this rank's [rank E / size, (rank + 1) E / size), a view of their bytes.
        const auto& d3 = e.view.shape();
        const std::int64_t local = m->experts / size;
        const auto per = *storage_bytes(e.view.type(), static_cast<std::uint64_t>(d3[1] * d3[2]));
        w.view = tensor_view(e.view.type(), troupe::shape{local, d3[1], d3[2]}, e.view.data() + static_cast<std::size_t>(rank * local) * per);
        out.push_back(std::move(w));
        continue;
      }
      // Every expert keeps its rows (or columns) [rank w / size, (rank + 1) w / size) of its width w.
      const std::int64_t Wd = shexp ? m->shared_width : m->width, cut = Wd / size, E = shexp ? 1 : m->experts;
      const auto& d3 = e.view.shape();
      if (r == role::ffn_down_exps || r == role::ffn_down_shexp) {
        const std::int64_t Hh = shexp ? d3[0] : d3[1];
        const tensor_view flat(e.view.type(), troupe::shape{E * Hh, Wd}, e.view.data());
        auto t = columns_of(flat, rank * cut, (rank + 1) * cut);
        if (!t) return refuse(e.key + ": " + t.error());
        w.view = shexp ? (*t)->view() : tensor_view(e.view.type(), troupe::shape{E, Hh, cut}, (*t)->data());
        owned.push_back(std::move(*t));
      } else {
        const std::int64_t Hh = shexp ? d3[1] : d3[2];
        const tensor_view flat(e.view.type(), troupe::shape{E * Wd, Hh}, e.view.data());
        std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
        for (std::int64_t x = 0; x < E; ++x) ranges.emplace_back(x * Wd + rank * cut, x * Wd + (rank + 1) * cut);
        auto t = stack_rows(flat, ranges);
        w.view = shexp ? t->view() : tensor_view(e.view.type(), troupe::shape{E, cut, Hh}, t->data());
        owned.push_back(std::move(t));
      }
    } else if (r == role::attn_output || r == role::ffn_down) {
      if (e.input_perm) return refuse(e.key + ": an act-order (desc_act) weight cannot be split along its input across ranks");
      const auto cols = r == role::attn_output ? o_cols : f_rows;
      auto t = columns_of(e.view, cols.first, cols.second);
      if (!t) return refuse(e.key + ": " + t.error());
      w.view = (*t)->view();
      owned.push_back(std::move(*t));
    }
    // Everything else (norms, per-head q/k norms, the output biases added after the reduce): whole.
    out.push_back(std::move(w));
  }
  return std::unique_ptr<model>(new dense_decoder(std::move(s), weights_.derive(std::move(out), std::move(owned))));
}

result<std::unique_ptr<model>, model_error> dense_decoder::expert_parallel() const {
  if (spec_.mtp_layers > 0) return drop_mtp()->expert_parallel();
  if (spec_.moe.empty()) return model::expert_parallel();
  if (spec_.stack.stages != 1 || spec_.stack.vocab_split != 1 ||
      std::any_of(spec_.moe.begin(), spec_.moe.end(), [](const auto& m) { return m.reduce_output; }))
    return unexpected(model_error{config_error{spec_.config.family, "expert_parallel", "set it on the whole model, before any split"}});
  dense_decoder_spec s = spec_;
  s.expert_parallel = true;
  return std::unique_ptr<model>(new dense_decoder(std::move(s), weights_.derive(weights_.entries(), {})));
}

result<std::unique_ptr<model>, model_error> dense_decoder::with_kv_type(dtype t) const {
  if (t != dtype::f32 && t != dtype::f16 && t != dtype::bf16 && t != dtype::q8_0)
    return unexpected(model_error{config_error{spec_.config.family, "kv_type", "the KV cache is f32, f16, bf16 or q8_0, not " + std::string(name(t))}});
  if (t == dtype::q8_0) {
    const auto layers = static_cast<std::int64_t>(spec_.attention.size());
    for (std::int64_t l = 0; l < layers; ++l) {
      if (!spec_.attends(l)) continue;
      const auto& a = spec_.attention[static_cast<std::size_t>(l)];
      const std::int64_t row = a.mla.kv_lora_rank > 0 ? a.mla.kv_lora_rank + a.head_dim : a.head_dim;
      if (row % 32 != 0)
        return unexpected(model_error{config_error{spec_.config.family, "kv_type",
                                                   "a q8_0 KV cache needs cached head rows of whole 32-value blocks; layer " +
                                                       std::to_string(l) + "'s are " + std::to_string(row) + " wide"}});
    }
  }
  dense_decoder_spec s = spec_;
  s.kv_type = t;
  return std::unique_ptr<model>(new dense_decoder(std::move(s), weights_.derive(weights_.entries(), {})));
}

result<std::unique_ptr<model>, model_error> dense_decoder::stage(int stage, int stages) const {
  if (spec_.mtp_layers > 0) return drop_mtp()->stage(stage, stages);
  auto refuse = [&](std::string why) {
    return unexpected(model_error{config_error{spec_.config.family, "pipeline_parallel", std::move(why)}});
  };
  if (spec_.stack.stages != 1) return refuse("the model is a pipeline stage already");
  const std::int64_t L = spec_.stack.layers;
  if (stages < 1 || stage < 0 || stage >= stages) return refuse("stage " + std::to_string(stage) + " of " + std::to_string(stages));
  if (stages > L) return refuse(std::to_string(L) + " layers do not make " + std::to_string(stages) + " stages");
  const std::int64_t first = L * stage / stages, last = L * (stage + 1) / stages;
  const bool head = stage + 1 == stages;
  dense_decoder_spec s = spec_;
  s.stack.layers = last - first;
  s.stack.stage = stage;
  s.stack.stages = stages;
  s.config.layers = last - first;
  s.attention.assign(spec_.attention.begin() + first, spec_.attention.begin() + last);
  if (!spec_.kinds.empty()) s.kinds.assign(spec_.kinds.begin() + first, spec_.kinds.begin() + last);
  if (!spec_.moe.empty()) s.moe.assign(spec_.moe.begin() + first, spec_.moe.begin() + last);

  std::vector<weight_entry> out;
  const bool has_output = weights_.has({role::output, -1});
  for (const auto& e : weights_.entries()) {
    const auto r = e.role.kind;
    const std::int32_t l = e.role.layer;
    if (l < 0) {
      const bool keep = r == role::token_embd    ? stage == 0 || (head && !has_output)
                        : r == role::output      ? head
                        : r == role::output_norm ? head
                                                : true;  // rope_freqs and the like: every stage
      if (keep) out.push_back(e);
      continue;
    }
    if (l < first || l >= last) continue;
    weight_entry w = e;
    w.role.layer = static_cast<std::int32_t>(l - first);
    out.push_back(std::move(w));
  }
  return std::unique_ptr<model>(new dense_decoder(std::move(s), weights_.derive(std::move(out), {})));
}

}  // namespace troupe::families
