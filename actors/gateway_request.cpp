// The gateway's request readers and the tool-call parser (actors/gateway_request.hpp).
#include "actors/gateway_request.hpp"

#include <algorithm>
#include <random>

#include "actors/gateway.hpp"
#include "engine/guide/guide.hpp"
#include "engine/guide/tool_calls.hpp"

namespace troupe::actors {
namespace detail {

// JSON text; invalid UTF-8 (a token string that is a lone byte) becomes U+FFFD instead of throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const api_error& e) {
  json j = {{"error", {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                       {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return dump(j);
}

api_error from_transport(const transport::error& e) {
  api_error a;
  a.message = e.message;
  a.code = std::string(transport::name(e.code));
  using transport::error_code;
  switch (e.code) {
    case error_code::disconnected:  // the coordinator or the replica went away: retry once it is back
      a.status = 503;
      a.type = "server_error";
      break;
    case error_code::overloaded:
    case error_code::no_replica:  // a replica of it is being replaced: retry shortly
      a.status = 429;
      a.type = "rate_limit_error";
      break;
    case error_code::unknown_model: a.status = 404; break;
    case error_code::bad_request:
    case error_code::too_long:
    case error_code::invalid_request:
    case error_code::bad_input:
    case error_code::incompatible:
    case error_code::unsupported_feature:
    case error_code::no_head:
    case error_code::pool_too_small:
    case error_code::bad_message: a.status = 400; break;
    case error_code::program_not_offered:  // a completion asked of an encoder (BERT), which only embeds
      a.status = 400;
      a.param = "model";
      break;
    default:
      a.status = 500;
      a.type = "server_error";
  }
  return a;
}



// RFC 4648 base64, for embeddings sent as bytes.
std::string base64_of(const std::string& bytes) {
  static constexpr char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t a = static_cast<unsigned char>(bytes[i]);
    const std::uint32_t b = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const std::uint32_t c = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const std::uint32_t n = (a << 16) | (b << 8) | c;
    out += table[(n >> 18) & 63];
    out += table[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? table[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? table[n & 63] : '=';
  }
  return out;
}

// A seed for a request that named none: 53 bits, so a JavaScript client (the openai npm package)
// reads it back exactly.
std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32 | rd()) & ((std::uint64_t{1} << 53) - 1);
}

// Reads the sampling and stop fields shared by both endpoints.
void read_common(params& p, request_plan& plan) {
  auto& j = plan.job;
  auto& s = j.sampling;
  if (auto v = p.number<std::int64_t>("max_tokens", 1, 1 << 20)) j.max_tokens = *v;
  if (auto v = p.number<std::int64_t>("max_completion_tokens", 1, 1 << 20)) j.max_tokens = *v;
  if (auto v = p.number<float>("temperature", 0, 2)) s.temperature = *v;
  else if (!p.body.contains("temperature")) s.temperature = 1.0f;  // OpenAI's default
  if (auto v = p.number<float>("top_p", 1e-9, 1)) s.top_p = *v;
  if (auto v = p.number<std::int32_t>("top_k", -1, 1 << 30)) s.top_k = *v < 0 ? 0 : *v;
  if (auto v = p.number<float>("min_p", 0, 1)) s.min_p = *v;
  if (auto v = p.number<float>("presence_penalty", -2, 2)) s.presence_penalty = *v;
  if (auto v = p.number<float>("frequency_penalty", -2, 2)) s.frequency_penalty = *v;
  if (auto v = p.number<float>("repetition_penalty", 1e-6, 100)) s.repetition_penalty = *v;
  if (auto it = p.body.find("seed"); it != p.body.end() && it->is_number_integer()) {
    s.seed = static_cast<std::uint64_t>(it->get<std::int64_t>());  // exact: not through a double
  } else if (auto v = p.number<std::int64_t>("seed", -9.2e18, 9.2e18)) {
    s.seed = static_cast<std::uint64_t>(*v);
  } else {
    // No seed: a fresh one per request (the same answer every time at temperature 1 otherwise), told
    // back in the answer (`seed`, `x-troupe-seed`) so the request can be replayed.
    s.seed = fresh_seed();
  }
  if (auto v = p.number<std::int32_t>("n", 1, 16)) plan.n = *v;
  if (auto v = p.boolean("stream")) plan.stream = *v;
  if (auto v = p.boolean("ignore_eos")) j.ignore_eos = *v;
  // troupe's extension: false opts this request out of the deployment's speculative decoding.
  if (auto v = p.boolean("speculative")) j.no_speculation = !*v;
  if (auto it = p.body.find("stream_options"); it != p.body.end() && !it->is_null()) {
    if (!it->is_object()) p.fail("stream_options", "must be an object");
    else if (auto u = it->find("include_usage"); u != it->end()) {
      if (!u->is_boolean()) p.fail("stream_options.include_usage", "must be a boolean");
      else plan.include_usage = u->get<bool>();
    }
  }
  if (auto it = p.body.find("logit_bias"); it != p.body.end() && !it->is_null()) {
    if (!it->is_object()) {
      p.fail("logit_bias", "must be an object of token id to bias");
    } else {
      for (auto& [k, v] : it->items()) {
        char* end = nullptr;
        const long id = std::strtol(k.c_str(), &end, 10);
        if (k.empty() || *end != '\0' || id < 0 || id > (1L << 30) || !v.is_number() || v.get<double>() < -100 || v.get<double>() > 100) {
          p.fail("logit_bias", "keys are token ids, values numbers in [-100, 100]");
          break;
        }
        s.logit_bias.emplace_back(static_cast<std::int32_t>(id), v.get<float>());
      }
    }
  }
  p.strings("stop", true, j.stop);
  if (auto it = p.body.find("stop_token_ids"); it != p.body.end() && !it->is_null()) {
    if (!it->is_array()) p.fail("stop_token_ids", "must be an array of token ids");
    else
      for (const auto& x : *it) {
        if (!x.is_number_integer()) {
          p.fail("stop_token_ids", "must be an array of token ids");
          break;
        }
        j.stop_ids.push_back(x.get<std::int32_t>());
      }
  }
}

// A constrained output, in the shapes clients send it: OpenAI's response_format (json_object,
// json_schema), vLLM's guided_json / guided_regex / guided_choice / guided_grammar, llama.cpp's grammar
// and json_schema (and its response_format {type: json_object, schema}). One per request; compiled
// here so that a schema or grammar the server cannot honour is a 400 naming the field, before any job.
void read_guide(params& p, transport::job_submit& j, std::string_view raw_body) {
  using ojson = nlohmann::ordered_json;
  static constexpr const char* fields[] = {"response_format", "guided_json", "json_schema", "guided_regex", "guided_grammar", "grammar", "guided_choice"};
  if (std::none_of(std::begin(fields), std::end(fields), [&](const char* f) { return p.body.contains(f); })) return;
  // Parsed again keeping the key order (the body passed the nesting bound already): a schema's
  // properties are generated in the order the client wrote them, as OpenAI's strict mode does.
  const ojson b = ojson::parse(raw_body, nullptr, false);
  if (!b.is_object()) return;
  std::vector<std::pair<std::string, transport::guide>> asked;
  auto schema_of = [&](const char* field, const ojson& v) {
    if (v.is_object() || v.is_boolean()) {
      asked.push_back({field, {transport::guide_kind::json_schema, v.dump()}});
    } else if (v.is_string()) {
      auto parsed = ojson::parse(v.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) p.fail(field, "must be a JSON schema (an object, or a string holding one)");
      else asked.push_back({field, {transport::guide_kind::json_schema, parsed.dump()}});
    } else {
      p.fail(field, "must be a JSON schema object");
    }
  };
  auto text_of = [&](const char* field, transport::guide_kind kind) {
    auto it = b.find(field);
    if (it == b.end() || it->is_null()) return;
    if (!it->is_string()) p.fail(field, "must be a string");
    else asked.push_back({field, {kind, it->get<std::string>()}});
  };
  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
      p.fail("response_format", "must be an object with a string type");
    } else if (const auto type = (*it)["type"].get<std::string>(); type == "json_object") {
      if (auto s = it->find("schema"); s != it->end() && !s->is_null()) schema_of("response_format.schema", *s);
      else asked.push_back({"response_format", {transport::guide_kind::json_object, ""}});
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js != it->end() && js->is_object() && js->contains("schema")) schema_of("response_format.json_schema.schema", (*js)["schema"]);
      else if (auto s = it->find("schema"); s != it->end()) schema_of("response_format.schema", *s);
      else p.fail("response_format.json_schema", "needs a schema");
    } else if (type != "text") {
      p.fail("response_format", "type must be 'text', 'json_object' or 'json_schema', not '" + type + "'");
    }
  }
  if (auto it = b.find("guided_json"); it != b.end() && !it->is_null()) schema_of("guided_json", *it);
  if (auto it = b.find("json_schema"); it != b.end() && !it->is_null()) schema_of("json_schema", *it);
  text_of("guided_regex", transport::guide_kind::regex);
  text_of("guided_grammar", transport::guide_kind::grammar);
  text_of("grammar", transport::guide_kind::grammar);
  if (auto it = b.find("guided_choice"); it != b.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !std::all_of(it->begin(), it->end(), [](const ojson& x) { return x.is_string(); }))
      p.fail("guided_choice", "must be a non-empty array of strings");
    else
      asked.push_back({"guided_choice", {transport::guide_kind::choice, it->dump()}});
  }
  if (asked.empty()) return;
  if (asked.size() > 1) {
    p.fail(asked[1].first, "a request takes one constrained output; '" + asked[0].first + "' is already given");
    return;
  }
  const auto& [field, g] = asked.front();
  if (auto c = guide::compile({static_cast<guide::guide_kind>(g.kind), g.text}); !c) {
    p.fail(field, c.error().message());
    return;
  }
  j.guide = g;
}

// tool_choice: "none" and "auto" (the default) leave the model free; "required" or a named function
// force a call: a grammar of the offered tools' calls (their parameter schemas included) in the
// model's own tool-call format, read from its chat template (engine/guide/tool_calls.hpp).
void read_tool_choice(params& p, transport::job_submit& j, std::string_view chat_template) {
  const json& b = p.body;
  auto it = b.find("tool_choice");
  if (it == b.end() || it->is_null()) return;
  std::string only;
  if (it->is_string()) {
    const auto c = it->get<std::string>();
    if (c == "auto" || c == "none") return;
    if (c != "required") return p.fail("tool_choice", "must be 'none', 'auto', 'required' or a named function");
  } else if (it->is_object() && it->value("type", "") == "function" && it->contains("function") && (*it)["function"].is_object() &&
             (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
    only = (*it)["function"]["name"].get<std::string>();
  } else {
    return p.fail("tool_choice", "a named tool choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (j.tools_json.empty()) return p.fail("tool_choice", "forcing a tool call needs tools");
  if (j.guide.kind != transport::guide_kind::none) return p.fail("tool_choice", "a forced tool call constrains the output, which another field already does");
  bool parallel = true;
  if (auto pc = b.find("parallel_tool_calls"); pc != b.end() && !pc->is_null()) {
    if (!pc->is_boolean()) return p.fail("parallel_tool_calls", "must be a boolean");
    parallel = pc->get<bool>();
  }
  auto g = guide::tool_call_gbnf(j.tools_json, only, guide::tool_call_format_of(chat_template), parallel);
  if (!g) return p.fail(only.empty() || g.error().where.starts_with("tools") ? "tools" : "tool_choice", g.error().message());
  if (auto c = guide::compile({guide::guide_kind::grammar, *g}); !c) return p.fail("tools", c.error().message());
  j.guide = {transport::guide_kind::grammar, std::move(*g)};
}

std::string finish_of(const std::string& r) {
  if (r == "eos" || r == "stop_string") return "stop";
  if (r == "length" || r == "capacity") return "length";
  return r;  // cancelled, deadline, pool_exhausted, error
}

// JSON from the model's output, refused (discarded) past the nesting bound: generated text is outside
// bytes too, and a deep nest would recurse when the value is destroyed or dumped.
json parse_bounded(const std::string& text) {
  bool too_deep = false;
  auto j = json::parse(
      text,
      [&too_deep](int depth, json::parse_event_t, json&) {
        too_deep = too_deep || depth > 64;
        return !too_deep;
      },
      false);
  return too_deep ? json(json::value_t::discarded) : j;
}

// Tool calls in the formats the shipped chat templates ask for, tried in turn (the first that yields
// a call wins; text that is not a call stays content):
//   Hermes / Qwen   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them
//   Llama 3.x       {"name": ..., "parameters": {...}}, optionally after <|python_tag|>
//   Mistral         [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]name[ARGS]{...}
//   DeepSeek V3     <｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```<｜tool▁call▁end｜>
// plus a bare JSON array of calls (a template's marker may be a special token the text leaves out).
std::pair<std::string, json> parse_tool_calls_json(const std::string& text) {
  json calls = json::array();
  auto call_of = [&](const json& c, std::size_t index) -> std::optional<json> {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return std::nullopt;
    json args = c.contains("arguments") ? c["arguments"] : (c.contains("parameters") ? c["parameters"] : json::object());
    return json{{"id", "call_" + std::to_string(index)},
                {"type", "function"},
                {"function", {{"name", c["name"]}, {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}}}};
  };
  auto add = [&](const json& c) {
    auto x = call_of(c, calls.size());
    if (x) calls.push_back(std::move(*x));
    return x.has_value();
  };
  // One JSON value holding a call or an array of calls: all of them, or none.
  auto add_all = [&](const json& v) {
    if (v.is_object()) return add(v);
    if (!v.is_array() || v.empty()) return false;
    json got = json::array();
    for (const auto& c : v) {
      auto x = call_of(c, calls.size() + got.size());
      if (!x) return false;
      got.push_back(std::move(*x));
    }
    for (auto& g : got) calls.push_back(std::move(g));
    return true;
  };
  auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return std::string(v);
  };

  // Hermes / Qwen.
  std::string rest;
  std::size_t pos = 0;
  while (true) {
    const auto open = text.find("<tool_call>", pos);
    if (open == std::string::npos) break;
    const auto close = text.find("</tool_call>", open);
    if (close == std::string::npos) break;
    rest += text.substr(pos, open - pos);
    const auto body = text.substr(open + 11, close - open - 11);
    auto c = parse_bounded(body);
    if (c.is_discarded() || !add(c)) rest += text.substr(open, close + 12 - open);
    pos = close + 12;
  }
  rest += text.substr(pos);
  if (!calls.empty()) return {rest, calls};

  // DeepSeek V3.
  static const std::string ds_begin = "<｜tool▁call▁begin｜>", ds_sep = "<｜tool▁sep｜>", ds_end = "<｜tool▁call▁end｜>",
                           ds_all = "<｜tool▁calls▁begin｜>";
  if (const auto first = text.find(ds_begin); first != std::string::npos) {
    for (std::size_t at = first; (at = text.find(ds_begin, at)) != std::string::npos;) {
      const auto sep = text.find(ds_sep, at), end = text.find(ds_end, at);
      if (sep == std::string::npos || end == std::string::npos || sep > end) break;
      std::string body = text.substr(sep + ds_sep.size(), end - sep - ds_sep.size());
      const auto nl = body.find('\n');
      const std::string name = trim(body.substr(0, nl));
      std::string args = nl == std::string::npos ? "{}" : body.substr(nl + 1);
      if (auto f = args.find("```json"); f != std::string::npos) args = args.substr(f + 7);
      if (auto f = args.rfind("```"); f != std::string::npos) args = args.substr(0, f);
      auto a = parse_bounded(args);
      if (name.empty() || a.is_discarded() || !add(json{{"name", name}, {"arguments", a}})) break;
      at = end + ds_end.size();
    }
    if (!calls.empty()) {
      const auto lead = text.find(ds_all) != std::string::npos ? std::min(text.find(ds_all), first) : first;
      return {trim(text.substr(0, lead)), calls};
    }
  }

  // Mistral, Llama 3.x and bare JSON.
  std::string lead, t = text;
  bool mistral = false;
  if (const auto k = t.find("[TOOL_CALLS]"); k != std::string::npos) lead = trim(t.substr(0, k)), t = t.substr(k + 12), mistral = true;
  else if (const auto k2 = t.find("<|python_tag|>"); k2 != std::string::npos) lead = trim(t.substr(0, k2)), t = t.substr(k2 + 14);
  if (auto v = parse_bounded(trim(t)); !v.is_discarded() && add_all(v)) return {lead, calls};
  if (mistral) {  // name[ARGS]{...}, repeated
    std::string_view v = t;
    while (true) {
      const auto args_at = v.find("[ARGS]");
      if (args_at == std::string_view::npos) break;
      const std::string name = trim(v.substr(0, args_at));
      v.remove_prefix(args_at + 6);
      const auto next = v.find("[TOOL_CALLS]");
      auto a = parse_bounded(trim(v.substr(0, next)));
      if (name.empty() || a.is_discarded() || !add(json{{"name", name}, {"arguments", a}})) {
        calls = json::array();
        break;
      }
      if (next == std::string_view::npos) break;
      v.remove_prefix(next + 12);
    }
    if (!calls.empty()) return {lead, calls};
  }
  return {text, calls};
}

// Where, at or after `from`, `text` could begin a tool call in one of the formats above: a marker (or
// the start of one, cut by the end of the text so far), or a reply whose first non-space is '{' or
// '[' (a whole-reply JSON call). Text before it can be shown while the reply streams.
std::size_t call_start(const std::string& text, std::size_t from) {
  static const std::string markers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"};
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && first >= from && (text[first] == '{' || text[first] == '[')) return from;
  if (first == std::string::npos) return from;  // only spaces so far: they may precede a JSON call
  for (std::size_t i = from; i < text.size(); ++i)
    for (const auto& m : markers) {
      const auto n = std::min(m.size(), text.size() - i);
      if (text.compare(i, n, m, 0, n) == 0) return i;
    }
  return text.size();
}

}  // namespace detail

std::pair<std::string, std::string> parse_tool_calls(const std::string& text) {
  auto [rest, calls] = detail::parse_tool_calls_json(text);
  return {rest, calls.empty() ? std::string() : detail::dump(calls)};
}

}  // namespace troupe::actors
