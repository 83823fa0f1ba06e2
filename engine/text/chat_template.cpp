#include "engine/text/chat_template.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <ctime>

#include "engine/text/jinja/detail/js_text.hpp"
#include "engine/text/jinja/parser.hpp"

namespace troupe::text {
namespace {

using json = nlohmann::ordered_json;

template_error input_error(std::string message) {
  template_error e;
  e.code = template_error_code::invalid_input;
  e.message = std::move(message);
  return e;
}

jinja::calendar_time utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  jinja::calendar_time t;
  t.year = parts.tm_year + 1900;
  t.month = parts.tm_mon + 1;
  t.day = parts.tm_mday;
  t.hour = parts.tm_hour;
  t.minute = parts.tm_min;
  return t;
}

// A special token as transformers reads it: a string, or an AddedToken object's content.
std::optional<std::string> token_text(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

struct chat_template::state {
  std::string source;
  jinja::program program;
};

result<chat_template, template_error> chat_template::parse(std::string_view source) {
  auto s = std::make_shared<state>();
  s->source = jinja::detail::sanitize_utf8(source);
  auto program = jinja::parse_source(s->source);
  if (!program) return troupe::unexpected(std::move(program.error()));
  s->program = std::move(*program);
  return chat_template(std::move(s));
}

const std::string& chat_template::source() const { return state_->source; }

result<std::string, template_error> chat_template::render(std::string_view messages_json,
                                                          const chat_render_options& options) const {
  const int max_depth = options.limits.max_recursion_depth;
  auto messages = jinja::value_from_json(messages_json, max_depth);
  if (!messages) return troupe::unexpected(std::move(messages.error()));
  if (!messages->is_list()) return troupe::unexpected(input_error("the messages must be a JSON array"));

  jinja::variables vars;
  auto put = [&vars](std::string name, jinja::value v) {
    for (auto& [k, existing] : vars)
      if (k == name) {
        existing = std::move(v);
        return;
      }
    vars.emplace_back(std::move(name), std::move(v));
  };
  put("messages", std::move(*messages));
  put("add_generation_prompt", jinja::value::boolean(options.add_generation_prompt));
  if (options.tools_json.empty()) {
    put("tools", jinja::value::none());
  } else {
    auto tools = jinja::value_from_json(options.tools_json, max_depth);
    if (!tools) return troupe::unexpected(std::move(tools.error()));
    put("tools", std::move(*tools));
  }
  put("documents", jinja::value::none());
  if (options.bos_token && !options.bos_token->empty()) put("bos_token", jinja::value::string(*options.bos_token));
  if (options.eos_token && !options.eos_token->empty()) put("eos_token", jinja::value::string(*options.eos_token));
  if (!options.extra_json.empty()) {
    auto extra = jinja::value_from_json(options.extra_json, max_depth);
    if (!extra) return troupe::unexpected(std::move(extra.error()));
    if (!extra->is_map()) return troupe::unexpected(input_error("the extra variables must be a JSON object"));
    for (const auto& [k, v] : extra->as_map().entries) put(k, v);
  }

  jinja::render_settings settings;
  settings.limits = options.limits;
  settings.now = options.date ? *options.date : utc_now();
  return jinja::render(state_->program, vars, settings);
}

result<chat_template_config, template_error> chat_template_from_config(std::string_view tokenizer_config_json,
                                                                        bool has_tools, std::string_view name) {
  json config;
  try {
    config = json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end());
  } catch (const json::exception& e) {
    return troupe::unexpected(input_error(std::string("tokenizer_config.json is not valid JSON: ") + e.what()));
  }
  if (!config.is_object()) return troupe::unexpected(input_error("tokenizer_config.json is not a JSON object"));
  chat_template_config out;
  out.bos_token = token_text(config, "bos_token");
  out.eos_token = token_text(config, "eos_token");
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return out;
  if (it->is_string()) {
    if (!name.empty() && name != "default")
      return troupe::unexpected(input_error("tokenizer_config.json has a single chat template, not one named '" +
                                            std::string(name) + "'"));
    out.source = it->get<std::string>();
    return out;
  }
  if (!it->is_array()) return troupe::unexpected(input_error("chat_template is neither a string nor a list"));
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string())
      return troupe::unexpected(input_error("chat_template list entries must be {name, template} strings"));
    named.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
  }
  auto find = [&](std::string_view n) -> const std::string* {
    for (const auto& [k, v] : named)
      if (k == n) return &v;
    return nullptr;
  };
  const std::string* chosen = nullptr;
  if (!name.empty()) chosen = find(name);
  else if (has_tools && find("tool_use")) chosen = find("tool_use");
  else chosen = find("default");
  if (chosen == nullptr) {
    std::string names;
    for (const auto& [k, v] : named) names += (names.empty() ? "" : ", ") + k;
    return troupe::unexpected(input_error(name.empty() ? "no default chat template among: " + names
                                                       : "no chat template named '" + std::string(name) +
                                                             "' among: " + names));
  }
  out.source = *chosen;
  return out;
}

}  // namespace troupe::text
