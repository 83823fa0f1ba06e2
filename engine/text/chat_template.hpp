#pragma once
// A chat template: the Jinja program in a model's tokenizer_config.json (or GGUF metadata) that turns
// a conversation into the prompt text the model was trained on. Parsed once, rendered per request,
// byte for byte as Hugging Face's apply_chat_template renders it with @huggingface/jinja. Inputs are
// JSON text so that callers need no JSON library in their headers; rendering is pure (the date
// strftime_now prints comes from the options) and bounded (see jinja::render_limits).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/jinja/interpreter.hpp"
#include "engine/text/template_error.hpp"

namespace troupe::text {

struct chat_render_options {
  bool add_generation_prompt = false;
  // A JSON array of tool schemas; empty: no tools (the template sees `tools` as none).
  std::string tools_json;
  // The special tokens as strings; absent ones are left undefined, as transformers leaves them.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // A JSON object whose entries become template variables (enable_thinking, reasoning_effort, ...);
  // they override the variables above of the same name. Empty: none.
  std::string extra_json;
  // What strftime_now formats; the current UTC time when absent.
  std::optional<jinja::calendar_time> date;
  jinja::render_limits limits;
};

class chat_template {
 public:
  // Parses a template source; invalid UTF-8 in it is replaced by U+FFFD first.
  static result<chat_template, template_error> parse(std::string_view source);

  // Renders `messages_json` (a JSON array of message objects) with the variables transformers passes:
  // messages, add_generation_prompt, tools, documents (none), bos_token, eos_token and the extras.
  result<std::string, template_error> render(std::string_view messages_json,
                                             const chat_render_options& options = {}) const;

  const std::string& source() const;

 private:
  struct state;
  explicit chat_template(std::shared_ptr<const state> s) : state_(std::move(s)) {}
  std::shared_ptr<const state> state_;
};

// The chat template and special tokens a tokenizer_config.json names.
struct chat_template_config {
  std::string source;  // empty when the config has no chat_template
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

// Reads tokenizer_config.json text. `chat_template` may be a string or a list of {name, template}; from
// a list, `name` picks one, else "tool_use" when the request has tools and the list has it, else
// "default" (transformers' rule). bos_token and eos_token may be strings or {"content": ...} objects.
// Errors are invalid_input.
result<chat_template_config, template_error> chat_template_from_config(std::string_view tokenizer_config_json,
                                                                        bool has_tools,
                                                                        std::string_view name = {});

}  // namespace troupe::text
