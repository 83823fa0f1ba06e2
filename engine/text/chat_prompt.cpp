#include "engine/text/chat_prompt.hpp"

namespace troupe::text {

result<std::vector<std::int32_t>, std::string> chat_prompt_ids(const text_codec& codec, const chat_template& tmpl,
                                                               std::string_view messages_json, std::string_view tools_json) {
  chat_render_options o;
  o.add_generation_prompt = true;
  o.tools_json = std::string(tools_json);
  const auto& sp = codec.specials();
  if (sp.bos) o.bos_token = std::string(codec.token_string(*sp.bos).value_or(""));
  if (sp.eos) o.eos_token = std::string(codec.token_string(*sp.eos).value_or(""));
  auto r = tmpl.render(std::string(messages_json), o);
  if (!r) return unexpected("chat template: " + r.error().message);
  auto ids = codec.encode(*r, false);
  if (!ids) return unexpected(ids.error().message());
  return std::vector<std::int32_t>(ids->begin(), ids->end());
}

}  // namespace troupe::text
