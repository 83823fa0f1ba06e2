#include "families/components/mtp.hpp"

namespace troupe::families {

using graph::op;

void mtp_stack(decoder_trace& d, const stack_params& p, std::int32_t layer, const decoder_trace::block_fn& mixer,
               const decoder_trace::block_fn& ffn, const mtp_options& o) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const auto& s = ctx.shape();
  const std::int64_t rows = s.rows(), T = s.tokens(), N = rows * T, H = p.hidden;
  const bool own_embed = ctx.has(role::nextn_embed_tokens, layer);
  auto e = b.gather_rows(own_embed ? ctx.weight(role::nextn_embed_tokens, layer) : ctx.weight(role::token_embd), ctx.token_ids());
  if (!b.ok()) return;
  if (b.type_of(e).type != dtype::f32) e = b.cast(e, dtype::f32);
  if (p.embed_scale != 1.0) e = b.mul(e, b.scalar(p.embed_scale));
  // vLLM masks the embedding at position 0 (no token precedes it in the MTP's training).
  if (o.zero_first_embedding) {
    const auto first = b.reshape(b.binary(op::equal, ctx.positions(), b.scalar(0, dtype::i32)), {N, 1});
    e = b.where(first, b.scalar(0.0), e);
  }
  const auto h = ctx.hidden_states(H);
  b.push_scope("mtp");
  const auto en = b.rms_norm(e, ctx.vector_f32(role::nextn_enorm, layer), p.norm_eps);
  const auto hn = b.rms_norm(h, ctx.vector_f32(role::nextn_hnorm, layer), p.norm_eps);
  auto x = ctx.linear(b.concat({en, hn}, 1), role::nextn_eh_proj, layer);
  b.label(x, "eh_proj");
  b.pop_scope();
  x = d.standard_layer(x, layer, p, mixer, ffn);
  if (!b.ok()) return;
  auto y = b.rms_norm(x, ctx.vector_f32(role::nextn_shared_head_norm, layer), p.norm_eps);
  b.output("hidden", o.hidden_after_norm ? y : x);
  if (s.logits() == logit_rows::last) y = b.reshape(b.slice(b.reshape(y, {rows, T, H}), 1, T - 1, T), {rows, H});
  const auto head = ctx.has(role::nextn_shared_head_head, layer) ? ctx.weight(role::nextn_shared_head_head, layer)
                    : ctx.has(role::output)                     ? ctx.weight(role::output)
                                                                : ctx.weight(role::token_embd);
  auto logits = b.linear(y, head);
  if (p.final_softcap > 0) {
    const auto cap = b.scalar(p.final_softcap);
    logits = b.mul(b.unary(op::tanh, b.div(logits, cap)), cap);
  }
  b.label(logits, "mtp.logits");
  b.output("logits", logits);
}

std::optional<troupe::shape> mtp_shape(role r, std::int64_t H, std::int64_t V) {
  switch (r) {
    case role::nextn_enorm:
    case role::nextn_hnorm:
    case role::nextn_shared_head_norm: return troupe::shape{H};
    case role::nextn_eh_proj: return troupe::shape{H, 2 * H};
    case role::nextn_embed_tokens:
    case role::nextn_shared_head_head: return troupe::shape{V, H};
    default: return std::nullopt;
  }
}

}  // namespace troupe::families
