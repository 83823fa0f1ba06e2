#include "families/vision/vision.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <optional>

#include "engine/load/gguf.hpp"
#include "families/components/trace_context.hpp"
#include "families/weight_map.hpp"

namespace troupe::families {
namespace {

using graph::op;
using graph::value_id;

// SigLIP: patch embedding, learned positions, pre-norm LayerNorm blocks with biased projections and a
// tanh-GELU MLP, a final LayerNorm; then the projector.
class vision_encoder final : public model {
 public:
  vision_encoder(vision_spec s, families::weight_map w) : spec_(std::move(s)), weights_(std::move(w)) {
    config_.family = "vision";
    config_.hidden = spec_.text_hidden;
    config_.layers = spec_.layers;
    schema_.add_program(program::encode, {});
    (void)schema_.declare({.name = pixels_input, .element = dtype::f32, .width = {spec_.patch_values()}});
  }
  const model_config& config() const override { return config_; }
  const model_schema& schema() const override { return schema_; }
  const families::weight_map& weights() const override { return weights_; }

  void trace_into(const step_spec& spec, graph::builder& b) const override {
    if (spec.program != program::encode) return b.fail(graph::bad_declaration{"a vision tower offers the encode program only"});
    const std::int64_t P = spec_.patches(), D = spec_.hidden, H = spec_.heads, hd = D / H, K = spec_.patch_values();
    if (spec.shape.rows() != 1 || spec.shape.tokens() != P)
      return b.fail(graph::unsupported_shape{"a vision tower encodes one image of " + std::to_string(P) + " patches a step"});
    trace_context ctx(b, weights_, spec);
    auto px = ctx.request_input(pixels_input, {dtype::f32, {P, K}});
    if (!px.valid()) return b.fail(graph::bad_declaration{"the vision tower's step carries no pixels"});
    auto f32 = [&](value_id v) { return b.type_of(v).type == dtype::f32 ? v : b.cast(v, dtype::f32); };
    // The stride-p convolution as one product: each patch's 3 p p values against [D, 3 p p].
    auto w = b.reshape(f32(ctx.weight(role::patch_embd)), {D, K});
    auto x = b.matmul(px, b.transpose(w, {1, 0}));
    x = b.add(x, ctx.vector_f32(role::patch_embd_bias));
    x = b.add(x, f32(ctx.weight(role::position_embd)));
    b.label(x, "v.embed");
    // Every patch sees every patch: one row of P keys.
    tensor ix(dtype::i32, {1, P});
    for (std::int64_t i = 0; i < P; ++i) ix.as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
    const auto index = b.literal(std::move(ix), "v.index");
    tensor al(dtype::boolean, {1, P, P});
    std::memset(al.data(), 1, al.bytes());
    const auto allow = b.literal(std::move(al), "v.allow");
    auto ln = [&](value_id v, role r, std::int32_t l) { return b.layer_norm(v, ctx.vector_f32(r, l), ctx.vector_f32(bias_of(r), l), spec_.eps); };
    auto lin = [&](value_id v, role r, std::int32_t l) { return b.add(ctx.linear(v, r, l), ctx.vector_f32(bias_of(r), l)); };
    for (std::int32_t l = 0; l < static_cast<std::int32_t>(spec_.layers) && b.ok(); ++l) {
      b.push_scope("v.layers." + std::to_string(l));
      auto h = ln(x, role::attn_norm, l);
      auto q = b.reshape(lin(h, role::attn_q, l), {P, H, hd});
      auto k = b.reshape(lin(h, role::attn_k, l), {P, H, hd});
      auto v = b.reshape(lin(h, role::attn_v, l), {P, H, hd});
      auto a = b.attention(q, k, v, index, allow, 1.0 / std::sqrt(static_cast<double>(hd)));
      x = b.add(x, lin(b.reshape(a, {P, D}), role::attn_output, l));
      h = ln(x, role::ffn_norm, l);
      h = b.unary(op::gelu_tanh, lin(h, role::ffn_up, l));
      x = b.add(x, lin(h, role::ffn_down, l));
      b.label(x, "out");
      b.pop_scope();
    }
    x = ln(x, role::output_norm, -1);
    b.label(x, "v.out");
    // Gemma 3's projector: the patch grid average-pooled by merge x merge, RMS-normed, projected.
    const std::int64_t G = spec_.grid(), m = spec_.merge, g = G / m;
    x = b.reshape(x, {g, m, g, m, D});
    x = b.transpose(x, {0, 2, 1, 3, 4});  // [g, g, m, m, D]
    x = b.reshape(x, {g * g, m * m, D});
    x = b.reduce(op::reduce_mean, x, 1);
    x = b.rms_norm(x, ctx.vector_f32(role::mm_soft_emb_norm), spec_.eps);
    x = b.matmul(x, f32(ctx.weight(role::mm_input_proj)));
    b.output("embeds", x);
  }

 private:
  vision_spec spec_;
  families::weight_map weights_;
  model_config config_;
  model_schema schema_;
};

model_error cfg_error(std::string field, std::string reason) { return model_error{config_error{"vision", std::move(field), std::move(reason)}}; }

// The tower's name rules: `v` the vision model's prefix ("vision_tower.vision_model." or "v."), mm the projector's.
std::vector<name_rule> tower_rules(bool gguf, const std::string& v, const std::string& mm) {
  std::vector<name_rule> r;
  auto add = [&](role ro, bool per_layer, std::string key, stored_as st = stored_as::as_is) {
    name_rule n;
    n.role = ro;
    n.per_layer = per_layer;
    n.key = std::move(key);
    n.stored = st;
    r.push_back(std::move(n));
  };
  if (gguf) {
    add(role::patch_embd, false, "v.patch_embd.weight");
    add(role::patch_embd_bias, false, "v.patch_embd.bias");
    add(role::position_embd, false, "v.position_embd.weight");
    add(role::output_norm, false, "v.post_ln.weight");
    add(role::output_norm_bias, false, "v.post_ln.bias");
    const std::pair<role, const char*> per[] = {
        {role::attn_norm, "ln1"}, {role::ffn_norm, "ln2"}, {role::attn_q, "attn_q"},     {role::attn_k, "attn_k"},
        {role::attn_v, "attn_v"}, {role::attn_output, "attn_out"}, {role::ffn_up, "ffn_up"}, {role::ffn_down, "ffn_down"}};
    for (auto [ro, n] : per) {
      add(ro, true, "v.blk.{L}." + std::string(n) + ".weight");
      add(bias_of(ro), true, "v.blk.{L}." + std::string(n) + ".bias");
    }
    add(role::mm_soft_emb_norm, false, "mm.soft_emb_norm.weight");
    add(role::mm_input_proj, false, "mm.input_projection.weight");
    return r;
  }
  add(role::patch_embd, false, v + "embeddings.patch_embedding.weight");
  add(role::patch_embd_bias, false, v + "embeddings.patch_embedding.bias");
  add(role::position_embd, false, v + "embeddings.position_embedding.weight");
  add(role::output_norm, false, v + "post_layernorm.weight");
  add(role::output_norm_bias, false, v + "post_layernorm.bias");
  const std::pair<role, const char*> per[] = {{role::attn_norm, "layer_norm1"},      {role::ffn_norm, "layer_norm2"},
                                              {role::attn_q, "self_attn.q_proj"},    {role::attn_k, "self_attn.k_proj"},
                                              {role::attn_v, "self_attn.v_proj"},    {role::attn_output, "self_attn.out_proj"},
                                              {role::ffn_up, "mlp.fc1"},             {role::ffn_down, "mlp.fc2"}};
  for (auto [ro, n] : per) {
    add(ro, true, v + "encoder.layers.{L}." + std::string(n) + ".weight");
    add(bias_of(ro), true, v + "encoder.layers.{L}." + std::string(n) + ".bias");
  }
  add(role::mm_soft_emb_norm, false, mm + "mm_soft_emb_norm.weight", stored_as::minus_one);  // Gemma3RMSNorm: 1 + w
  add(role::mm_input_proj, false, mm + "mm_input_projection_weight");
  return r;
}

result<vision_tower, model_error> build_tower(vision_spec s, const load::weight_store& store, bool gguf, const std::string& v,
                                              const std::string& mm) {
  if (s.hidden < 1 || s.heads < 1 || s.hidden % s.heads != 0) return unexpected(cfg_error("hidden_size", "must be a positive multiple of the heads"));
  if (s.patch < 1 || s.image_size < s.patch || s.image_size % s.patch != 0)
    return unexpected(cfg_error("patch_size", "the image size must be a whole number of patches"));
  if (s.merge < 1 || s.grid() % s.merge != 0) return unexpected(cfg_error("mm_tokens_per_image", "the patch grid must pool evenly"));
  if (s.layers < 1 || s.layers > 512 || s.ffn < 1 || s.text_hidden < 1) return unexpected(cfg_error("num_hidden_layers", "out of range"));
  if (s.patches() > (1 << 16)) return unexpected(cfg_error("image_size", "more than 65536 patches"));
  const auto rules = tower_rules(gguf, v, mm);
  const std::int64_t D = s.hidden, F = s.ffn;
  auto shapes = [&](role r, std::int32_t layer) -> std::optional<troupe::shape> {
    switch (r) {
      case role::patch_embd: return troupe::shape{D, 3, s.patch, s.patch};
      case role::position_embd: return troupe::shape{s.patches(), D};
      case role::mm_soft_emb_norm: return troupe::shape{D};
      case role::mm_input_proj: return troupe::shape{D, s.text_hidden};
      case role::attn_q: case role::attn_k: case role::attn_v: case role::attn_output: return troupe::shape{D, D};
      case role::ffn_up: return troupe::shape{F, D};
      case role::ffn_down: return troupe::shape{D, F};
      case role::ffn_up_bias: return troupe::shape{F};
      default: return layer >= -1 ? std::optional<troupe::shape>(troupe::shape{D}) : std::nullopt;
    }
  };
  auto map = weight_map::build(store, rules, static_cast<std::int32_t>(s.layers), shapes);
  if (!map) return unexpected(model_error{map.error()});
  vision_tower t;
  t.spec = s;
  t.encoder = std::make_unique<vision_encoder>(s, std::move(*map));
  return t;
}

// The tower's sizes under the form's keys: hidden, ffn, layers, heads, image size, patch, the text
// model's width, then the optional norm epsilon.
std::optional<model_error> read_sizes(const load::raw_config& cfg, vision_spec& s, const std::array<std::string_view, 8>& keys) {
  std::int64_t* into[] = {&s.hidden, &s.ffn, &s.layers, &s.heads, &s.image_size, &s.patch, &s.text_hidden};
  for (std::size_t k = 0; k < std::size(into); ++k) {
    auto v = cfg.get_int(keys[k]);
    if (!v) return model_error{v.error()};
    *into[k] = *v;
  }
  if (auto e = cfg.get_float(keys[7])) s.eps = *e;
  return std::nullopt;
}

}  // namespace

result<vision_tower, model_error> vision_from_hf(const load::raw_config& cfg, const load::weight_store& store) {
  auto type = cfg.get_string("model_type");
  if (!type || *type != "gemma3") return unexpected(cfg_error("model_type", "a vision tower is read from Gemma 3 checkpoints (gemma3)"));
  vision_spec s;
  if (auto e = read_sizes(cfg, s, {"vision_config.hidden_size", "vision_config.intermediate_size", "vision_config.num_hidden_layers",
                                   "vision_config.num_attention_heads", "vision_config.image_size", "vision_config.patch_size",
                                   "text_config.hidden_size", "vision_config.layer_norm_eps"}))
    return unexpected(*e);
  const std::int64_t tokens = cfg.get_int("mm_tokens_per_image").value_or(256);
  const auto side = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(tokens))));
  if (side < 1 || side * side != tokens || s.patch < 1 || (s.image_size / s.patch) % side != 0)
    return unexpected(cfg_error("mm_tokens_per_image", "must be a square dividing the patch grid"));
  s.merge = (s.image_size / s.patch) / side;
  if (auto b = cfg.get_int("boi_token_index")) s.begin_id = static_cast<std::int32_t>(*b);
  if (auto e = cfg.get_int("eoi_token_index")) s.end_id = static_cast<std::int32_t>(*e);
  const bool nested = store.find("model.vision_tower.vision_model.post_layernorm.weight").has_value();
  return build_tower(s, store, false, nested ? "model.vision_tower.vision_model." : "vision_tower.vision_model.",
                     nested ? "model.multi_modal_projector." : "multi_modal_projector.");
}

result<vision_tower, model_error> vision_from_mmproj(const std::filesystem::path& path) {
  auto st = load::weight_store::open(path);
  if (!st) return unexpected(model_error{st.error()});
  auto store = std::make_shared<const load::weight_store>(std::move(*st));
  if (!store->gguf()) return unexpected(cfg_error("mmproj", "an mmproj is a GGUF file"));
  const auto cfg = load::raw_config::from_gguf(store->gguf()->get());
  auto arch = cfg.get_string("general.architecture");
  if (!arch || *arch != "clip") return unexpected(cfg_error("general.architecture", "an mmproj's architecture is clip"));
  auto proj = cfg.get_string("clip.projector_type");
  if (!proj) proj = cfg.get_string("clip.vision.projector_type");
  if (!proj || *proj != "gemma3") return unexpected(cfg_error("clip.projector_type", "the gemma3 projector is the one served"));
  vision_spec s;
  if (auto e = read_sizes(cfg, s, {"clip.vision.embedding_length", "clip.vision.feed_forward_length", "clip.vision.block_count",
                                   "clip.vision.attention.head_count", "clip.vision.image_size", "clip.vision.patch_size",
                                   "clip.vision.projection_dim", "clip.vision.attention.layer_norm_epsilon"}))
    return unexpected(*e);
  s.merge = cfg.get_int("clip.vision.projector.scale_factor").value_or(4);
  if (auto m = cfg.get_float_array("clip.vision.image_mean"); m && m->size() == 3)
    for (int c = 0; c < 3; ++c) s.mean[c] = static_cast<float>((*m)[c]);
  if (auto m = cfg.get_float_array("clip.vision.image_std"); m && m->size() == 3)
    for (int c = 0; c < 3; ++c) s.std[c] = static_cast<float>((*m)[c]);
  auto t = build_tower(s, *store, true, "v.", "mm.");
  if (!t) return t;
  t->store = std::move(store);
  return t;
}

tensor preprocess(const image_u8& img, const vision_spec& s) {
  const std::int64_t S = s.image_size;
  image_u8 sized;
  if (img.width == S && img.height == S) {
    sized = img;
  } else {
    // Aspect kept, sizes rounded up, centred on black.
    const double scale = std::min(static_cast<double>(S) / static_cast<double>(img.width), static_cast<double>(S) / static_cast<double>(img.height));
    const auto nw = std::min<std::int64_t>(static_cast<std::int64_t>(std::ceil(static_cast<float>(img.width) * static_cast<float>(scale))), S);
    const auto nh = std::min<std::int64_t>(static_cast<std::int64_t>(std::ceil(static_cast<float>(img.height) * static_cast<float>(scale))), S);
    const auto r = resize(img, std::max<std::int64_t>(nw, 1), std::max<std::int64_t>(nh, 1), resample::bilinear);
    sized = image_u8{S, S, std::vector<std::uint8_t>(static_cast<std::size_t>(S * S * 3), 0)};
    const std::int64_t ox = (S - r.width) / 2, oy = (S - r.height) / 2;
    for (std::int64_t y = 0; y < r.height; ++y)
      std::memcpy(&sized.rgb[static_cast<std::size_t>(((y + oy) * S + ox) * 3)], &r.rgb[static_cast<std::size_t>(y * r.width * 3)],
                  static_cast<std::size_t>(r.width * 3));
  }
  const std::int64_t p = s.patch, G = s.grid();
  tensor out(dtype::f32, {s.patches(), s.patch_values()});
  float* o = out.as<float>();
  for (std::int64_t py = 0; py < G; ++py)
    for (std::int64_t px = 0; px < G; ++px)
      for (int c = 0; c < 3; ++c)
        for (std::int64_t ky = 0; ky < p; ++ky)
          for (std::int64_t kx = 0; kx < p; ++kx) {
            const auto y = py * p + ky, x = px * p + kx;
            const float v = static_cast<float>(sized.rgb[static_cast<std::size_t>((y * S + x) * 3 + c)]) / 255.0f;
            *o++ = (v - s.mean[static_cast<std::size_t>(c)]) / s.std[static_cast<std::size_t>(c)];
          }
  return out;
}

}  // namespace troupe::families
