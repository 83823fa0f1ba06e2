// Phi-3 and Phi-3.5 (and Phi-4-mini's partial rotary width): fused projections, one qkv_proj for Q, K
// and V and one gate_up_proj for the SwiGLU halves (gate first), NEOX-style RoPE, an optional sliding
// window. LongRoPE scaling (the 128k variants, Phi-3.5, Phi-4-mini) is read by the shared rope reader.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "phi3");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto window = r.positive_or("sliding_window", "attention.sliding_window", 0);
  if (!window) return unexpected(model_error{window.error()});
  auto spec = uniform_spec("phi3", *basics, r);
  for (auto& a : spec.attention) a.sliding_window = *window >= basics->max_positions ? 0 : *window;
  name_table_options names;
  names.gguf = r.gguf();
  names.fused = true;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "phi3"}, {load::config_source::gguf, "phi3"}};

}  // namespace

const family_entry phi3_entry{"phi3", keys, build};

}  // namespace troupe::families
