#pragma once
// Forced tool calls (`tool_choice: "required"` or a named function): a grammar whose sentences are one
// or more calls of the offered tools, each a JSON object naming a tool and giving arguments valid
// against its parameter schema, written in the model's own tool-call format (read from its chat
// template), so that the gateway's tool-call parser finds them.
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/result.hpp"
#include "engine/guide/guide_error.hpp"

namespace troupe::guide {

enum class tool_call_format : std::uint8_t {
  hermes,   // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one or more (Qwen, Hermes)
  mistral,  // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
  llama3,   // {"name": ..., "parameters": {...}} (Llama 3.x JSON calls)
  deepseek, // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
  json,     // [{"name": ..., "arguments": {...}}, ...] (a template with no format of its own)
};
std::string_view name(tool_call_format f);

// The format a chat template asks its model to call tools in.
tool_call_format tool_call_format_of(std::string_view chat_template);

// `tools_json`: OpenAI's tools array. `only`: a tool name (the named tool_choice), empty for any.
// `parallel`: one call or more (OpenAI's parallel_tool_calls); false: exactly one.
// Refused (bad_schema / unsupported) for a malformed tools array, a name not among them, or a
// parameter schema the JSON-schema converter refuses.
result<std::string, guide_error> tool_call_gbnf(std::string_view tools_json, std::string_view only, tool_call_format format,
                                                bool parallel = true);

// `gbnf` with every reference to and definition of rule `from` renamed `to` (literals and classes left
// alone); with `from` empty, every rule name gets `to` as a prefix.
std::string rename_rule(std::string_view gbnf, std::string_view from, std::string_view to);

}  // namespace troupe::guide
