#include "families/components/mla.hpp"

#include <cstring>

#include "engine/core/quant.hpp"

namespace troupe::families {

using graph::value_id;

value_id mla_attention(decoder_trace& d, value_id x, std::int32_t layer, const attention_params& p) {
  auto& ctx = d.ctx();
  auto& b = ctx.b;
  const std::int64_t N = b.type_of(x).dims[0], H = p.heads, L = p.mla.kv_lora_rank, nope = p.mla.nope, R = p.head_dim,
                     V = p.mla.v_dim;
  value_id q = ctx.has(role::attn_q_a, layer)
                   ? d.projection(b.rms_norm(d.projection(x, role::attn_q_a, layer), ctx.vector_f32(role::attn_q_a_norm, layer), p.norm_eps),
                               role::attn_q_b, layer)
                   : d.projection(x, role::attn_q, layer);
  q = b.reshape(q, {N, H, nope + R});
  double rscale = 1.0;
  const auto inv = d.rope_table(p.rope, rscale);
  // DeepSeek rotates adjacent pairs of the rotary part (llama.cpp's NORM rope; HF's permute + rotate_half).
  const auto q_pe = b.rope(b.slice(q, 2, nope, nope + R), ctx.positions(), inv, false, rscale);
  const auto kv = d.projection(x, role::attn_kv_a_mqa, layer);
  const auto c = b.reshape(b.rms_norm(b.slice(kv, 1, 0, L), ctx.vector_f32(role::attn_kv_a_norm, layer), p.norm_eps), {N, 1, L});
  const auto k_pe = b.rope(b.reshape(b.slice(kv, 1, L, L + R), {N, 1, R}), ctx.positions(), inv, false, rscale);

  // Head h of every token reads expert h of the per-head matrices: linear_id over fixed ids.
  tensor heads(dtype::i32, {N, H});
  for (std::int64_t i = 0; i < N * H; ++i) heads.as<std::int32_t>()[i] = static_cast<std::int32_t>(i % H);
  const auto per_head = b.literal(std::move(heads), "mla.heads");
  const auto q_abs = b.linear_id(b.slice(q, 2, 0, nope), ctx.weight(role::attn_k_b, layer), per_head);  // [N, H, L]
  const auto Q = b.concat({q_abs, q_pe}, 2);
  const auto K = b.concat({c, k_pe}, 2);
  b.label(Q, "q");
  b.label(K, "k");
  // The cache holds each token's [c, k_pe] once: c, its first L dims, is the value too.
  const auto att = d.attend(Q, K, {}, layer, p.sliding_window, p.scale, p.softcap, {}, true, L);  // [N, H, L]
  const auto o = b.linear_id(att, ctx.weight(role::attn_v_b, layer), per_head);         // [N, H, V]
  const auto out = d.projection(b.reshape(o, {N, H * V}), role::attn_output, layer, p.reduce_output);
  b.label(out, "attn_out");
  return out;
}

std::optional<troupe::shape> mla_shape(role r, const attention_params& p, std::int64_t D) {
  const std::int64_t H = p.heads, L = p.mla.kv_lora_rank, nope = p.mla.nope, R = p.head_dim, V = p.mla.v_dim, Q = p.mla.q_lora_rank;
  if (r == role::attn_q) return troupe::shape{H * (nope + R), D};
  if (r == role::attn_q_a) return troupe::shape{Q, D};
  if (r == role::attn_q_a_norm) return troupe::shape{Q};
  if (r == role::attn_q_b) return troupe::shape{H * (nope + R), Q};
  if (r == role::attn_kv_a_mqa) return troupe::shape{L + R, D};
  if (r == role::attn_kv_a_norm) return troupe::shape{L};
  if (r == role::attn_kv_b) return troupe::shape{H * (nope + V), L};
  if (r == role::attn_k_b) return troupe::shape{H, L, nope};
  if (r == role::attn_v_b) return troupe::shape{H, V, L};
  if (r == role::attn_output) return troupe::shape{D, H * V};
  return std::nullopt;
}

result<weight_map, weight_error> absorb_kv_b(const weight_map& m, const std::vector<attention_params>& layers) {
  bool any = false;
  for (const auto& e : m.entries()) any = any || e.role.kind == role::attn_kv_b;
  if (!any) return m.derive(m.entries(), {});
  std::vector<weight_entry> out;
  std::vector<std::shared_ptr<const tensor>> owned;
  for (const auto& e : m.entries()) {
    if (e.role.kind != role::attn_kv_b) {
      out.push_back(e);
      continue;
    }
    const auto& p = layers[static_cast<std::size_t>(e.role.layer)];
    const std::int64_t H = p.heads, L = p.mla.kv_lora_rank, nope = p.mla.nope, V = p.mla.v_dim;
    const auto& v = e.view;
    // Per head h, kv_b's rows [h (nope + V), h (nope + V) + nope) are W_uk[h] [nope, L] and the next V
    // rows W_uv[h] [V, L]. k_b[h] = W_uk[h]^T [L, nope] (f32: a transpose cannot keep block rows);
    // v_b[h] = W_uv[h] in the stored format.
    // An act-order kv_b (GPTQ desc_act) stores its columns in its own order: both halves are decoded to
    // f32 with the columns put back (k_b is f32 anyway; v_b's rows then cost 4 bytes a weight).
    const std::int32_t* perm = e.input_perm ? reinterpret_cast<const std::int32_t*>(e.input_perm->data()) : nullptr;
    auto col = [&](std::int64_t l) { return perm ? static_cast<std::int64_t>(perm[l]) : l; };
    auto kb = std::make_shared<tensor>(dtype::f32, troupe::shape{H, L, nope});
    auto vb = std::make_shared<tensor>(perm ? dtype::f32 : v.type(), troupe::shape{H, V, L});
    std::vector<float> row(static_cast<std::size_t>(L));
    const std::size_t rb = v.row_bytes();
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t n = 0; n < nope; ++n) {
        const std::byte* src = v.data() + static_cast<std::size_t>(h * (nope + V) + n) * rb;
        if (auto r = dequantize_row(v.type(), src, row.data(), L); !r)
          return unexpected(weight_error{weight_error_code::unsupported_dtype, e.role, e.key, "a float or block type", std::string(name(v.type()))});
        for (std::int64_t l = 0; l < L; ++l) kb->as<float>()[(h * L + col(l)) * nope + n] = row[static_cast<std::size_t>(l)];
      }
      if (!perm) {
        std::memcpy(vb->data() + static_cast<std::size_t>(h * V) * rb, v.data() + static_cast<std::size_t>(h * (nope + V) + nope) * rb,
                    static_cast<std::size_t>(V) * rb);
        continue;
      }
      for (std::int64_t r = 0; r < V; ++r) {
        if (auto d = dequantize_row(v.type(), v.data() + static_cast<std::size_t>(h * (nope + V) + nope + r) * rb, row.data(), L); !d)
          return unexpected(weight_error{weight_error_code::unsupported_dtype, e.role, e.key, "a float or block type", std::string(name(v.type()))});
        for (std::int64_t l = 0; l < L; ++l) vb->as<float>()[(h * V + r) * L + col(l)] = row[static_cast<std::size_t>(l)];
      }
    }
    out.push_back({{role::attn_k_b, e.role.layer}, e.key, kb->view(), stored_as::as_is});
    out.push_back({{role::attn_v_b, e.role.layer}, e.key, vb->view(), stored_as::as_is});
    owned.push_back(std::move(kb));
    owned.push_back(std::move(vb));
  }
  return m.derive(std::move(out), std::move(owned));
}

}  // namespace troupe::families
