// Mistral: a Llama-shaped decoder whose attention may be limited to a sliding window of recent
// positions. Its GGUF form is architecture `llama` (llama.cpp converts it so), which the llama family
// reads; this family serves the Hugging Face form.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "mistral");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto spec = uniform_spec("mistral", *basics, r);
  auto window = r.positive_or("sliding_window", "", 0);
  if (!window) return unexpected(model_error{window.error()});
  for (auto& a : spec.attention) a.sliding_window = *window;
  const auto table = decoder_name_table({});
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "mistral"}};

}  // namespace

const family_entry mistral_entry{"mistral", keys, build};

}  // namespace troupe::families
