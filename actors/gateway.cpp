#include "actors/gateway.hpp"

#include <openssl/evp.h>
#include "actors/gateway_request.hpp"
#include "actors/http_front.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "engine/guide/guide.hpp"
#include "engine/guide/tool_calls.hpp"
#include "engine/text/text_codec.hpp"

namespace troupe::actors {

using namespace detail;

namespace {

// An image_url content part's bytes: a data URL (data:<type>;base64,<data>), decoded. Nothing is
// fetched: an http(s) URL is refused.
constexpr std::size_t max_images = 8, max_image_bytes = std::size_t{6} << 20;
result<std::string, std::string> image_of(const nlohmann::json& part) {
  const auto it = part.find("image_url");
  std::string url;
  if (it != part.end() && it->is_string()) url = it->get<std::string>();
  else if (it != part.end() && it->is_object() && it->contains("url") && (*it)["url"].is_string()) url = (*it)["url"].get<std::string>();
  else return unexpected(std::string("needs a url"));
  if (!url.starts_with("data:")) return unexpected(std::string("only data URLs (data:image/png;base64,...) are taken: this server fetches nothing"));
  const auto comma = url.find(',');
  if (comma == std::string::npos || url.substr(0, comma).find(";base64") == std::string::npos)
    return unexpected(std::string("a data URL with base64 data is needed"));
  const std::string_view b64 = std::string_view(url).substr(comma + 1);
  if (b64.empty() || b64.size() % 4 != 0 || b64.size() > 4 * (max_image_bytes / 3 + 1)) return unexpected(std::string("the base64 data is empty, cut short or too large"));
  std::string out(b64.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
  if (n < 0) return unexpected(std::string("the data is not base64"));
  std::size_t pad = 0;
  for (std::size_t i = b64.size(); i > 0 && b64[i - 1] == '=' && pad < 2; --i) ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}


using clock_type = std::chrono::steady_clock;

// A Prometheus histogram with fixed bucket bounds (seconds).
struct histogram {
  static constexpr std::array<double, 12> bounds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  std::array<std::int64_t, bounds.size()> counts{};
  std::int64_t count = 0;
  double sum = 0;
  void observe(double v) {
    for (std::size_t i = 0; i < bounds.size(); ++i)
      if (v <= bounds[i]) ++counts[i];
    ++count;
    sum += v;
  }
  void print(std::string& out, const std::string& name, const std::string& help) const {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", bounds[i]);
      out += name + "_bucket{le=\"" + b + "\"} " + std::to_string(counts[i]) + "\n";
    }
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count) + "\n";
    out += name + "_sum " + std::to_string(sum) + "\n" + name + "_count " + std::to_string(count) + "\n";
  }
};

struct metrics {
  std::mutex m;
  std::map<std::pair<std::string, int>, std::int64_t> requests;  // (endpoint, status)
  std::int64_t prompt_tokens = 0, generation_tokens = 0;
  histogram ttft, tpot;
};

}  // namespace


// How deep a request body may nest (tools' JSON schemas included).
constexpr int max_json_depth = 64;

struct gateway_state {
  gateway_options options;
  serving_backend* cluster = nullptr;
  std::unique_ptr<client> cl;
  std::optional<text::text_codec> codec;
  std::string model;  // the model whose tokenizer `codec` is (logprobs' token strings)
  httplib::Server server;
  // The served names, as the coordinator's deployments say (followed live: a model deployed after the
  // gateway started is served, one removed is a 404), refreshed at most once a second.
  std::mutex models_m;
  std::vector<std::string> models_cache;
  std::chrono::steady_clock::time_point models_at{};
  std::vector<std::string> served_models() {
    std::lock_guard lock(models_m);
    const auto now = std::chrono::steady_clock::now();
    if (models_cache.empty() || now - models_at > std::chrono::seconds(1)) {
      models_cache = cluster->models();
      models_at = now;
    }
    return models_cache;
  }
  std::thread thread;
  httplib::Server lane;  // the reserved lane: connections that open with /health, /ready or /metrics
  std::thread lane_thread;
  std::unique_ptr<http_front> front;  // what listens on the gateway's address (actors/http_front.hpp)
  int port = 0;
  metrics stats;
  std::atomic<bool> stopped{false};

  std::string token_text(std::int32_t id) const {
    if (!codec) return std::to_string(id);
    const std::int32_t ids[] = {id};
    return codec->decode(ids, false);
  }

  // Counted under a known route's name, everything else under "other": a client cannot grow the
  // series (or write into the exposition) with the paths it makes up.
  void count(const std::string& endpoint, int status) {
    static const std::set<std::string> known{"/health", "/ready", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
                                             "/v1/embeddings", "/v1/models/{id}", "/version", "/tokenize", "/detokenize", "/v1/messages"};
    if (status < 100 || status > 599) status = 0;
    std::lock_guard lock(stats.m);
    ++stats.requests[{known.contains(endpoint) ? endpoint : std::string("other"), status}];
  }
  // `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY` (/v1/messages' clients send that).
  bool authorized(const httplib::Request& req) const {
    if (options.api_keys.empty()) return true;
    const auto h = req.get_header_value("Authorization");
    if (h.rfind("Bearer ", 0) == 0) return key_matches(h.substr(7));
    return req.has_header("x-api-key") && key_matches(req.get_header_value("x-api-key"));
  }
  bool key_matches(const std::string& key) const {
    // Compared in constant time (every key, every byte): the answer's timing says nothing of a key.
    bool match = false;
    for (const auto& k : options.api_keys) {
      unsigned char diff = k.size() == key.size() ? 0 : 1;
      for (std::size_t i = 0; i < k.size(); ++i) diff |= static_cast<unsigned char>(k[i] ^ (i < key.size() ? key[i] : 0));
      match |= diff == 0;
    }
    return match;
  }
  void reply_error(const std::string& endpoint, httplib::Response& res, const api_error& e) {
    if (endpoint != "/health" && endpoint != "/ready" && endpoint != "/metrics")
      spdlog::info("event=http_request endpoint={} status={} reason=\"{}\"", endpoint, e.status, e.message);
    res.status = e.status;
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(error_body(e), "application/json");
    count(endpoint, e.status);
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void embeddings(const httplib::Request& req, httplib::Response& res);
  // The model named (routed by the coordinator to its replicas only), or the only one served; false
  // when the request was answered (404, 503).
  bool choose_model(const std::string& endpoint, httplib::Response& res, params& p, std::string& model) {
    const auto served = served_models();
    const json& body = p.body;
    if (auto it = body.find("model"); it != body.end() && !it->is_null() && !it->is_string()) {
      p.fail("model", "model is a string");
    } else if (it == body.end() || it->is_null() || it->get<std::string>().empty()) {
      if (served.empty()) return reply_error(endpoint, res, {503, "no model is being served yet", "model", "model_not_ready"}), false;
      if (served.size() > 1) p.fail("model", "this server serves several models: name one (GET /v1/models)");
      else model = served.front();
    } else {
      model = it->get<std::string>();
      if (std::find(served.begin(), served.end(), model) == served.end())
        return reply_error(endpoint, res, {404, "The model '" + model + "' does not exist", "model", "model_not_found"}), false;
    }
    return true;
  }
  // POST /v1/messages: Anthropic's Messages shape (text, streaming, tools) over the same jobs.
  void messages(const httplib::Request& req, httplib::Response& res);
  // POST /tokenize (prompt -> ids) and /detokenize (ids -> text), vLLM's shapes, with this gateway's
  // tokenizer (the model it was started with).
  void tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize);
  // POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name}: vLLM's
  // run-time LoRA endpoints, over every replica of the served model (docs/adapters.md).
  void lora_adapter(const httplib::Request& req, httplib::Response& res, bool load);

  // The request's body as a JSON object, parsed with a bound on nesting: a body nested deeper than any
  // request needs is refused before it is built (a 160 KB body of 80,000 nested arrays would
  // otherwise overflow the stack later). False: refused, the answer written.
  bool read_body(const std::string& endpoint, const httplib::Request& req, httplib::Response& res, json& body) {
    bool too_deep = false;
    body = json::parse(
        req.body,
        [&too_deep](int depth, json::parse_event_t, json&) {
          if (depth > max_json_depth) too_deep = true;
          return !too_deep;
        },
        false);
    if (too_deep)
      return reply_error(endpoint, res, {400, "the body nests deeper than " + std::to_string(max_json_depth) + " levels", "", "invalid_json"}), false;
    if (body.is_discarded() || !body.is_object()) return reply_error(endpoint, res, {400, "the body is not a JSON object", "", "invalid_json"}), false;
    return true;
  }
  std::string metrics_text();
};

namespace {

// OpenAI's usage object; cached: the prompt tokens the replica's prefix cache supplied.
json usage_json(std::int64_t prompt, std::int64_t completion, std::int64_t cached = 0) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace

void gateway_state::messages(const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/messages";
  // Anthropic's error shape; counted and logged as the other endpoints' refusals.
  auto refuse = [&](int status, const std::string& message) {
    const char* type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error" : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "api_error" : "invalid_request_error";
    spdlog::info("event=http_request endpoint={} status={} reason=\"{}\"", endpoint, status, message);
    res.status = status;
    if (status == 429 || status == 503) res.set_header("Retry-After", "1");
    res.set_content(dump(json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}), "application/json");
    count(endpoint, status);
  };
  if (!authorized(req)) return refuse(401, "invalid x-api-key");
  json body;
  if (!read_body(endpoint, req, res, body)) return;
  transport::job_submit j;
  const auto served = served_models();
  const auto mit = body.find("model");
  if (mit == body.end() || !mit->is_string()) return refuse(400, "model: a string is required");
  j.model = mit->get<std::string>();
  if (std::find(served.begin(), served.end(), j.model) == served.end()) return refuse(404, "model: '" + j.model + "' is not served here");
  const auto mt = body.find("max_tokens");
  if (mt == body.end() || !mt->is_number_integer() || mt->get<std::int64_t>() < 1 || mt->get<std::int64_t>() > (1 << 20))
    return refuse(400, "max_tokens: an integer in [1, 2^20] is required");
  j.max_tokens = mt->get<std::int64_t>();
  params p{body, std::nullopt};
  if (auto v = p.number<float>("temperature", 0, 1)) j.sampling.temperature = *v;
  else if (!body.contains("temperature")) j.sampling.temperature = 1.0f;
  if (auto v = p.number<float>("top_p", 1e-9, 1)) j.sampling.top_p = *v;
  if (auto v = p.number<std::int32_t>("top_k", 0, 1 << 30)) j.sampling.top_k = *v;
  j.sampling.seed = fresh_seed();
  bool stream = false;
  if (auto v = p.boolean("stream")) stream = *v;
  p.strings("stop_sequences", false, j.stop);
  if (p.err) return refuse(400, p.err->message);
  // Text of a content value: a string, or text blocks (tool_use in an assistant turn becomes its JSON
  // call, tool_result its text); anything else (images, documents) is refused by name.
  std::string why;
  auto text_of = [&](const json& c) -> std::optional<std::string> {
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) return why = "content: a string or an array of blocks", std::nullopt;
    std::string out;
    for (const auto& b : c) {
      const std::string type = b.is_object() && b.contains("type") && b["type"].is_string() ? b["type"].get<std::string>() : "";
      if (type == "text" && b.contains("text") && b["text"].is_string()) {
        out += b["text"].get<std::string>();
      } else if (type == "tool_use" && b.contains("name") && b["name"].is_string()) {
        out += dump(json{{"name", b["name"]}, {"arguments", b.value("input", json::object())}});
      } else if (type == "tool_result") {
        const auto inner = b.value("content", json(""));
        if (inner.is_string()) out += inner.get<std::string>();
        else if (inner.is_array())
          for (const auto& x : inner)
            if (x.is_object() && x.value("type", "") == "text" && x.contains("text") && x["text"].is_string()) out += x["text"].get<std::string>();
      } else {
        return why = "content blocks of type '" + type + "' are not taken: this server's models read text only", std::nullopt;
      }
    }
    return out;
  };
  std::vector<transport::chat_message> msgs;
  if (auto sys = body.find("system"); sys != body.end() && !sys->is_null()) {
    auto t = text_of(*sys);
    if (!t) return refuse(400, "system: " + why);
    msgs.push_back({"system", *t});
  }
  const auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array() || ms->empty()) return refuse(400, "messages: a non-empty array is required");
  for (const auto& m : *ms) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || (m["role"] != "user" && m["role"] != "assistant"))
      return refuse(400, "messages: each has a role, user or assistant");
    auto t = text_of(m.value("content", json("")));
    if (!t) return refuse(400, "messages: " + why);
    const bool result = m["content"].is_array() && !m["content"].empty() && m["content"][0].value("type", "") == "tool_result";
    msgs.push_back({result ? "tool" : m["role"].get<std::string>(), *t});
  }
  j.prompt = std::move(msgs);
  bool tools = false;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return refuse(400, "tools: an array of tools");
    json oa = json::array();
    for (const auto& x : *t) {
      if (!x.is_object() || !x.contains("name") || !x["name"].is_string()) return refuse(400, "tools: each has a name");
      oa.push_back({{"type", "function"},
                    {"function", {{"name", x["name"]}, {"description", x.value("description", "")}, {"parameters", x.value("input_schema", json::object())}}}});
    }
    const auto choice = body.value("tool_choice", json::object());
    const auto type = choice.is_object() ? choice.value("type", "auto") : std::string("auto");
    if (!oa.empty() && type != "none") j.tools_json = oa.dump(), tools = true;
    if (type == "any" || type == "tool") {  // a forced call, in the model's own tool-call format
      const auto only = type == "tool" ? choice.value("name", "") : std::string();
      if (type == "tool" && only.empty()) return refuse(400, "tool_choice: a tool choice names its tool");
      if (oa.empty()) return refuse(400, "tool_choice: forcing a tool call needs tools");
      const bool parallel = !choice.value("disable_parallel_tool_use", false);
      auto g = guide::tool_call_gbnf(oa.dump(), only, guide::tool_call_format_of(codec && j.model == this->model ? codec->chat_template() : ""), parallel);
      if (!g) return refuse(400, "tool_choice: " + g.error().message());
      j.guide = {transport::guide_kind::grammar, std::move(*g)};
    }
  }
  if (body.contains("thinking") && !body["thinking"].is_null()) return refuse(400, "thinking: not offered by this server");

  const auto t0 = clock_type::now();
  auto submitted = cl->submit(j);
  if (!submitted) {
    const auto e = from_transport(submitted.error());
    return refuse(e.status, e.message);
  }
  auto jb = std::make_shared<job>(std::move(*submitted));
  const std::string id = "msg_" + std::to_string(jb->id());
  const std::string model = j.model;
  auto stop_reason = [](const std::string& finish) {
    if (finish == "length" || finish == "capacity") return std::string("max_tokens");
    if (finish == "stop_string") return std::string("stop_sequence");
    return std::string("end_turn");
  };
  // The content blocks of a whole answer: text, then tool_use blocks when the answer is a call.
  auto blocks_of = [tools](const std::string& text, std::string& reason) {
    json blocks = json::array();
    if (tools) {
      auto [rest, calls] = parse_tool_calls_json(text);
      if (!calls.empty()) {
        if (!rest.empty()) blocks.push_back({{"type", "text"}, {"text", rest}});
        for (const auto& c : calls) {
          auto input = parse_bounded(c["function"]["arguments"].get<std::string>());
          blocks.push_back({{"type", "tool_use"}, {"id", "toolu_" + c["id"].get<std::string>()}, {"name", c["function"]["name"]},
                            {"input", input.is_discarded() ? json::object() : input}});
        }
        reason = "tool_use";
        return blocks;
      }
    }
    blocks.push_back({{"type", "text"}, {"text", text}});
    return blocks;
  };
  res.set_header("x-troupe-seed", std::to_string(j.sampling.seed));
  if (!stream) {
    auto r = jb->wait();
    if (r.error) {
      const auto e = from_transport(*r.error);
      return refuse(e.status, e.message);
    }
    std::string reason = stop_reason(r.finish_reason);
    const auto blocks = blocks_of(r.text, reason);
    json out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model}, {"content", blocks}, {"stop_reason", reason},
                {"stop_sequence", nullptr},
                {"usage", {{"input_tokens", r.usage.prompt_tokens}, {"output_tokens", static_cast<std::int64_t>(r.tokens.size())},
                           {"cache_read_input_tokens", r.usage.cached_tokens}}}};
    if (r.replica != 0) res.set_header("x-troupe-replica", std::to_string(r.replica));
    res.set_content(dump(out), "application/json");
    count(endpoint, 200);
    spdlog::info("event=http_request endpoint={} status=200 model={} prompt_tokens={} completion_tokens={} seconds={:.3f} replica={}", endpoint, model,
                 r.usage.prompt_tokens, r.tokens.size(), std::chrono::duration<double>(clock_type::now() - t0).count(), r.replica);
    return;
  }
  // Server-sent events as Anthropic names them: message_start, a text block's start, deltas and stop
  // (with tools the text is held and the blocks sent at the end), message_delta, message_stop.
  count(endpoint, 200);
  struct state {
    bool started = false, finished = false;
    std::string held;
    std::int64_t prompt_tokens = 0, output_tokens = 0;
  };
  auto st = std::make_shared<state>();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, jb, st, id, model, tools, stop_reason, blocks_of, t0](std::size_t, httplib::DataSink& sink) {
    auto send = [&](const char* event, const json& data) {
      const std::string line = std::string("event: ") + event + "\ndata: " + dump(data) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    if (st->finished) {
      sink.done();
      return true;
    }
    if (!st->started) {
      st->started = true;
      if (!send("message_start", {{"type", "message_start"},
                                  {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model}, {"content", json::array()},
                                               {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}}}}))
        return jb->cancel(), false;
      if (!tools && !send("content_block_start", {{"type", "content_block_start"}, {"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}}))
        return jb->cancel(), false;
      return true;
    }
    auto c = jb->next();
    if (!c) {
      auto r = jb->wait();
      if (r.error) {
        const auto e = from_transport(*r.error);
        send("error", {{"type", "error"}, {"error", {{"type", e.status >= 500 ? "api_error" : "invalid_request_error"}, {"message", e.message}}}});
        st->finished = true;
        return true;
      }
      std::string reason = stop_reason(r.finish_reason);
      if (tools) {
        const auto blocks = blocks_of(st->held, reason);
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          const auto& b = blocks[i];
          json start = b;
          if (b["type"] == "text") start["text"] = "";
          if (b["type"] == "tool_use") start["input"] = json::object();
          send("content_block_start", {{"type", "content_block_start"}, {"index", i}, {"content_block", start}});
          if (b["type"] == "text") send("content_block_delta", {{"type", "content_block_delta"}, {"index", i}, {"delta", {{"type", "text_delta"}, {"text", b["text"]}}}});
          else send("content_block_delta", {{"type", "content_block_delta"}, {"index", i}, {"delta", {{"type", "input_json_delta"}, {"partial_json", dump(b["input"])}}}});
          send("content_block_stop", {{"type", "content_block_stop"}, {"index", i}});
        }
      } else {
        send("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
      }
      send("message_delta", {{"type", "message_delta"}, {"delta", {{"stop_reason", reason}, {"stop_sequence", nullptr}}},
                             {"usage", {{"output_tokens", st->output_tokens}}}});
      send("message_stop", {{"type", "message_stop"}});
      st->finished = true;
      spdlog::info("event=http_request endpoint=/v1/messages status=200 stream=true model={} prompt_tokens={} completion_tokens={} seconds={:.3f} replica={}",
                   model, st->prompt_tokens, st->output_tokens, std::chrono::duration<double>(clock_type::now() - t0).count(), r.replica);
      return true;
    }
    st->prompt_tokens = c->usage.prompt_tokens;
    st->output_tokens += static_cast<std::int64_t>(c->ids.size());
    if (tools) {
      st->held += c->text;
      return true;
    }
    if (!c->text.empty() &&
        !send("content_block_delta", {{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", c->text}}}}))
      return jb->cancel(), false;
    return true;
  });
}

void gateway_state::lora_adapter(const httplib::Request& req, httplib::Response& res, bool load) {
  const std::string endpoint = load ? "/v1/load_lora_adapter" : "/v1/unload_lora_adapter";
  if (!authorized(req)) return reply_error(endpoint, res, {401, "Incorrect API key provided", "", "invalid_api_key"});
  json body;
  if (!read_body(endpoint, req, res, body)) return;
  auto text = [&](const char* key) -> std::optional<std::string> {
    const auto it = body.find(key);
    if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto name = text("lora_name");
  if (!name) return reply_error(endpoint, res, {400, "'lora_name': a non-empty string is required", "lora_name", "invalid_parameter"});
  const auto path = load ? text("lora_path") : std::optional<std::string>(std::string());
  if (!path) return reply_error(endpoint, res, {400, "'lora_path': a non-empty string is required", "lora_path", "invalid_parameter"});
  std::string target;
  if (const auto it = body.find("model"); it != body.end() && it->is_string()) target = it->get<std::string>();
  const auto why = cluster->adapter(target, *name, *path);
  if (!why.empty()) return reply_error(endpoint, res, {400, why, "lora_name", "invalid_parameter"});
  {
    std::lock_guard lock(models_m);
    models_cache.clear();  // the next /v1/models asks again
  }
  res.set_content(load ? "Success: LoRA adapter '" + *name + "' added successfully." : "Success: LoRA adapter '" + *name + "' removed successfully.",
                  "text/plain");
  count(endpoint, 200);
}

void gateway_state::tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize) {
  const std::string endpoint = detokenize ? "/detokenize" : "/tokenize";
  if (!authorized(req)) return reply_error(endpoint, res, {401, "Incorrect API key provided", "", "invalid_api_key"});
  json body;
  if (!read_body(endpoint, req, res, body)) return;
  if (!codec) return reply_error(endpoint, res, {503, "this gateway was started without the model's tokenizer", "", "unsupported"});
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return reply_error(endpoint, res, {400, "'model': model is a string", "model", "invalid_parameter"});
    if (it->get<std::string>() != model)
      return reply_error(endpoint, res, {404, "this gateway tokenizes for '" + model + "' only, not '" + it->get<std::string>() + "'", "model", "model_not_found"});
  }
  if (detokenize) {
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array() || it->size() > (std::size_t{1} << 20))
      return reply_error(endpoint, res, {400, "'tokens': an array of up to 2^20 token ids is required", "tokens", "invalid_parameter"});
    std::vector<text::token_id> ids;
    ids.reserve(it->size());
    for (const auto& x : *it) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() >= static_cast<std::int64_t>(codec->vocab_size()))
        return reply_error(endpoint, res, {400, "'tokens': each is a token id in [0, " + std::to_string(codec->vocab_size()) + ")", "tokens", "invalid_parameter"});
      ids.push_back(static_cast<text::token_id>(x.get<std::int64_t>()));
    }
    res.set_content(dump(json{{"prompt", codec->decode(ids, false)}}), "application/json");
    return count(endpoint, 200);
  }
  if (body.contains("messages"))
    return reply_error(endpoint, res, {400, "'messages': chat templates are rendered by the replicas; tokenize a prompt string", "messages", "invalid_parameter"});
  auto it = body.find("prompt");
  if (it == body.end() || !it->is_string()) return reply_error(endpoint, res, {400, "'prompt': a string is required", "prompt", "invalid_parameter"});
  bool add_special = true;
  if (auto a = body.find("add_special_tokens"); a != body.end() && !a->is_null()) {
    if (!a->is_boolean()) return reply_error(endpoint, res, {400, "'add_special_tokens': must be a boolean", "add_special_tokens", "invalid_parameter"});
    add_special = a->get<bool>();
  }
  auto ids = codec->encode(it->get<std::string>(), add_special);
  if (!ids) return reply_error(endpoint, res, {400, "'prompt': " + ids.error().message(), "prompt", "invalid_parameter"});
  res.set_content(dump(json{{"tokens", *ids}, {"count", ids->size()}}), "application/json");
  count(endpoint, 200);
}

void gateway_state::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  if (!authorized(req)) return reply_error(endpoint, res, {401, "Incorrect API key provided", "", "invalid_api_key"});
  json body;
  if (!read_body(endpoint, req, res, body)) return;
  params p{body, std::nullopt};
  request_plan plan;
  auto& j = plan.job;
  if (!choose_model(endpoint, res, p, j.model)) return;
  const std::string model = j.model;  // what the answer names
  read_common(p, plan);
  if (chat) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty()) {
      p.fail("messages", "a non-empty array of messages is required");
    } else {
      std::vector<transport::chat_message> msgs;
      std::size_t image_bytes = 0;
      for (const auto& m : *it) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
          p.fail("messages", "each message needs a role");
          break;
        }
        std::string content;
        const auto c = m.value("content", json(nullptr));
        if (c.is_string()) {
          content = c.get<std::string>();
        } else if (c.is_array()) {
          bool ok = true;
          for (const auto& part : c) {
            if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
              content += part["text"].get<std::string>();
              continue;
            }
            if (part.is_object() && part.value("type", "") == "image_url") {
              // An image travels with the job; the replica's vision tower reads it where the marker is.
              auto img = image_of(part);
              if (!img) {
                p.fail("messages", "image_url: " + img.error());
                ok = false;
                break;
              }
              image_bytes += img->size();
              if (j.images.size() >= max_images || image_bytes > max_image_bytes) {
                p.fail("messages", "image_url: at most " + std::to_string(max_images) + " images of " + std::to_string(max_image_bytes >> 20) +
                                       " MiB in all");
                ok = false;
                break;
              }
              content += transport::media_marker;
              j.images.push_back(std::move(*img));
              continue;
            }
            const std::string type = part.is_object() && part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
            p.fail("messages", type.empty() ? "each content part needs a type and, for text, a string text"
                                            : "content parts of type '" + type + "' are not taken: text and image_url are");
            ok = false;
            break;
          }
          if (!ok) break;
        } else if (!c.is_null()) {
          p.fail("messages", "content must be a string or an array of text parts");
          break;
        }
        msgs.push_back({m["role"].get<std::string>(), content});
      }
      j.prompt = std::move(msgs);
    }
    if (auto v = p.boolean("logprobs"); v && *v) plan.logprobs = 0;
    if (auto v = p.number<std::int32_t>("top_logprobs", 0, 20)) {
      if (plan.logprobs < 0) p.fail("top_logprobs", "needs logprobs: true");
      else plan.logprobs = *v;
    }
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
      if (!t->is_array()) {
        p.fail("tools", "must be an array of tools");
      } else if (!t->empty() && body.value("tool_choice", json("auto")) != json("none")) {
        j.tools_json = t->dump();
        plan.tools = true;
      }
    }
  } else {
    auto it = body.find("prompt");
    if (it == body.end()) {
      p.fail("prompt", "a prompt is required");
    } else if (it->is_string()) {
      j.prompt = it->get<std::string>();
    } else if (it->is_array() && !it->empty() && std::all_of(it->begin(), it->end(), [](const json& x) { return x.is_number_integer(); })) {
      j.prompt = it->get<std::vector<std::int32_t>>();
    } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      j.prompt = (*it)[0].get<std::string>();
    } else {
      p.fail("prompt", "must be a string or an array of token ids (one prompt per request)");
    }
    if (auto v = p.number<std::int32_t>("logprobs", 0, 20)) plan.logprobs = *v;
    if (auto v = p.boolean("echo"); v && *v) p.fail("echo", "echo is not supported");
    if (auto v = p.number<std::int32_t>("best_of", 1, 16); v && *v > 1 && !body.value("use_beam_search", false))
      p.fail("best_of", "best_of is taken with use_beam_search (the beam width)");
    if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) p.fail("suffix", "suffix is not supported");
  }
  read_guide(p, j, req.body);
  if (chat) read_tool_choice(p, j, codec && j.model == this->model ? std::string_view(codec->chat_template()) : std::string_view());
  // Left out: a chat answer may take what the context leaves after the prompt (0: the replica's driver
  // resolves it against its capacity); a completion's default is OpenAI's 16.
  if (!body.contains("max_tokens") && !body.contains("max_completion_tokens")) j.max_tokens = chat ? 0 : 16;
  if (plan.logprobs >= 0) j.sampling.top_logprobs = plan.logprobs;
  if (plan.n > options.max_n) p.fail("n", "at most " + std::to_string(options.max_n));
  // Beam search as vLLM takes it: use_beam_search, a width (beam_width, or best_of, or n), n choices
  // (the best n hypotheses), length_penalty, early_stopping; one job, answered once.
  std::int32_t width = 0;
  if (auto v = p.boolean("use_beam_search"); v && *v) {
    width = plan.n;
    if (auto b = p.number<std::int32_t>("best_of", 1, 10)) width = std::max(width, *b);
    if (auto b = p.number<std::int32_t>("beam_width", 1, 10)) width = std::max(width, *b);
    if (width < 2) width = 2;
    if (plan.n > width) p.fail("n", "at most the beam width (" + std::to_string(width) + ")");
    if (width > 10) p.fail("beam_width", "at most 10");
    if (plan.stream) p.fail("stream", "beam search answers once, when the search ends");
    if (j.sampling.temperature != 0.0f && body.contains("temperature")) p.fail("temperature", "beam search ranks by log-probability: 0 or left out");
    j.sampling.temperature = 0.0f;
    j.beams = width;
    if (auto lp = p.number<float>("length_penalty", -10.0, 10.0)) j.length_penalty = *lp;
    if (auto es = p.boolean("early_stopping")) j.early_stopping = *es;
  }
  if (p.err) return reply_error(endpoint, res, *p.err);

  // One job per choice; choice i draws with seed + i, so n choices differ and each is reproducible.
  const auto t0 = clock_type::now();
  std::vector<std::shared_ptr<job>> jobs;
  for (std::int32_t i = 0; i < (width > 0 ? 1 : plan.n); ++i) {
    auto ji = j;
    ji.sampling.seed = j.sampling.seed + static_cast<std::uint64_t>(i);
    auto r = cl->submit(ji);
    if (!r) {
      for (auto& x : jobs) x->cancel();
      return reply_error(endpoint, res, from_transport(r.error()));
    }
    jobs.push_back(std::make_shared<job>(std::move(*r)));
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(jobs.front()->id());
  res.set_header("x-troupe-seed", std::to_string(j.sampling.seed));  // choice i drew with seed + i
  const auto created = static_cast<std::int64_t>(std::time(nullptr));

  // One token's logprobs entry. Chat: with its UTF-8 `bytes`; completions: with its `text_offset`,
  // the offset of the token's text in the choice's text (`offset` runs over the choice's tokens).
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  };
  auto logprob_entry = [this, chat, bytes_of](const transport::token_logprob& t, json& content, json& lp_tokens, json& lp_values, json& lp_top,
                                              json& lp_offsets, std::size_t& offset) {
    if (chat) {
      json top = json::array();
      for (const auto& x : t.top) {
        const auto s = token_text(x.token);
        top.push_back({{"token", s}, {"logprob", x.logprob}, {"bytes", bytes_of(s)}});
      }
      const auto s = token_text(t.token);
      content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    } else {
      const auto s = token_text(t.token);
      lp_offsets.push_back(offset);
      offset += s.size();
      lp_tokens.push_back(s);
      lp_values.push_back(t.logprob);
      json top = json::object();
      for (const auto& x : t.top) top[token_text(x.token)] = x.logprob;
      lp_top.push_back(top);
    }
  };

  if (!plan.stream) {
    json choices = json::array();
    std::int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    std::optional<double> first_token;
    std::string replicas;  // the replicas that answered, in choice order (x-troupe-replica)
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      // Pull chunk by chunk to time the first token.
      job_result r;
      while (auto c = jobs[i]->next()) {
        if (!first_token && !c->ids.empty()) first_token = std::chrono::duration<double>(clock_type::now() - t0).count();
      }
      r = jobs[i]->wait();
      if (r.error) {
        for (auto& x : jobs) x->cancel();
        return reply_error(endpoint, res, from_transport(*r.error));
      }
      prompt_tokens = r.usage.prompt_tokens;
      cached_tokens = std::max(cached_tokens, r.usage.cached_tokens);
      completion_tokens += static_cast<std::int64_t>(r.tokens.size());
      if (r.replica != 0) replicas += (replicas.empty() ? "" : ",") + std::to_string(r.replica);
      if (width > 0) {  // the best n hypotheses, each a choice
        for (std::size_t b = 0; b < r.beams.size() && b < static_cast<std::size_t>(plan.n); ++b) {
          const auto& hb = r.beams[b];
          const std::string finish = finish_of(std::string(transport::name(hb.finish_reason)));
          json choice = chat ? json{{"index", b}, {"message", {{"role", "assistant"}, {"content", hb.text}}}, {"finish_reason", finish}, {"logprobs", nullptr}}
                             : json{{"index", b}, {"text", hb.text}, {"finish_reason", finish}, {"logprobs", nullptr}};
          choice["cumulative_logprob"] = hb.logprob;  // vLLM's field
          choices.push_back(std::move(choice));
        }
        continue;
      }
      json content = json::array(), lt = json::array(), lv = json::array(), ltop = json::array(), loff = json::array();
      std::size_t offset = 0;
      for (const auto& t : r.logprobs) logprob_entry(t, content, lt, lv, ltop, loff, offset);
      std::string finish = finish_of(r.finish_reason);
      if (chat) {
        json message = {{"role", "assistant"}, {"content", r.text}};
        if (plan.tools) {
          auto [rest, calls] = parse_tool_calls_json(r.text);
          if (!calls.empty()) {
            message["content"] = rest.empty() ? json(nullptr) : json(rest);
            message["tool_calls"] = calls;
            finish = "tool_calls";
          }
        }
        json choice = {{"index", i}, {"message", message}, {"finish_reason", finish}, {"logprobs", nullptr}};
        if (plan.logprobs >= 0) choice["logprobs"] = {{"content", content}};
        choices.push_back(choice);
      } else {
        json choice = {{"index", i}, {"text", r.text}, {"finish_reason", finish}, {"logprobs", nullptr}};
        if (plan.logprobs >= 0) choice["logprobs"] = {{"tokens", lt}, {"token_logprobs", lv}, {"top_logprobs", ltop}, {"text_offset", loff}};
        choices.push_back(choice);
      }
    }
    const double total = std::chrono::duration<double>(clock_type::now() - t0).count();
    {
      std::lock_guard lock(stats.m);
      stats.prompt_tokens += prompt_tokens;
      stats.generation_tokens += completion_tokens;
      if (first_token) stats.ttft.observe(*first_token);
      if (completion_tokens > static_cast<std::int64_t>(jobs.size()) && first_token)
        stats.tpot.observe((total - *first_token) / static_cast<double>(completion_tokens / static_cast<std::int64_t>(jobs.size()) - 1));
    }
    json out = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", model},
                {"choices", choices}, {"usage", usage_json(prompt_tokens, completion_tokens, cached_tokens)}, {"seed", j.sampling.seed}};
    if (!replicas.empty()) res.set_header("x-troupe-replica", replicas);
    res.set_content(dump(out), "application/json");
    count(endpoint, 200);
    spdlog::info("event=http_request endpoint={} status=200 model={} prompt_tokens={} completion_tokens={} seconds={:.3f} replica={}", endpoint, model,
                 prompt_tokens, completion_tokens, total, replicas.empty() ? "-" : replicas);
    return;
  }

  // Server-sent events: one event per chunk, then the usage event when asked, then [DONE]. A write
  // that fails (the client went away) cancels the jobs.
  count(endpoint, 200);
  struct stream_state {
    std::size_t current = 0;
    bool role_sent = false;
    bool done = false;
    std::int64_t prompt_tokens = 0, completion_tokens = 0;
    std::optional<double> first_token;
    std::string held;       // with tools: the choice's text, parsed for tool calls at its end
    std::size_t shown = 0;  // how much of `held` went out as content (text that cannot begin a call)
    std::set<std::uint64_t> replicas;  // for the access log
    std::size_t offset = 0;             // text_offset within the current choice
    std::int64_t cached_tokens = 0;     // prompt tokens the prefix cache supplied
  };
  auto st = std::make_shared<stream_state>();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, jobs, st, chat, plan, id, created, t0, logprob_entry, model](std::size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto cancel_all = [&] {
          for (auto& x : jobs) x->cancel();
        };
        if (st->done) {
          sink.done();
          return true;
        }
        if (st->current >= jobs.size()) {
          if (plan.include_usage) {
            json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created}, {"model", model},
                      {"choices", json::array()}, {"usage", usage_json(st->prompt_tokens, st->completion_tokens, st->cached_tokens)}};
            if (!send(u)) return false;
          }
          const std::string done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) return false;
          const double total = std::chrono::duration<double>(clock_type::now() - t0).count();
          {
            std::lock_guard lock(stats.m);
            stats.prompt_tokens += st->prompt_tokens;
            stats.generation_tokens += st->completion_tokens;
            if (st->first_token) stats.ttft.observe(*st->first_token);
            const auto per = st->completion_tokens / static_cast<std::int64_t>(jobs.size());
            if (st->first_token && per > 1) stats.tpot.observe((total - *st->first_token) / static_cast<double>(per - 1));
          }
          st->done = true;
          sink.done();
          spdlog::info("event=http_request endpoint={} status=200 stream=true model={} prompt_tokens={} completion_tokens={} seconds={:.3f} replica={}",
                       chat ? "/v1/chat/completions" : "/v1/completions", model, st->prompt_tokens, st->completion_tokens, total,
                       st->replicas.empty() ? std::string("-") : fmt::format("{}", fmt::join(st->replicas, ",")));
          return true;
        }
        auto& jb = *jobs[st->current];
        const auto index = st->current;
        auto c = jb.next();
        if (!c) {
          auto r = jb.wait();
          if (r.error) {
            json e = json::parse(error_body(from_transport(*r.error)));
            send(e);
            cancel_all();
            st->current = jobs.size();
            return true;
          }
          ++st->current;
          st->offset = 0;
          st->held.clear();  // each choice's text is its own
          st->shown = 0;
          return true;
        }
        if (!st->first_token && !c->ids.empty()) st->first_token = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (c->replica != 0) st->replicas.insert(c->replica);
        st->cached_tokens = std::max(st->cached_tokens, c->usage.cached_tokens);
        st->prompt_tokens = c->usage.prompt_tokens;
        st->completion_tokens += static_cast<std::int64_t>(c->ids.size());
        json content = json::array(), lt = json::array(), lv = json::array(), ltop = json::array(), loff = json::array();
        for (const auto& t : c->logprobs) logprob_entry(t, content, lt, lv, ltop, loff, st->offset);
        const bool last = c->finish_reason != transport::finish_reason::running;
        std::string finish = last ? finish_of(std::string(transport::name(c->finish_reason))) : std::string();
        json choice;
        if (chat) {
          json delta = json::object();
          if (!st->role_sent) {
            delta["role"] = "assistant";
            st->role_sent = true;
          }
          if (plan.tools) {
            // Text streams as it comes up to where a tool call could begin; from there it is held and
            // parsed at the end, and each call goes out as OpenAI streams them: its index, id, type and
            // name with empty arguments, then the arguments.
            st->held += c->text;
            const auto from = last ? st->held.size() : call_start(st->held, st->shown);
            if (!last && from > st->shown) delta["content"] = st->held.substr(st->shown, from - st->shown);
            if (!last) st->shown = from;
            if (last) {
              const auto tail = st->held.substr(st->shown);
              auto [rest, calls] = parse_tool_calls_json(tail);
              if (!calls.empty()) {
                if (!rest.empty()) delta["content"] = rest;
                for (std::size_t k = 0; k < calls.size(); ++k) {
                  const auto& call = calls[k];
                  json head = {{"index", k}, {"id", call["id"]}, {"type", "function"}, {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}};
                  json args = {{"index", k}, {"function", {{"arguments", call["function"]["arguments"]}}}};
                  for (auto* part : {&head, &args}) {
                    delta["tool_calls"] = json::array({*part});
                    json ev = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
                               {"choices", json::array({{{"index", index}, {"delta", delta}, {"finish_reason", nullptr}, {"logprobs", nullptr}}})}};
                    if (!send(ev)) {
                      cancel_all();
                      return false;
                    }
                    delta = json::object();
                  }
                }
                finish = "tool_calls";
              } else if (!tail.empty()) {
                delta["content"] = tail;
              }
            }
          } else if (!c->text.empty()) {
            delta["content"] = c->text;
          }
          choice = {{"index", index}, {"delta", delta}, {"finish_reason", last ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
          if (plan.logprobs >= 0 && !content.empty()) choice["logprobs"] = {{"content", content}};
        } else {
          choice = {{"index", index}, {"text", c->text}, {"finish_reason", last ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
          if (plan.logprobs >= 0 && !lt.empty()) choice["logprobs"] = {{"tokens", lt}, {"token_logprobs", lv}, {"top_logprobs", ltop}, {"text_offset", loff}};
        }
        json event = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created}, {"model", model},
                      {"choices", json::array({choice})}};
        if (!send(event)) {
          cancel_all();
          return false;
        }
        return true;
      },
      [jobs, st](bool success) {
        if (!success || !st->done)
          for (auto& x : jobs) x->cancel();
      });
}

// POST /v1/embeddings: OpenAI's shape. Each input (a string, or an array of token ids) is one embed job
// routed like a completion to a replica of the model; the vector is the encode program's hidden
// states pooled as the checkpoint declares (families/pooling.hpp). `dimensions` keeps the first N
// components and normalizes them again (Matryoshka-style truncation); `encoding_format` base64 sends
// the little-endian float32 bytes.
void gateway_state::embeddings(const httplib::Request& req, httplib::Response& res) {
  const std::string endpoint = "/v1/embeddings";
  if (!authorized(req)) return reply_error(endpoint, res, {401, "Incorrect API key provided", "", "invalid_api_key"});
  json body;
  if (!read_body(endpoint, req, res, body)) return;
  params p{body, std::nullopt};
  std::string model;
  if (!choose_model(endpoint, res, p, model)) return;
  std::vector<transport::prompt> inputs;
  auto it = body.find("input");
  auto token_array = [](const json& x) { return x.is_array() && !x.empty() && std::all_of(x.begin(), x.end(), [](const json& t) { return t.is_number_integer(); }); };
  if (it == body.end() || it->is_null()) {
    p.fail("input", "an input is required");
  } else if (it->is_string()) {
    inputs.emplace_back(it->get<std::string>());
  } else if (token_array(*it)) {
    inputs.emplace_back(it->get<std::vector<std::int32_t>>());
  } else if (it->is_array() && !it->empty() && it->size() <= 2048) {
    for (const auto& x : *it) {
      if (x.is_string()) inputs.emplace_back(x.get<std::string>());
      else if (token_array(x)) inputs.emplace_back(x.get<std::vector<std::int32_t>>());
      else {
        p.fail("input", "each input is a string or an array of token ids");
        break;
      }
    }
  } else {
    p.fail("input", "a string, an array of strings, or token ids (at most 2048 inputs)");
  }
  for (const auto& in : inputs)
    if (const auto* t = std::get_if<std::string>(&in); t && t->empty()) p.fail("input", "an input is empty");
  bool base64 = false;
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) p.fail("encoding_format", "'float' or 'base64'");
    else base64 = *f == "base64";
  }
  std::optional<std::int64_t> dimensions;
  if (auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<std::int64_t>() < 1) p.fail("dimensions", "a positive integer");
    else dimensions = d->get<std::int64_t>();
  }
  if (p.err) return reply_error(endpoint, res, *p.err);

  const auto t0 = clock_type::now();
  std::vector<std::shared_ptr<job>> jobs;
  for (auto& in : inputs) {
    transport::job_submit j;
    j.model = model;
    j.prompt = std::move(in);
    j.embed = true;
    j.max_tokens = 1;
    auto r = cl->submit(j);
    if (!r) {
      for (auto& x : jobs) x->cancel();
      return reply_error(endpoint, res, from_transport(r.error()));
    }
    jobs.push_back(std::make_shared<job>(std::move(*r)));
  }
  json data = json::array();
  std::int64_t prompt_tokens = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    auto r = jobs[i]->wait();
    if (r.error) {
      for (auto& x : jobs) x->cancel();
      return reply_error(endpoint, res, from_transport(*r.error));
    }
    auto v = std::move(r.embedding);
    if (dimensions) {
      if (*dimensions > static_cast<std::int64_t>(v.size()))
        return reply_error(endpoint, res, {400, "'dimensions': the model's embeddings have " + std::to_string(v.size()), "dimensions", "invalid_parameter"});
      v.resize(static_cast<std::size_t>(*dimensions));
      double n = 0;
      for (float x : v) n += static_cast<double>(x) * x;
      if (n > 0)
        for (auto& x : v) x = static_cast<float>(x / std::sqrt(n));
    }
    prompt_tokens += r.usage.prompt_tokens;
    json e = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      std::string bytes(v.size() * 4, '\0');
      std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian hosts only (x86-64, aarch64)
      e["embedding"] = base64_of(bytes);
    } else {
      e["embedding"] = v;
    }
    data.push_back(std::move(e));
  }
  json out = {{"object", "list"}, {"data", data}, {"model", model}, {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  res.set_content(dump(out), "application/json");
  count(endpoint, 200);
  spdlog::info("event=http_request endpoint={} status=200 model={} inputs={} prompt_tokens={} seconds={:.3f}", endpoint, model, jobs.size(),
               prompt_tokens, std::chrono::duration<double>(clock_type::now() - t0).count());
}

namespace {

// A Prometheus label value: backslash, quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string gateway_state::metrics_text() {
  std::string out;
  const auto replicas = cluster->replica_stats();
  std::lock_guard lock(stats.m);
  out += "# HELP troupe_requests_total HTTP requests by endpoint and status.\n# TYPE troupe_requests_total counter\n";
  for (const auto& [k, v] : stats.requests)
    out += "troupe_requests_total{endpoint=\"" + label_value(k.first) + "\",status=\"" + std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  out += "# HELP troupe_prompt_tokens_total Prompt tokens of completed requests.\n# TYPE troupe_prompt_tokens_total counter\n";
  out += "troupe_prompt_tokens_total " + std::to_string(stats.prompt_tokens) + "\n";
  out += "# HELP troupe_generation_tokens_total Generated tokens of completed requests.\n# TYPE troupe_generation_tokens_total counter\n";
  out += "troupe_generation_tokens_total " + std::to_string(stats.generation_tokens) + "\n";
  stats.ttft.print(out, "troupe_time_to_first_token_seconds", "Time from the request to its first token.");
  stats.tpot.print(out, "troupe_time_per_output_token_seconds", "Time per output token after the first.");
  auto gauge = [&](const std::string& name, const std::string& help, auto field) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
    for (std::size_t i = 0; i < replicas.size(); ++i)
      out += name + "{node=\"node-0\",replica=\"" + std::to_string(i) + "\"} " + dump(json(field(replicas[i]))) + "\n";
  };
  gauge("troupe_queue_depth", "Sequences waiting for a row.", [](const transport::stats& s) { return s.queued; });
  gauge("troupe_running_sequences", "Sequences holding a row.", [](const transport::stats& s) { return s.running; });
  gauge("troupe_kv_blocks_used", "KV blocks in use.", [](const transport::stats& s) { return s.kv_blocks_used; });
  gauge("troupe_kv_blocks_total", "KV blocks in the pool.", [](const transport::stats& s) { return s.kv_blocks_total; });
  gauge("troupe_kv_usage_ratio", "Share of the KV pool in use.",
        [](const transport::stats& s) { return s.kv_blocks_total ? static_cast<double>(s.kv_blocks_used) / static_cast<double>(s.kv_blocks_total) : 0.0; });
  gauge("troupe_prefix_cache_hit_ratio", "Share of prompt tokens served from the prefix cache.",
        [](const transport::stats& s) { return s.prompt_tokens ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prompt_tokens) : 0.0; });
  gauge("troupe_draft_tokens", "Speculative decoding: drafts verified.", [](const transport::stats& s) { return s.draft_tokens; });
  gauge("troupe_accepted_draft_tokens", "Speculative decoding: drafts accepted.", [](const transport::stats& s) { return s.accepted_tokens; });
  gauge("troupe_draft_acceptance_ratio", "Speculative decoding: share of drafts accepted.",
        [](const transport::stats& s) { return s.draft_tokens ? static_cast<double>(s.accepted_tokens) / static_cast<double>(s.draft_tokens) : 0.0; });
  gauge("troupe_decode_tokens_per_second", "Recent decode throughput.", [](const transport::stats& s) { return s.tokens_per_second; });
  gauge("troupe_jobs_done", "Jobs finished.", [](const transport::stats& s) { return s.jobs_done; });
  return out;
}

gateway::gateway(std::unique_ptr<gateway_state> s) : s_(std::move(s)) {}

gateway::~gateway() {
  stop();
  if (s_->thread.joinable()) s_->thread.join();
  if (s_->lane_thread.joinable()) s_->lane_thread.join();
}

int gateway::port() const { return s_->port; }
void gateway::wait() {
  if (s_->thread.joinable()) s_->thread.join();
}
void gateway::stop() {
  if (s_->stopped.exchange(true)) return;
  s_->front.reset();  // no new connection, the open ones closed
  s_->server.stop();
  s_->lane.stop();
}

namespace {

// The routes and limits of one of the gateway's httplib servers (the main pool and the reserved lane
// serve the same routes; the front decides which one a connection reaches).
void serve_routes(httplib::Server& srv, gateway_state* st, const gateway_options& options, int threads) {
  srv.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };

  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on a port in
  // use binds too and the kernel splits the connections between the two.
  srv.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof yes);
  });
  srv.set_payload_max_length(options.max_body_bytes);
  // Checked before any body byte is read: a chunked body (no length, so httplib 0.11 buffers all of it
  // before its bound applies) is 411, and a Range header is 416 (no route serves partial content;
  // httplib would otherwise slice every answer, a 401 included). A declared length over the bound is
  // httplib's: it reads and discards the body without keeping it, then answers 413.
  srv.set_pre_routing_handler([st](const httplib::Request& req, httplib::Response& res) {
    auto refuse = [&](int status, const std::string& why) {
      st->reply_error(req.path, res, {status, why, "", status == 413 ? "payload_too_large" : "invalid_request"});
      return httplib::Server::HandlerResponse::Handled;
    };
    if (req.has_header("Range")) return refuse(416, "Range requests are not served");
    if (req.has_header("Transfer-Encoding") && req.get_header_value("Transfer-Encoding") != "identity")
      return refuse(411, "a request body needs a Content-Length (chunked bodies are not taken)");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  srv.set_read_timeout(options.io_timeout_s, 0);
  srv.set_write_timeout(options.io_timeout_s, 0);
  srv.set_error_handler([st](const httplib::Request& req, httplib::Response& res) {
    // Errors httplib produced itself (413, 404 of unknown paths, 400 of unparsable requests).
    if (!res.body.empty()) return;
    api_error e{res.status, res.status == 413 ? "the request body is too large" : "no such endpoint: " + req.method + " " + req.path, "", ""};
    res.set_content(error_body(e), "application/json");
    st->count(req.path, res.status);
  });
  // The chat page: public (it holds no data; its API calls carry the key the user types).
  srv.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(std::string(chat_page()), "text/html; charset=utf-8");
  });
  srv.Get("/health", [st](const httplib::Request&, httplib::Response& res) {
    const bool up = st->cluster->healthy();
    res.status = up ? 200 : 503;
    if (!up) res.set_header("Retry-After", "1");
    res.set_content(up ? R"({"status":"ok"})" : R"({"status":"coordinator unreachable"})", "application/json");
    st->count("/health", res.status);
  });
  srv.Get("/ready", [st](const httplib::Request&, httplib::Response& res) {
    const bool ready = st->cluster->healthy() && !st->cluster->replica_stats().empty();
    res.status = ready ? 200 : 503;
    res.set_content(ready ? R"({"status":"ready"})" : R"({"status":"starting"})", "application/json");
    st->count("/ready", res.status);
  });
  srv.Get("/metrics", [st](const httplib::Request&, httplib::Response& res) {
    res.set_content(st->metrics_text(), "text/plain; version=0.0.4");
    st->count("/metrics", 200);
  });
  srv.Get("/v1/models", [st](const httplib::Request& req, httplib::Response& res) {
    if (!st->authorized(req)) return st->reply_error("/v1/models", res, {401, "Incorrect API key provided", "", "invalid_api_key"});
    json data = json::array();
    for (const auto& m : st->served_models()) data.push_back({{"id", m}, {"object", "model"}, {"created", 0}, {"owned_by", "troupe"}});
    json j = {{"object", "list"}, {"data", data}};
    res.set_content(dump(j), "application/json");
    st->count("/v1/models", 200);
  });
  // One model (as OpenAI's retrieve): its object, or 404 naming it.
  srv.Get(R"(/v1/models/(.+))", [st](const httplib::Request& req, httplib::Response& res) {
    if (!st->authorized(req)) return st->reply_error("/v1/models/{id}", res, {401, "Incorrect API key provided", "", "invalid_api_key"});
    const std::string id = req.matches[1];
    const auto served = st->served_models();
    if (std::find(served.begin(), served.end(), id) == served.end())
      return st->reply_error("/v1/models/{id}", res, {404, "The model '" + id + "' does not exist", "model", "model_not_found"});
    res.set_content(dump(json{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "troupe"}}), "application/json");
    st->count("/v1/models/{id}", 200);
  });
  srv.Post("/v1/messages", [st](const httplib::Request& req, httplib::Response& res) { st->messages(req, res); });
  srv.Post("/v1/load_lora_adapter", [st](const httplib::Request& req, httplib::Response& res) { st->lora_adapter(req, res, true); });
  srv.Post("/v1/unload_lora_adapter", [st](const httplib::Request& req, httplib::Response& res) { st->lora_adapter(req, res, false); });
  srv.Post("/tokenize", [st](const httplib::Request& req, httplib::Response& res) { st->tokenize(req, res, false); });
  srv.Post("/detokenize", [st](const httplib::Request& req, httplib::Response& res) { st->tokenize(req, res, true); });
  srv.Get("/version", [st](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump(json{{"version", TROUPE_VERSION_STRING}}), "application/json");
    st->count("/version", 200);
  });
  srv.Post("/v1/completions", [st](const httplib::Request& req, httplib::Response& res) { st->completions(req, res, false); });
  srv.Post("/v1/chat/completions", [st](const httplib::Request& req, httplib::Response& res) { st->completions(req, res, true); });
  srv.Post("/v1/embeddings", [st](const httplib::Request& req, httplib::Response& res) { st->embeddings(req, res); });
}

}  // namespace

result<std::unique_ptr<gateway>, std::string> gateway::start(serving_backend& cluster, const std::filesystem::path& model, gateway_options options) {
  auto s = std::make_unique<gateway_state>();
  s->options = options;
  s->cluster = &cluster;
  s->cl = cluster.connect();
  s->model = cluster.model_name();
  if (!model.empty())
    if (auto c = text::text_codec::open(model)) s->codec.emplace(std::move(*c));
  auto* st = s.get();
  serve_routes(s->server, st, options, std::max(4, options.http_threads));
  serve_routes(s->lane, st, options, 4);
  // One request per lane connection: a kept-alive probe connection would hold one of the lane's four
  // threads until httplib's keep-alive timeout, and four of them would starve every other monitor.
  s->lane.set_keep_alive_max_count(1);
  const int main_port = s->server.bind_to_any_port("127.0.0.1");
  const int lane_port = s->lane.bind_to_any_port("127.0.0.1");
  if (main_port < 0 || lane_port < 0) return unexpected(std::string("cannot bind the gateway's loopback servers"));
  http_limits limits;
  limits.max_body_bytes = options.max_body_bytes;
  limits.max_connections = options.max_connections;
  limits.max_connections_per_client = options.max_connections_per_client;
  limits.head_deadline = std::chrono::milliseconds(options.head_deadline_ms);
  limits.body_deadline = std::chrono::milliseconds(options.body_deadline_ms);
  auto front = http_front::start(options.host, options.port, main_port, lane_port, limits);
  if (!front) return unexpected(front.error());
  s->front = std::move(*front);
  s->port = s->front->port();
  s->thread = std::thread([st] { st->server.listen_after_bind(); });
  s->lane_thread = std::thread([st] { st->lane.listen_after_bind(); });
  return std::unique_ptr<gateway>(new gateway(std::move(s)));
}

}  // namespace troupe::actors
