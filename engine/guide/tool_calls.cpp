#include "engine/guide/tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <cctype>

#include "engine/guide/grammar.hpp"
#include "engine/guide/json_schema.hpp"

namespace troupe::guide {

std::string_view name(tool_call_format f) {
  switch (f) {
    case tool_call_format::hermes: return "hermes";
    case tool_call_format::mistral: return "mistral";
    case tool_call_format::llama3: return "llama3";
    case tool_call_format::deepseek: return "deepseek";
    case tool_call_format::json: return "json";
  }
  return "json";
}

tool_call_format tool_call_format_of(std::string_view t) {
  if (t.find("<tool_call>") != std::string_view::npos) return tool_call_format::hermes;
  if (t.find("[TOOL_CALLS]") != std::string_view::npos) return tool_call_format::mistral;
  if (t.find("tool▁calls▁begin") != std::string_view::npos) return tool_call_format::deepseek;
  if (t.find("<|python_tag|>") != std::string_view::npos || t.find("ipython") != std::string_view::npos) return tool_call_format::llama3;
  return tool_call_format::json;
}

std::string rename_rule(std::string_view g, std::string_view from, std::string_view to) {
  auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  std::string out;
  std::size_t i = 0;
  while (i < g.size()) {
    const char c = g[i];
    if (c == '"' || c == '[') {  // a literal or class: copied as is, escapes included
      const char close = c == '"' ? '"' : ']';
      out += c;
      ++i;
      while (i < g.size() && g[i] != close) {
        if (g[i] == '\\' && i + 1 < g.size()) out += g[i++];
        out += g[i++];
      }
      if (i < g.size()) out += g[i++];
    } else if (c == '#' || c == '{') {  // a comment, or a repetition count
      const char stop = c == '#' ? '\n' : '}';
      while (i < g.size() && g[i] != stop) out += g[i++];
    } else if (name_char(c)) {
      std::size_t e = i;
      while (e < g.size() && name_char(g[e])) ++e;
      const auto word = g.substr(i, e - i);
      if (from.empty()) out += std::string(to) + std::string(word);
      else out += word == from ? to : word;
      i = e;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

result<std::string, guide_error> tool_call_gbnf(std::string_view tools_json, std::string_view only, tool_call_format format, bool parallel) {
  using json = nlohmann::ordered_json;  // the call's keys in the order written here: name, then arguments
  auto tools = json::parse(tools_json, nullptr, false);
  if (tools.is_discarded() || !tools.is_array() || tools.empty())
    return unexpected(guide_error{guide_error_code::bad_schema, "tools", "a forced tool call needs a non-empty tools array"});
  const char* args = format == tool_call_format::llama3 ? "parameters" : "arguments";
  json calls = json::array();
  for (std::size_t k = 0; k < tools.size(); ++k) {
    const auto& t = tools[k];
    const json* fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
    if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return unexpected(guide_error{guide_error_code::bad_schema, "tools[" + std::to_string(k) + "]", "a tool is a function with a name"});
    const auto tool_name = (*fn)["name"].get<std::string>();
    if (!only.empty() && tool_name != only) continue;
    json params = fn->contains("parameters") && !(*fn)["parameters"].is_null() ? (*fn)["parameters"] : json{{"type", "object"}};
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", tool_name}}}, {args, params}}},
                     {"required", {"name", args}},
                     {"additionalProperties", false}});
  }
  if (calls.empty())
    return unexpected(guide_error{guide_error_code::bad_schema, "tool_choice", "no tool named '" + std::string(only) + "' is offered"});
  if (format == tool_call_format::deepseek) {
    // The name and the arguments stand apart: one rule per tool, each tool's argument grammar under
    // its own prefix so that their helper rules do not meet.
    static const std::string begin_all = "<｜tool▁calls▁begin｜>",
                             end_all = "<｜tool▁calls▁end｜>",
                             begin = "<｜tool▁call▁begin｜>",
                             sep = "<｜tool▁sep｜>",
                             end = "<｜tool▁call▁end｜>";
    std::string out, alts;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      const auto& c = calls[k];
      auto g = json_schema_to_gbnf(c["properties"][args].dump());
      if (!g) {
        auto e = g.error();
        e.where = "tools" + (e.where.empty() ? "" : " " + e.where);
        return unexpected(std::move(e));
      }
      const std::string prefix = "t" + std::to_string(k) + "-";
      out += rename_rule(*g, "", prefix);
      out += prefix + "call ::= " + gbnf_literal(begin + "function" + sep + c["properties"]["name"]["const"].get<std::string>() + "\n```json\n") +
             " " + prefix + "root " + gbnf_literal("\n```" + end) + "\n";
      alts += (k ? " | " : "") + prefix + "call";
    }
    out += "tool-call ::= " + alts + "\n";
    out += "root ::= " + gbnf_literal(begin_all) + (only.empty() && parallel ? " tool-call (\"\\n\" tool-call)* " : " tool-call ") + gbnf_literal(end_all) + "\n";
    return out;
  }
  const json schema = calls.size() == 1 ? calls[0] : json{{"anyOf", calls}};
  auto g = json_schema_to_gbnf(schema.dump());
  if (!g) {
    auto e = g.error();
    e.where = "tools" + (e.where.empty() ? "" : " " + e.where);
    return unexpected(std::move(e));
  }
  // The call's grammar under its own start rule; the wrapper is the format's. A named tool is called
  // once; "required" takes one call or more when parallel calls are allowed.
  std::string out = rename_rule(*g, "root", "tool-call");
  const bool many = only.empty() && parallel;
  switch (format) {
    case tool_call_format::hermes:
      out += "tool-call-tagged ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n";
      out += many ? "root ::= tool-call-tagged (\"\\n\" tool-call-tagged)*\n" : "root ::= tool-call-tagged\n";
      break;
    case tool_call_format::mistral:
      out += many ? "root ::= \"[TOOL_CALLS][\" tool-call (\", \" tool-call)* \"]\"\n" : "root ::= \"[TOOL_CALLS][\" tool-call \"]\"\n";
      break;
    case tool_call_format::llama3:
      out += "root ::= tool-call\n";
      break;
    case tool_call_format::deepseek:  // built above
      break;
    case tool_call_format::json:
      out += many ? "root ::= \"[\" tool-call (\", \" tool-call)* \"]\"\n" : "root ::= \"[\" tool-call \"]\"\n";
      break;
  }
  return out;
}

}  // namespace troupe::guide
