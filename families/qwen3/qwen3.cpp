// Qwen 3 (dense): RMSNorm over each head of Q and K before RoPE (q_norm, k_norm), no projection
// biases, and a head width that need not be hidden / heads.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "qwen3");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto bias = r.flag_or("attention_bias", "", false);
  if (!bias) return unexpected(model_error{bias.error()});
  if (*bias) return unexpected(model_error{r.error("attention_bias", "Qwen 3 checkpoints have no attention biases")});
  auto spec = uniform_spec("qwen3", *basics, r);
  for (auto& a : spec.attention) a.qk_norm = true;
  name_table_options names;
  names.gguf = r.gguf();
  names.qk_norm = true;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "qwen3"}, {load::config_source::gguf, "qwen3"}};

}  // namespace

const family_entry qwen3_entry{"qwen3", keys, build};

}  // namespace troupe::families
