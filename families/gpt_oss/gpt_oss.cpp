// gpt-oss: GQA attention with q/k/v/o biases and a learned sink logit per head, sliding-window and full
// attention alternating by layer (layer_types; GGUF: every other layer from the first, llama.cpp's
// pattern 2), NeoX rotary; routed feed-forwards whose router and experts have biases, the top k of the
// router's raw scores weighted by a softmax over those k, and the clamped SwiGLU
// min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1). GGUF stores the experts as llama.cpp's
// converter writes them (MXFP4 in the released files); HF stores them fused and transposed
// (mlp.experts.gate_up_proj [E, H, 2F] with gate and up interleaved, down_proj [E, F, H]), split here at
// load into the roles the shared component reads.
#include "engine/core/quant.hpp"
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

// HF's fused, transposed expert tensors as the component's roles. A float type stays what it is; the
// values move, they are not rounded.
result<weight_map, weight_error> split_experts(const weight_map& m) {
  std::vector<weight_entry> out;
  std::vector<std::shared_ptr<const tensor>> owned;
  for (const auto& e : m.entries()) {
    const auto& r = e.role.kind;
    if (r != role::hf_gate_up_exps && r != role::hf_gate_up_exps_bias && r != role::hf_down_exps) {
      out.push_back(e);
      continue;
    }
    const auto& v = e.view;
    if (!is_float(v.type()))
      return unexpected(weight_error{weight_error_code::unsupported_dtype, e.role, e.key, "a float type (MXFP4 HF checkpoints: not yet)",
                                     std::string(name(v.type()))});
    const auto& s = v.shape();
    const std::int32_t l = e.role.layer;
    auto put = [&](role r, troupe::shape sh, auto&& index_of) {
      auto t = std::make_shared<tensor>(v.type(), sh);
      const std::int64_t n = t->numel();
      for (std::int64_t i = 0; i < n; ++i) store_element(v.type(), t->data(), i, load_element(v.type(), v.data(), index_of(i)));
      out.push_back({{r, l}, e.key, t->view(), stored_as::as_is});
      owned.push_back(std::move(t));
    };
    if (r == role::hf_gate_up_exps) {  // [E, H, 2F] -> gate [E, F, H] (even columns), up (odd)
      if (s.rank() != 3 || s[2] % 2 != 0)
        return unexpected(weight_error{weight_error_code::shape_mismatch, e.role, e.key, "[E, H, 2F]", s.str()});
      const std::int64_t E = s[0], H = s[1], F = s[2] / 2;
      for (int odd = 0; odd < 2; ++odd)
        put(odd ? role::ffn_up_exps : role::ffn_gate_exps, troupe::shape{E, F, H}, [=](std::int64_t i) {
          const std::int64_t x = i / (F * H), f = i / H % F, h = i % H;
          return (x * H + h) * 2 * F + 2 * f + odd;
        });
    } else if (r == role::hf_gate_up_exps_bias) {  // [E, 2F] -> [E, F] twice
      if (s.rank() != 2 || s[1] % 2 != 0)
        return unexpected(weight_error{weight_error_code::shape_mismatch, e.role, e.key, "[E, 2F]", s.str()});
      const std::int64_t E = s[0], F = s[1] / 2;
      for (int odd = 0; odd < 2; ++odd)
        put(odd ? role::ffn_up_exps_bias : role::ffn_gate_exps_bias, troupe::shape{E, F},
            [=](std::int64_t i) { return i / F * 2 * F + 2 * (i % F) + odd; });
    } else {  // down [E, F, H] -> [E, H, F]
      if (s.rank() != 3) return unexpected(weight_error{weight_error_code::shape_mismatch, e.role, e.key, "[E, F, H]", s.str()});
      const std::int64_t E = s[0], F = s[1], H = s[2];
      put(role::ffn_down_exps, troupe::shape{E, H, F}, [=](std::int64_t i) {
        const std::int64_t x = i / (H * F), h = i / F % H, f = i % F;
        return (x * F + f) * H + h;
      });
    }
  }
  return m.derive(std::move(out), std::move(owned));
}

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "gpt_oss");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  moe_keys keys;
  keys.experts_hf = "num_local_experts";
  keys.width_hf = "intermediate_size";  // the experts' width (GGUF: expert_feed_forward_length)
  keys.norm_hf = "";
  keys.norm_default = false;
  auto moe = read_moe(r, keys, basics->layers, basics->ffn);
  if (!moe) return unexpected(model_error{moe.error()});
  for (auto& m : *moe) {
    m.gate = gating::softmax_selected;
    m.act = activation::swiglu_oai;
  }
  auto window = r.positive("sliding_window", "attention.sliding_window");
  if (!window) return unexpected(model_error{window.error()});
  std::vector<std::string> types;
  if (!r.gguf() && r.raw().has("layer_types")) {
    auto t = r.raw().get_string_array("layer_types");
    if (!t || static_cast<std::int64_t>(t->size()) != basics->layers)
      return unexpected(model_error{r.error("layer_types", "must name each of the " + std::to_string(basics->layers) + " layers")});
    types = *t;
  }
  auto spec = uniform_spec("gpt_oss", *basics, r);
  for (std::int64_t l = 0; l < basics->layers; ++l) {
    auto& a = spec.attention[static_cast<std::size_t>(l)];
    a.sinks = true;
    const bool sliding = types.empty() ? l % 2 == 0 : types[static_cast<std::size_t>(l)] == "sliding_attention";
    if (!types.empty() && !sliding && types[static_cast<std::size_t>(l)] != "full_attention")
      return unexpected(model_error{r.error("layer_types", "unknown layer type '" + types[static_cast<std::size_t>(l)] + "'")});
    a.sliding_window = sliding ? *window : 0;
  }
  spec.moe = std::move(*moe);
  name_table_options names;
  names.gguf = r.gguf();
  names.gpt_oss = true;
  names.experts = routed_experts(spec.moe);
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table, r.gguf() ? weight_rewrite{} : weight_rewrite{split_experts});
}

constexpr family_key keys[] = {{load::config_source::hf_json, "gpt_oss"}, {load::config_source::gguf, "gpt-oss"}};

}  // namespace

const family_entry gpt_oss_entry{"gpt_oss", keys, build};

}  // namespace troupe::families
