// Qwen 2 and 2.5: a dense decoder with biases on the Q, K and V projections (never on O), NEOX-style
// RoPE in both checkpoint forms. The sliding-window variant (use_sliding_window with max_window_layers)
// is refused: no released checkpoint enables it.
#include "families/components/decoder_config.hpp"
#include "families/components/name_tables.hpp"
#include "families/families.hpp"

namespace troupe::families {
namespace {

result<std::unique_ptr<model>, model_error> build(const load::raw_config& cfg, const load::weight_store& store) {
  const config_reader r(cfg, "qwen2");
  auto basics = read_decoder_basics(r, store);
  if (!basics) return unexpected(model_error{basics.error()});
  auto sliding = r.flag_or("use_sliding_window", "", false);
  if (!sliding) return unexpected(model_error{sliding.error()});
  if (*sliding) return unexpected(model_error{r.error("use_sliding_window", "Qwen 2 sliding-window attention is not supported")});
  auto spec = uniform_spec("qwen2", *basics, r);
  name_table_options names;
  names.gguf = r.gguf();
  names.qkv_bias_required = true;
  const auto table = decoder_name_table(names);
  return make_dense_decoder(std::move(spec), store, table);
}

constexpr family_key keys[] = {{load::config_source::hf_json, "qwen2"}, {load::config_source::gguf, "qwen2"}};

}  // namespace

const family_entry qwen2_entry{"qwen2", keys, build};

}  // namespace troupe::families
