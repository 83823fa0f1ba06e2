// The HTTP gateway over raw HTTP: responses match the driver alone for the same seed, OpenAI-style
// errors for bad keys, bad parameters, malformed JSON and oversized bodies, SSE framing, metrics, and
// no leaked sequence when a streaming client disconnects or a client stalls.
#include "tests/support/loopback.hpp"
#include "actors/gateway.hpp"
#include "cluster/local_cluster.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/text/chat_template.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/tiny_model.hpp"
#include "tests/support/served_model.hpp"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixture_path() { return test::tiny_llama_gguf("tiny.gguf"); }

cluster_options options() { return test::tiny_cluster_options(1); }

struct served {
  std::unique_ptr<local_cluster> cluster;
  std::unique_ptr<gateway> gw;
  std::unique_ptr<httplib::Client> http;
};

served serve(gateway_options g = {}, cluster_options co = options()) {
  served s;
  auto c = local_cluster::start(fixture_path(), co);
  EXPECT_TRUE(c) << (c ? "" : c.error());
  s.cluster = std::move(*c);
  g.port = 0;
  g.api_keys = {"test-key"};
  g.io_timeout_s = 2;
  g.max_body_bytes = 1 << 20;
  auto gw = gateway::start(*s.cluster, fixture_path(), g);
  EXPECT_TRUE(gw) << (gw ? "" : gw.error());
  s.gw = std::move(*gw);
  s.http = std::make_unique<httplib::Client>("127.0.0.1", s.gw->port());
  s.http->set_bearer_token_auth("test-key");
  s.http->set_read_timeout(60, 0);
  return s;
}

// The engine's own answer: the same prompt ids and sampling through a driver.
driver::generation engine(const std::vector<std::int32_t>& prompt, float temperature, std::uint64_t seed, std::int64_t max_tokens,
                          std::int32_t top_logprobs = 0) {
  auto h = test::served_model(fixture_path());
  EXPECT_TRUE(h);
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto d = driver::driver<driver::unprepared>(h, ex, options().driver).prepare();
  EXPECT_TRUE(d);
  driver::seq_request r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.top_logprobs = top_logprobs;
  auto g = d->generate(r);
  EXPECT_TRUE(g);
  return *g;
}

std::vector<std::int32_t> encode(const std::string& text) {
  auto h = families::model_handle::load(fixture_path(), families::registry::builtin());
  auto ids = (*h)->text()->encode(text, true);
  return std::vector<std::int32_t>(ids->begin(), ids->end());
}

std::int64_t kv_used(local_cluster& c) {
  std::int64_t used = 0;
  for (const auto& s : c.replica_stats()) used += s.kv_blocks_used + s.running + s.queued;
  return used;
}

bool eventually_idle(local_cluster& c) {
  for (int i = 0; i < 200; ++i) {
    if (kv_used(c) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(gateway, completions_match_the_engine) {
  auto s = serve();
  json req = {{"model", "tiny"}, {"prompt", "w300 w301 w302"}, {"max_tokens", 6}, {"temperature", 0.7}, {"seed", 11}, {"logprobs", 2}};
  auto r = s.http->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = json::parse(r->body);
  const auto ref = engine(encode("w300 w301 w302"), 0.7f, 11, 6, 2);
  EXPECT_EQ(j["choices"][0]["text"], ref.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  ASSERT_EQ(j["choices"][0]["logprobs"]["token_logprobs"].size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(j["choices"][0]["logprobs"]["token_logprobs"][i].get<float>(), ref.picks[i].logprob);

  // Token ids as the prompt, n = 2 with seeds 3 and 4.
  json ids = {{"model", "tiny"}, {"prompt", {5, 6, 7, 8}}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 3}, {"n", 2}};
  auto r2 = s.http->Post("/v1/completions", ids.dump(), "application/json");
  ASSERT_EQ(r2->status, 200) << r2->body;
  const auto j2 = json::parse(r2->body);
  ASSERT_EQ(j2["choices"].size(), 2u);
  EXPECT_EQ(j2["choices"][0]["text"], engine({5, 6, 7, 8}, 1.0f, 3, 5).text);
  EXPECT_EQ(j2["choices"][1]["text"], engine({5, 6, 7, 8}, 1.0f, 4, 5).text);
  EXPECT_EQ(j2["usage"]["completion_tokens"], 10);
}

TEST(gateway, streaming_sends_sse_events_usage_and_done) {
  auto s = serve();
  json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "w300"}}}}, {"max_tokens", 5}, {"temperature", 0},
              {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  std::string body;
  auto r = s.http->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events;
  bool done = false;
  std::size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const auto end = r->body.find("\n\n", pos);
    const auto payload = r->body.substr(pos + 6, end - pos - 6);
    if (payload == "[DONE]") done = true;
    else events.push_back(json::parse(payload));
    pos = end;
  }
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 6u);  // 5 token events and the usage event
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (const auto& e : events)
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content")) content += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
  // The chat template renders the conversation; the engine gets the same ids.
  auto h = families::model_handle::load(fixture_path(), families::registry::builtin());
  auto tpl = text::chat_template::parse((*h)->text()->chat_template());
  ASSERT_TRUE(tpl);
  text::chat_render_options ro;
  ro.add_generation_prompt = true;
  auto rendered = tpl->render(R"([{"role":"user","content":"w300"}])", ro);
  ASSERT_TRUE(rendered);
  auto ids = (*h)->text()->encode(*rendered, false);
  EXPECT_EQ(content, engine(std::vector<std::int32_t>(ids->begin(), ids->end()), 0.0f, 0, 5).text);
}

TEST(gateway, errors_are_openai_shaped) {
  auto s = serve();
  httplib::Client anon("127.0.0.1", s.gw->port());
  auto r = anon.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  anon.set_bearer_token_auth("wrong");
  EXPECT_EQ(anon.Get("/v1/models")->status, 401);
  EXPECT_EQ(anon.Get("/health")->status, 200);  // health needs no key

  auto post = [&](const std::string& path, const std::string& body) { return s.http->Post(path, body, "application/json"); };
  auto bad = post("/v1/chat/completions", "{not json");
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["type"], "invalid_request_error");
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"temperature", -1}, {"top_p", 0}, {"n", 0}, {"max_tokens", 0}, {"logit_bias", {{"x", 1}}}, {"stop", 5}, {"seed", "s"},
           {"echo", true}, {"best_of", 3}, {"suffix", "x"}}) {
    json req = {{"model", "tiny"}, {"prompt", "w300"}};
    req[field] = value;
    auto e = post("/v1/completions", req.dump());
    EXPECT_EQ(e->status, 400) << field;
    EXPECT_EQ(json::parse(e->body)["error"]["param"], field);
  }
  auto missing = post("/v1/chat/completions", R"({"model":"tiny"})");
  EXPECT_EQ(json::parse(missing->body)["error"]["param"], "messages");
  auto unknown = post("/v1/completions", R"({"model":"other","prompt":"x"})");
  EXPECT_EQ(unknown->status, 404);
  auto too_long = post("/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":100000})");
  EXPECT_EQ(too_long->status, 400);
  EXPECT_EQ(json::parse(too_long->body)["error"]["code"], "too_long");
  auto big = post("/v1/completions", std::string(2 << 20, ' '));
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(s.http->Get("/nope")->status, 404);
  EXPECT_TRUE(eventually_idle(*s.cluster));
}

TEST(gateway, stop_strings_and_metrics) {
  auto s = serve();
  const auto full = engine(encode("w300 w301 w302"), 0.0f, 0, 12);
  // A stop string from the middle of the greedy text.
  const auto piece = full.text.substr(full.text.size() / 2, 3);
  json req = {{"model", "tiny"}, {"prompt", "w300 w301 w302"}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {piece}}};
  auto r = s.http->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_EQ(r->status, 200);
  const auto j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], full.text.substr(0, full.text.find(piece)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto m = s.http->Get("/metrics");
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("troupe_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("troupe_time_to_first_token_seconds_count 1"), std::string::npos);
  EXPECT_NE(m->body.find("troupe_kv_blocks_total{node=\"node-0\",replica=\"0\"}"), std::string::npos);
  EXPECT_EQ(s.http->Get("/ready")->status, 200);
}

// A replica that drafts with prompt lookup answers what the engine answers without drafts, with or
// without the request's opt-out ("speculative": false), and its acceptance shows in /metrics.
TEST(gateway, a_speculating_replica_answers_like_the_engine_and_reports_its_drafts) {
  auto co = options();
  co.driver.speculation.kind = driver::draft_kind::ngram;
  co.driver.speculation.tokens = 3;
  auto s = serve({}, co);
  const std::string prompt = "w300 w301 w302 w300 w301 w302 w300 w301 w302 w300 w301";
  const auto ref = engine(encode(prompt), 0.8f, 5, 24);
  for (const json& opt_out : {json(nullptr), json(false), json(true)}) {
    json req = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0.8}, {"seed", 5}, {"ignore_eos", false}};
    if (!opt_out.is_null()) req["speculative"] = opt_out;
    auto r = s.http->Post("/v1/completions", req.dump(), "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], ref.text) << req.dump();
  }
  auto bad = s.http->Post("/v1/completions", json{{"model", "tiny"}, {"prompt", "w1"}, {"speculative", "no"}}.dump(), "application/json");
  ASSERT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "speculative");
  auto m = s.http->Get("/metrics");
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("troupe_draft_acceptance_ratio{node=\"node-0\",replica=\"0\"}"), std::string::npos) << m->body;
  EXPECT_EQ(m->body.find("troupe_draft_tokens{node=\"node-0\",replica=\"0\"} 0\n"), std::string::npos) << m->body;
}

// Beam search as vLLM's API takes it: one job of the beam width, the best n hypotheses as choices,
// equal to the driver's own beam search; streaming and sampling with beams are refused by name.
TEST(gateway, beam_search_answers_the_drivers_best_hypotheses) {
  auto s = serve();
  const auto prompt = encode("w300 w301 w302");
  auto h = test::served_model(fixture_path());
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto d = driver::driver<driver::unprepared>(h, ex, options().driver).prepare();
  ASSERT_TRUE(d);
  driver::seq_request r;
  r.prompt = prompt;
  r.max_tokens = 5;
  r.beams = 4;
  auto g = d->generate(r);
  ASSERT_TRUE(g);
  ASSERT_EQ(g->beams.size(), 4u);
  json req = {{"model", "tiny"}, {"prompt", "w300 w301 w302"}, {"max_tokens", 5}, {"use_beam_search", true}, {"beam_width", 4}, {"n", 2}};
  auto res = s.http->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = json::parse(res->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["text"], g->beams[i].text) << i;
    EXPECT_NEAR(j["choices"][i]["cumulative_logprob"].get<double>(), g->beams[i].logprob, 1e-6);
  }
  for (const auto& [field, value] : {std::pair{"stream", json(true)}, std::pair{"temperature", json(0.9)}}) {
    auto bad = req;
    bad[field] = value;
    auto b = s.http->Post("/v1/completions", bad.dump(), "application/json");
    ASSERT_EQ(b->status, 400) << field;
    EXPECT_EQ(json::parse(b->body)["error"]["param"], field);
  }
}

int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  return fd;
}

TEST(gateway, refused_admission_is_429_with_retry_after) {
  auto co = options();
  co.max_outstanding = 1;
  co.driver.capacity = 2048;
  auto s = serve({}, co);
  // Eight long requests at once against a cluster that admits one job at a time: the others are
  // refused immediately, not queued.
  struct outcome {
    int status = 0;
    std::string retry_after, body;
  };
  std::vector<outcome> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.gw->port());
      c.set_bearer_token_auth("test-key");
      c.set_read_timeout(60, 0);
      auto r = c.Post("/v1/completions", R"({"model":"tiny","prompt":"w300","max_tokens":1500})", "application/json");
      if (r) results[static_cast<std::size_t>(i)] = {r->status, r->get_header_value("Retry-After"), r->body};
    });
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (const auto& r : results) {
    if (r.status == 200) {
      ++ok;
    } else {
      EXPECT_EQ(r.status, 429);
      EXPECT_EQ(r.retry_after, "1");
      EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error");
      ++refused;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1);
  EXPECT_TRUE(eventually_idle(*s.cluster));
}

TEST(gateway, disconnects_and_stalled_clients_leak_nothing) {
  auto s = serve();
  // A streaming client that reads its first event and hangs up: the job is cancelled.
  const int fd = connect_raw(s.gw->port());
  ASSERT_GE(fd, 0);
  const std::string body = json{{"model", "tiny"}, {"prompt", "w300"}, {"max_tokens", 200}, {"stream", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(::read(fd, buf, sizeof buf), 0);
  ::close(fd);
  EXPECT_TRUE(eventually_idle(*s.cluster));

  // A client that sends half a body and stalls is dropped after the I/O timeout, taking nothing.
  const int slow = connect_raw(s.gw->port());
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key\r\nContent-Length: 100\r\n\r\n{\"model\":";
  ASSERT_EQ(::write(slow, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ::close(slow);
  EXPECT_TRUE(eventually_idle(*s.cluster));

  // The gateway still serves.
  auto ok = s.http->Post("/v1/completions", R"({"model":"tiny","prompt":"w300","max_tokens":2})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// The other templates' formats: Llama 3.x JSON (after <|python_tag|> or bare), Mistral's [TOOL_CALLS]
// (an array, or name[ARGS]{...}), DeepSeek V3's, and a bare array; a reply that is not a call stays text.
TEST(gateway, tool_calls_in_the_llama_mistral_and_deepseek_formats_are_parsed) {
  auto names = [](const std::string& calls) {
    std::vector<std::string> out;
    if (calls.empty()) return out;
    for (const auto& c : json::parse(calls)) out.push_back(c["function"]["name"].get<std::string>() + json::parse(c["function"]["arguments"].get<std::string>()).dump());
    return out;
  };
  using v = std::vector<std::string>;
  auto [r1, c1] = parse_tool_calls(R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}})");
  EXPECT_EQ(names(c1), (v{R"(get_weather{"city":"Oslo"})"}));
  EXPECT_EQ(r1, "");
  auto [r2, c2] = parse_tool_calls(R"([TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}])");
  EXPECT_EQ(names(c2), (v{R"(a{"x":1})", "b{}"}));
  auto [r3, c3] = parse_tool_calls(R"(Sure. [TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}[TOOL_CALLS]get_date[ARGS]{})");
  EXPECT_EQ(names(c3), (v{R"(get_time{"tz":"UTC"})", "get_date{}"}));
  EXPECT_EQ(r3, "Sure.");
  auto [r4, c4] = parse_tool_calls(
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(names(c4), (v{R"(get_weather{"city":"Lima"})", "get_time{}"}));
  EXPECT_EQ(r4, "Checking.");
  auto [r5, c5] = parse_tool_calls(R"([{"name": "f", "arguments": {"k": "v"}}])");  // the marker was a skipped special token
  EXPECT_EQ(names(c5), (v{R"(f{"k":"v"})"}));
  // Not calls: a JSON answer without a name, an array with one bad entry, plain text.
  EXPECT_TRUE(parse_tool_calls(R"({"city": "Oslo"})").second.empty());
  EXPECT_TRUE(parse_tool_calls(R"([{"name": "f"}, {"x": 1}])").second.empty());
  auto [r6, c6] = parse_tool_calls("[TOOL_CALLS] not json");
  EXPECT_TRUE(c6.empty());
  EXPECT_EQ(r6, "[TOOL_CALLS] not json");
}

TEST(gateway, tool_calls_in_the_hermes_format_are_parsed) {
  auto [rest, calls] = parse_tool_calls(
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{}\"}</tool_call>");
  EXPECT_EQ(rest, "Let me check.");
  const auto j = json::parse(calls);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["type"], "function");
  EXPECT_EQ(j[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(j[0]["function"]["arguments"].get<std::string>())["city"], "Paris");
  EXPECT_EQ(j[1]["function"]["arguments"], "{}");
  EXPECT_NE(j[0]["id"], j[1]["id"]);
  // A whole reply that is one call object; malformed calls stay text.
  EXPECT_FALSE(parse_tool_calls(R"({"name":"f","parameters":{"x":1}})").second.empty());
  auto [text, none] = parse_tool_calls("<tool_call>{broken</tool_call> plain");
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(text, "<tool_call>{broken</tool_call> plain");

  // A chat request with tools renders them through the template and answers in the chat shape.
  auto s = serve();
  json req = {{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
              {"max_tokens", 4},
              {"temperature", 0},
              {"tools", json::array({json{{"type", "function"}, {"function", json{{"name", "get_weather"}, {"parameters", json{{"type", "object"}}}}}}})}};
  auto r = s.http->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  const auto out = json::parse(r->body);
  EXPECT_EQ(out["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(out["usage"]["prompt_tokens"].get<int>(), json::parse(s.http->Post("/v1/chat/completions",
      json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "weather?"}}}}, {"max_tokens", 1}}.dump(), "application/json")->body)["usage"]["prompt_tokens"].get<int>());
}


// tool_choice "required" or a named function forces a call: the output is a call of an offered tool
// with arguments valid against its parameters, in the model's format, so the answer carries tool_calls
// (finish_reason "tool_calls"); the same through /v1/messages' tool_choice any / tool.
TEST(gateway, forced_tool_calls_follow_the_tools_parameters) {
  auto s = serve();
  auto post = [&](const std::string& path, const json& body) { return s.http->Post(path, body.dump(), "application/json"); };
  const json tools = json::array(
      {json{{"type", "function"},
            {"function", {{"name", "get_weather"},
                          {"parameters", {{"type", "object"},
                                          {"properties", {{"city", {{"type", "string"}, {"maxLength", 8}}}, {"unit", {{"enum", {"c", "f"}}}}}},
                                          {"required", {"city", "unit"}}}}}}},
       json{{"type", "function"},
            {"function", {{"name", "get_time"},
                          {"parameters", {{"type", "object"}, {"properties", {{"hour", {{"type", "integer"}, {"minimum", 0}, {"maximum", 23}}}}}, {"required", {"hour"}}}}}}}});
  auto check_call = [](const json& call) {
    const auto name = call["function"]["name"].get<std::string>();
    const auto args = json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
      EXPECT_TRUE(args["city"].is_string()) << args;
      EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args;
    } else {
      EXPECT_EQ(name, "get_time");
      EXPECT_TRUE(args["hour"].is_number_integer() && args["hour"].get<int>() >= 0 && args["hour"].get<int>() <= 23) << args;
    }
    return name;
  };
  for (int seed = 1; seed <= 4; ++seed) {
    json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "weather?"}}}}, {"temperature", 1.0}, {"seed", seed},
                {"max_tokens", 120}, {"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", false}};
    auto r = post("/v1/chat/completions", req);
    ASSERT_EQ(r->status, 200) << r->body;
    const auto out = json::parse(r->body)["choices"][0];
    EXPECT_EQ(out["finish_reason"], "tool_calls") << out.dump();
    ASSERT_EQ(out["message"]["tool_calls"].size(), 1u) << out.dump();
    check_call(out["message"]["tool_calls"][0]);

    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    req.erase("parallel_tool_calls");
    auto named = post("/v1/chat/completions", req);
    ASSERT_EQ(named->status, 200) << named->body;
    const auto n = json::parse(named->body)["choices"][0];
    ASSERT_EQ(n["message"]["tool_calls"].size(), 1u) << n.dump();
    EXPECT_EQ(check_call(n["message"]["tool_calls"][0]), "get_time");
  }
  // Streamed: the calls arrive as OpenAI streams them (index, id, type and name first with empty
  // arguments, then the arguments), the same calls as the whole answer for the same seed.
  for (const bool parallel : {false, true}) {
    json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "weather?"}}}}, {"temperature", 1.0}, {"seed", 7},
                {"max_tokens", 120}, {"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", parallel}};
    auto whole = post("/v1/chat/completions", req);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const auto expect = json::parse(whole->body)["choices"][0]["message"]["tool_calls"];
    req["stream"] = true;
    auto st = post("/v1/chat/completions", req);
    ASSERT_EQ(st->status, 200);
    json calls = json::array();
    std::string finish;
    std::istringstream lines(st->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const auto ev = json::parse(line.substr(6));
      const auto& ch = ev["choices"][0];
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const auto& d : ch["delta"]["tool_calls"]) {
        const auto k = d["index"].get<std::size_t>();
        if (k == calls.size()) {
          ASSERT_TRUE(d.contains("id") && d["type"] == "function" && d["function"]["arguments"] == "") << d.dump();
          calls.push_back({{"id", d["id"]}, {"name", d["function"]["name"]}, {"arguments", ""}});
        } else {
          ASSERT_LT(k, calls.size()) << d.dump();
          calls[k]["arguments"] = calls[k]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
        }
      }
    }
    EXPECT_EQ(finish, "tool_calls") << st->body;
    ASSERT_EQ(calls.size(), expect.size()) << st->body;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(calls[k]["name"], expect[k]["function"]["name"]);
      EXPECT_EQ(json::parse(calls[k]["arguments"].get<std::string>()), json::parse(expect[k]["function"]["arguments"].get<std::string>()));
    }
  }
  // With tools on offer and no call in the reply, the text streams as it comes (not held to the end).
  {
    json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "w300"}}}}, {"temperature", 0}, {"max_tokens", 24},
                {"ignore_eos", true}, {"tools", tools}, {"stream", true}};
    auto st = post("/v1/chat/completions", req);
    ASSERT_EQ(st->status, 200);
    int content_events = 0;
    std::istringstream lines(st->body);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("data: {", 0) == 0 && json::parse(line.substr(6))["choices"][0]["delta"].contains("content")) ++content_events;
    EXPECT_GT(content_events, 3) << st->body;
  }
  json unknown = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}};
  auto e = post("/v1/chat/completions", unknown);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(json::parse(e->body)["error"]["param"], "tool_choice") << e->body;

  json msg = {{"model", "tiny"}, {"max_tokens", 120}, {"temperature", 1.0},
              {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
              {"tools", {{{"name", "get_weather"}, {"input_schema", tools[0]["function"]["parameters"]}}}},
              {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}};
  auto m = s.http->Post("/v1/messages", {{"x-api-key", "test-key"}, {"anthropic-version", "2023-06-01"}}, msg.dump(), "application/json");
  ASSERT_EQ(m->status, 200) << m->body;
  const auto mj = json::parse(m->body);
  EXPECT_EQ(mj["stop_reason"], "tool_use") << m->body;
  bool used = false;
  for (const auto& b : mj["content"])
    if (b["type"] == "tool_use") {
      used = true;
      EXPECT_EQ(b["name"], "get_weather");
      EXPECT_TRUE(b["input"]["unit"] == "c" || b["input"]["unit"] == "f") << m->body;
    }
  EXPECT_TRUE(used) << m->body;
}
}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// Hostile HTTP clients (issue 19's probes that the gateway itself can answer): a body nested past the
// bound, a chunked body and a Range header are each refused before the
// body is read or built, and unknown paths all land in one `other` series that no path can write into.
TEST(gateway, hostile_bodies_headers_and_paths_are_refused_and_bounded) {
  auto s = serve();
  // 80,000 nested arrays inside tools: 400 naming the bound, and the server keeps serving.
  std::string nested = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":";
  nested += std::string(80000, '[') + std::string(80000, ']') + "}";
  auto deep = s.http->Post("/v1/chat/completions", nested, "application/json");
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->status, 400) << deep->body;
  EXPECT_NE(deep->body.find("nests deeper"), std::string::npos) << deep->body;
  // A chunked body is not taken (its length is unknown until it has been buffered).
  httplib::Client raw("127.0.0.1", s.gw->port());
  raw.set_bearer_token_auth("test-key");
  std::size_t sent = 0;
  auto chunked = raw.Post(
      "/v1/completions",
      [&](std::size_t, httplib::DataSink& sink) {
        if (sent >= 4) {
          sink.done();
          return true;
        }
        ++sent;
        const std::string piece(1024, ' ');
        return sink.write(piece.data(), piece.size());
      },
      "application/json");
  // The server answers before reading the body and closes, so a client still sending may see the
  // connection reset instead of the 411 (seen under load); either way nothing was served or buffered.
  if (chunked) {
    EXPECT_EQ(chunked->status, 411) << chunked->body;
  }
  // Range is not served, on any route and before authentication.
  httplib::Client anon("127.0.0.1", s.gw->port());
  auto ranged = anon.Get("/v1/models", httplib::Headers{{"Range", "bytes=0-0,0-0,0-0"}});
  ASSERT_TRUE(ranged);
  EXPECT_EQ(ranged->status, 416);
  // Unknown paths: one series, and nothing a path says reaches the exposition.
  for (int i = 0; i < 50; ++i) (void)anon.Get(("/x" + std::to_string(i) + "%22%7D%0Atroupe_running_sequences%20999").c_str());
  auto metrics = anon.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("troupe_running_sequences 999"), std::string::npos);
  EXPECT_NE(metrics->body.find("endpoint=\"other\",status=\"404\"} 50"), std::string::npos) << metrics->body;
  EXPECT_EQ(metrics->body.find("/x1"), std::string::npos);
  // Still serving.
  auto ok = s.http->Post("/v1/completions", R"({"model":"tiny","prompt":"w300","max_tokens":2})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto health = anon.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}


int connect_to(int port) { return test::loopback_connect(port, 5); }

// Sends `bytes` (best effort) and returns the status of the answer, 0 when the connection closed
// without one.
int status_of(int fd, const std::string& bytes) {
  for (std::size_t off = 0; off < bytes.size();) {
    const ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w <= 0) break;
    off += static_cast<std::size_t>(w);
  }
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  if (n < 12) return 0;
  buf[n] = 0;
  return std::atoi(buf + 9);
}

std::uint64_t own_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// The front holds what httplib would not: header counts and sizes, slow heads and bodies, silent
// connections, bodies too large to take, connections per client; /health answers throughout (a
// reserved lane) and completions are still served.
TEST(gateway, hostile_clients_cannot_starve_or_grow_the_gateway) {
  gateway_options g;
  g.head_deadline_ms = 400;
  g.body_deadline_ms = 400;
  g.max_connections_per_client = 4096;
  auto s = serve(g);
  const int port = s.gw->port();
  const auto rss_before = own_rss();
  // 3,000 headers: 431 after the 100th, nothing kept.
  {
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 3000; ++i) req += "X-" + std::to_string(i) + ": y\r\n";
    const int fd = connect_to(port);
    EXPECT_EQ(status_of(fd, req + "\r\n"), 431);
    ::close(fd);
  }
  // A head past 64 KiB without its blank line: 431.
  {
    const int fd = connect_to(port);
    EXPECT_EQ(status_of(fd, "GET /health HTTP/1.1\r\nX-Big: " + std::string(70000, 'a')), 431);
    ::close(fd);
  }
  // A body declared at 100 MB: 413 at once, without reading it; chunked: 411.
  {
    const int fd = connect_to(port);
    EXPECT_EQ(status_of(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"), 413);
    ::close(fd);
    const int fd2 = connect_to(port);
    EXPECT_EQ(status_of(fd2, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(1 << 20, 'z')), 411);
    ::close(fd2);
  }
  // 130 slowloris clients (one byte every 100 ms) and 200 silent ones, while /health is asked
  // repeatedly: each answer in under a second, and a completion is served.
  std::atomic<bool> stop{false};
  std::atomic<int> timed_out{0};
  std::vector<std::thread> loris;
  for (int i = 0; i < 130; ++i)
    loris.emplace_back([&] {
      const int fd = connect_to(port);
      const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n";
      for (std::size_t k = 0; k < req.size() && !stop; ++k) {
        if (::send(fd, req.data() + k, 1, MSG_NOSIGNAL) <= 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      char buf[64];
      timeval tv{0, 100000};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n >= 12 && std::string(buf, 12).find("408") != std::string::npos) ++timed_out;
      ::close(fd);
    });
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i) silent.push_back(connect_to(port));
  httplib::Client probe("127.0.0.1", port);
  double worst = 0;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = probe.Get("/health");
    worst = std::max(worst, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(worst, 1.0);
  auto ok = s.http->Post("/v1/completions", R"({"model":"tiny","prompt":"w300","max_tokens":2})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  stop = true;
  for (auto& t : loris) t.join();
  EXPECT_GT(timed_out.load(), 100) << "slow heads are answered 408";
  int closed = 0;
  for (int fd : silent) {
    char buf[512];
    ssize_t n = 0, got = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got += n;
    if (n == 0 && got > 0 && std::string(buf, 12).find("408") != std::string::npos) ++closed;  // a 408, then the close
    ::close(fd);
  }
  EXPECT_EQ(closed, 200) << "silent connections are closed at the head deadline";
  EXPECT_LT(own_rss(), rss_before + (100u << 20));
}

TEST(gateway, connections_per_client_are_capped) {
  gateway_options g;
  g.max_connections_per_client = 4;
  auto s = serve(g);
  // Four connections each with a request answered and kept alive: they hold the address's slots and
  // are never closed to make room (a request went through them). (A probe's connection is not kept:
  // the reserved lane answers one request per connection.)
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(connect_to(s.gw->port()));
    EXPECT_EQ(status_of(held.back(), "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key\r\n\r\n"), 200);
  }
  // The front counts a connection on its own thread once it accepts it; on two loaded cores that can
  // trail the client's connect (a clean-clone CI run saw it), so each refusal below is asked again, a
  // few times, until the front has counted what the test holds. A wrong answer on the way takes no
  // slot for long: it is closed before the next try.
  auto answer = [&](const std::string& request, int want) {
    int got = 0;
    for (int attempt = 0; attempt < 5 && got != want; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int fd = connect_to(s.gw->port());
      got = status_of(fd, request);
      ::close(fd);
    }
    return got;
  };
  // Past the cap an address may still ask a probe (a monitor behind the same address as a flood)...
  EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200), 200);
  // ...and nothing else.
  EXPECT_EQ(answer("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 503), 503);
  // Connections that never send a head do not pile up past the cap: each newer one closes the
  // oldest still waiting, and a probe is still answered.
  std::vector<int> more;
  for (int i = 0; i < 32; ++i) more.push_back(connect_to(s.gw->port()));
  int closed = 0;
  std::vector<pollfd> watch;
  for (int fd : more) watch.push_back({fd, POLLIN, 0});
  for (int i = 0; i < 10 && closed < 16; ++i) {  // up to a second for the front to close them
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::poll(watch.data(), watch.size(), 0);
    closed = static_cast<int>(std::count_if(watch.begin(), watch.end(), [](const pollfd& p) { return p.revents != 0; }));
  }
  EXPECT_GE(closed, 16) << "silent connections past the cap are closed for newer ones";
  EXPECT_EQ(answer("GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200), 200);
  for (int fd : more) ::close(fd);
  for (int fd : held) ::close(fd);
}

// What the server cannot honour is refused by name, never ignored (a malformed schema, regex or grammar
// too); the small routes; unseeded
// requests draw a fresh seed that replays; a chat without max_tokens takes what the context leaves.
// Constrained outputs: a JSON schema (OpenAI's response_format, vLLM's guided_json), free-form JSON, a
// regex, a choice list and a GBNF grammar shape what a random tiny model writes; the text satisfies
// them, greedy or sampled, streamed or not.
TEST(gateway, constrained_outputs_follow_the_schema_regex_choice_and_grammar) {
  auto s = serve();
  auto post = [&](const std::string& path, const json& body) { return s.http->Post(path, body.dump(), "application/json"); };
  const json hi = json::array({{{"role", "user"}, {"content", "w300 w301"}}});
  const json schema = {{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}, {"maxLength", 6}}},
                                       {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 120}}},
                                       {"tags", {{"type", "array"}, {"items", {{"enum", {"a", "b", "c"}}}}, {"maxItems", 3}}}}},
                       {"required", {"name", "age"}},
                       {"additionalProperties", false}};
  for (double temp : {0.0, 1.0})
    for (int seed : {1, 2, 3}) {
      json req = {{"model", "tiny"}, {"messages", hi}, {"temperature", temp}, {"seed", seed}, {"max_tokens", 180}};
      if (seed == 2) req["guided_json"] = schema;
      else req["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}};
      auto r = post("/v1/chat/completions", req);
      ASSERT_EQ(r->status, 200) << r->body;
      const auto body = json::parse(r->body);
      const auto content = body["choices"][0]["message"]["content"].get<std::string>();
      EXPECT_EQ(body["choices"][0]["finish_reason"], "stop") << content;
      auto v = json::parse(content, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << content;
      ASSERT_TRUE(v.is_object()) << content;
      ASSERT_TRUE(v.contains("name") && v["name"].is_string()) << content;
      const auto name = v["name"].get<std::string>();
      EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }), 6) << content;
      ASSERT_TRUE(v.contains("age") && v["age"].is_number_integer()) << content;
      EXPECT_GE(v["age"].get<int>(), 0);
      EXPECT_LE(v["age"].get<int>(), 120);
      for (auto& [k, x] : v.items()) {
        EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << content;
        if (k == "tags") {
          ASSERT_TRUE(x.is_array()) << content;
          EXPECT_LE(x.size(), 3u);
          for (auto& t : x) EXPECT_TRUE(t == "a" || t == "b" || t == "c") << content;
        }
      }
    }

  auto completion = [&](const json& extra) {
    json req = {{"model", "tiny"}, {"prompt", "w300 w301"}, {"max_tokens", 64}, {"temperature", 1.0}, {"seed", 5}};
    req.update(extra);
    auto r = post("/v1/completions", req);
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body)["choices"][0];
  };
  for (int seed = 0; seed < 4; ++seed) {
    auto re = completion({{"guided_regex", "[A-Z][a-z]{2,5}-[0-9]{3}"}, {"seed", seed}});
    EXPECT_TRUE(std::regex_match(re["text"].get<std::string>(), std::regex("[A-Z][a-z]{2,5}-[0-9]{3}"))) << re.dump();
    auto ch = completion({{"guided_choice", {"alpha", "beta", "gamma delta"}}, {"seed", seed}});
    const auto t = ch["text"].get<std::string>();
    EXPECT_TRUE(t == "alpha" || t == "beta" || t == "gamma delta") << t;
    EXPECT_EQ(ch["finish_reason"], "stop");
    auto gr = completion({{"grammar", "root ::= (\"yes\" | \"no\") \" \" [0-9]{2}"}, {"seed", seed}});
    EXPECT_TRUE(std::regex_match(gr["text"].get<std::string>(), std::regex("(yes|no) [0-9]{2}"))) << gr.dump();
    // Free-form JSON: whatever the model writes is an object, complete when it stops.
    auto obj = completion({{"response_format", {{"type", "json_object"}}}, {"seed", seed}, {"max_tokens", 120}});
    const auto text = obj["text"].get<std::string>();
    EXPECT_EQ(text.substr(0, 1), "{") << text;
    if (obj["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
    }
  }

  // Streamed, the deltas add up to one of the choices.
  json streamed = {{"model", "tiny"}, {"messages", hi}, {"stream", true}, {"temperature", 1.0}, {"seed", 9}, {"guided_choice", {"left", "right"}}};
  auto st = post("/v1/chat/completions", streamed);
  ASSERT_EQ(st->status, 200);
  std::string text;
  std::istringstream lines(st->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const auto ev = json::parse(line.substr(6));
    const auto& d = ev["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
  }
  EXPECT_TRUE(text == "left" || text == "right") << st->body;
}

TEST(gateway, unhonoured_fields_are_refused_seeds_replay_and_chat_length_follows_the_context) {
  auto s = serve();
  auto post = [&](const std::string& path, const json& body) { return s.http->Post(path, body.dump(), "application/json"); };
  const json hi = json::array({{{"role", "user"}, {"content", "w300 w301"}}});
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"response_format", {{"type", "yaml"}}},
           {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}},
           {"guided_json", {{"type", "object"}, {"not", {{"type", "string"}}}}}, {"guided_regex", "(a"}, {"guided_choice", json::array()},
           {"grammar", "root ::= missing"}, {"guided_grammar", "root ::= root \"a\""},
           {"tool_choice", "required"}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}) {
    json req = {{"model", "tiny"}, {"messages", hi}, {"max_tokens", 2}};
    req[field] = value;
    auto e = post("/v1/chat/completions", req);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->status, 400) << field << " " << value.dump();
    EXPECT_EQ(json::parse(e->body)["error"]["param"].get<std::string>().rfind(field, 0), 0u) << e->body;
  }
  json image = {{"model", "tiny"}, {"max_tokens", 2},
                {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "w300"}},
                                                                                      {{"type", "image_url"}, {"image_url", {{"url", "data:,"}}}}})}}})}};
  auto img = post("/v1/chat/completions", image);
  EXPECT_EQ(img->status, 400);
  EXPECT_NE(json::parse(img->body)["error"]["message"].get<std::string>().find("image_url"), std::string::npos) << img->body;
  auto text_format = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", hi}, {"max_tokens", 2}, {"response_format", {{"type", "text"}}}});
  EXPECT_EQ(text_format->status, 200) << text_format->body;

  // Unseeded at temperature 1: a fresh seed each time, told back; the same seed replays the answer.
  const json sampled = {{"model", "tiny"}, {"prompt", "w300 w301"}, {"max_tokens", 12}, {"temperature", 1.0}};
  auto a = post("/v1/completions", sampled), b = post("/v1/completions", sampled);
  ASSERT_EQ(a->status, 200);
  ASSERT_EQ(b->status, 200);
  const auto ja = json::parse(a->body), jb = json::parse(b->body);
  EXPECT_NE(ja["seed"], jb["seed"]);
  EXPECT_EQ(a->get_header_value("x-troupe-seed"), ja["seed"].dump());
  EXPECT_FALSE(a->get_header_value("x-troupe-replica").empty()) << "the replica that served it";
  json replay = sampled;
  replay["seed"] = ja["seed"];
  auto c = post("/v1/completions", replay);
  EXPECT_EQ(json::parse(c->body)["choices"][0]["text"], ja["choices"][0]["text"]);

  // A chat without max_tokens on a 256-position model: it used to add 256 and fail too_long.
  auto open_ended = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", hi}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(open_ended->status, 200) << open_ended->body;
  const auto usage = json::parse(open_ended->body)["usage"];
  EXPECT_LE(usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>(), 256) << usage.dump();
  EXPECT_GT(usage["completion_tokens"].get<int>(), 128) << usage.dump();  // what the context (and pool) left
  EXPECT_EQ(json::parse(open_ended->body)["choices"][0]["finish_reason"], "length");

  // The same long prompt twice: the second is served partly from the replica's prefix cache, and
  // usage says how much (OpenAI's prompt_tokens_details.cached_tokens), streamed usage too.
  std::string words;
  for (int w = 300; w < 312; ++w) words += "w" + std::to_string(w) + " ";  // about 80 tokens
  const json cached_req = {{"model", "tiny"}, {"prompt", words}, {"max_tokens", 2}, {"temperature", 0}};
  auto first = post("/v1/completions", cached_req);
  auto second = post("/v1/completions", cached_req);
  ASSERT_EQ(second->status, 200) << second->body;
  const auto u1 = json::parse(first->body)["usage"], u2 = json::parse(second->body)["usage"];
  EXPECT_EQ(u1["prompt_tokens_details"]["cached_tokens"], 0) << u1.dump();
  EXPECT_GE(u2["prompt_tokens_details"]["cached_tokens"].get<int>(), 16) << u2.dump();  // whole 16-token blocks
  EXPECT_LT(u2["prompt_tokens_details"]["cached_tokens"].get<int>(), u2["prompt_tokens"].get<int>());
  json streamed_req = cached_req;
  streamed_req["stream"] = true;
  streamed_req["stream_options"] = {{"include_usage", true}};
  auto third = post("/v1/completions", streamed_req);
  ASSERT_EQ(third->status, 200);
  EXPECT_NE(third->body.find("\"cached_tokens\":" + u2["prompt_tokens_details"]["cached_tokens"].dump()), std::string::npos) << third->body;

  // Logprobs carry text_offset (completions) and bytes (chat).
  auto lp = post("/v1/completions", {{"model", "tiny"}, {"prompt", "w300"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(lp->status, 200) << lp->body;
  const auto lpj = json::parse(lp->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lpj["text_offset"].size(), lpj["tokens"].size());
  ASSERT_FALSE(lpj["tokens"].empty());
  EXPECT_EQ(lpj["text_offset"][0], 0);
  for (std::size_t i = 1; i < lpj["tokens"].size(); ++i)
    EXPECT_EQ(lpj["text_offset"][i].get<std::size_t>(), lpj["text_offset"][i - 1].get<std::size_t>() + lpj["tokens"][i - 1].get<std::string>().size());
  auto clp = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", hi}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}});
  ASSERT_EQ(clp->status, 200) << clp->body;
  for (const auto& e : json::parse(clp->body)["choices"][0]["logprobs"]["content"]) {
    std::string from_bytes;
    for (const auto& b : e["bytes"]) from_bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(from_bytes, e["token"].get<std::string>());
  }

  auto one = s.http->Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(json::parse(one->body)["id"], "tiny");
  auto none = s.http->Get("/v1/models/nope");
  EXPECT_EQ(none->status, 404);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "model_not_found");
  // vLLM's /tokenize and /detokenize with the gateway's tokenizer: a round trip, and refusals by name.
  auto tok = post("/tokenize", {{"model", "tiny"}, {"prompt", "w300 w301"}, {"add_special_tokens", false}});
  ASSERT_EQ(tok->status, 200) << tok->body;
  const auto ids = json::parse(tok->body)["tokens"];
  EXPECT_EQ(json::parse(tok->body)["count"], ids.size());
  EXPECT_GE(ids.size(), 2u);
  auto detok = post("/detokenize", {{"model", "tiny"}, {"tokens", ids}});
  ASSERT_EQ(detok->status, 200) << detok->body;
  // Decoded as the tokenizer's own decode does (Hugging Face's: this fixture's SentencePiece-style
  // pieces keep their word-start marks).
  const auto text = json::parse(detok->body)["prompt"].get<std::string>();
  EXPECT_NE(text.find("w300"), std::string::npos) << text;
  EXPECT_NE(text.find("w301"), std::string::npos) << text;
  EXPECT_EQ(post("/detokenize", {{"tokens", {1, -3}}})->status, 400);
  EXPECT_EQ(post("/detokenize", {{"tokens", {1 << 30}}})->status, 400);
  EXPECT_EQ(post("/tokenize", {{"model", "other"}, {"prompt", "x"}})->status, 404);
  EXPECT_EQ(json::parse(post("/tokenize", {{"prompt", 5}})->body)["error"]["param"], "prompt");
  auto version = s.http->Get("/version");
  ASSERT_TRUE(version);
  EXPECT_EQ(version->status, 200);
  EXPECT_FALSE(json::parse(version->body)["version"].get<std::string>().empty());
}

// POST /v1/embeddings in OpenAI's shape: each input (text or token ids) is an embed job through the
// cluster; the vectors are the engine's pooled encode states (the fixture declares no pooling: the last
// token's, normalized); base64 carries the same floats; dimensions truncates and renormalizes; bad
// inputs are 400s naming the field.
TEST(gateway, embeddings_are_the_engines_pooled_encode_states) {
  auto s = serve();
  auto post = [&](const json& body) { return s.http->Post("/v1/embeddings", body.dump(), "application/json"); };
  auto h = families::model_handle::load(fixture_path(), families::registry::builtin());
  ASSERT_TRUE(h);
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto d = driver::driver<driver::unprepared>(*h, ex, options().driver).prepare();
  ASSERT_TRUE(d);
  const std::vector<std::vector<std::int32_t>> rows{encode("w300 w301"), encode("w302"), {5, 6, 7}};
  auto want = d->embed(rows, (*h)->pooling());
  ASSERT_TRUE(want) << want.error().message();

  auto r = post({{"model", "tiny"}, {"input", {"w300 w301", "w302"}}});
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<std::int64_t>(rows[0].size() + rows[1].size()));
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    const auto v = j["data"][i]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(v.size(), (*want)[i].size());
    for (std::size_t c = 0; c < v.size(); ++c) EXPECT_NEAR(v[c], (*want)[i][c], 1e-4);
  }
  auto ids = post({{"model", "tiny"}, {"input", {5, 6, 7}}, {"encoding_format", "base64"}});
  ASSERT_EQ(ids->status, 200) << ids->body;
  const auto b64 = json::parse(ids->body)["data"][0]["embedding"].get<std::string>();
  std::string bytes;
  std::uint32_t acc = 0;
  int bits = 0;
  for (char ch : b64) {
    if (ch == '=') break;
    const auto at = std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/").find(ch);
    ASSERT_NE(at, std::string::npos);
    acc = (acc << 6) | static_cast<std::uint32_t>(at);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  ASSERT_EQ(bytes.size(), (*want)[2].size() * 4);
  std::vector<float> decoded((*want)[2].size());
  std::memcpy(decoded.data(), bytes.data(), bytes.size());
  for (std::size_t c = 0; c < decoded.size(); ++c) EXPECT_NEAR(decoded[c], (*want)[2][c], 1e-4);

  auto cut = post({{"input", "w300 w301"}, {"dimensions", 16}});
  ASSERT_EQ(cut->status, 200) << cut->body;
  const auto v16 = json::parse(cut->body)["data"][0]["embedding"].get<std::vector<float>>();
  ASSERT_EQ(v16.size(), 16u);
  double norm = 0, head = 0;
  for (std::size_t c = 0; c < 16; ++c) norm += static_cast<double>(v16[c]) * v16[c], head += static_cast<double>((*want)[0][c]) * (*want)[0][c];
  EXPECT_NEAR(norm, 1.0, 1e-5);
  for (std::size_t c = 0; c < 16; ++c) EXPECT_NEAR(v16[c], (*want)[0][c] / std::sqrt(head), 1e-4);

  for (const auto& [field, body] : std::vector<std::pair<std::string, json>>{
           {"input", {{"input", ""}}}, {"input", {{"model", "tiny"}}}, {"input", {{"input", {{{"x", 1}}}}}},
           {"encoding_format", {{"input", "w300"}, {"encoding_format", "hex"}}}, {"dimensions", {{"input", "w300"}, {"dimensions", 100000}}},
           {"dimensions", {{"input", "w300"}, {"dimensions", 0}}}}) {
    auto e = post(body);
    EXPECT_EQ(e->status, 400) << body.dump() << " " << e->body;
    EXPECT_EQ(json::parse(e->body)["error"]["param"], field) << e->body;
  }
}

// Anthropic's Messages shape, as llama.cpp's server also offers it: x-api-key, a system prompt, text
// blocks, the answer as content blocks with usage; streamed as Anthropic's named events; the same
// text as the chat endpoint at temperature 0; refusals in Anthropic's error shape.
TEST(gateway, the_anthropic_messages_shape_is_served) {
  auto s = serve();
  httplib::Client anthropic("127.0.0.1", s.gw->port());
  anthropic.set_read_timeout(60, 0);
  const httplib::Headers key{{"x-api-key", "test-key"}, {"anthropic-version", "2023-06-01"}};
  const json msg = {{"model", "tiny"}, {"max_tokens", 6}, {"temperature", 0}, {"system", "w310"},
                    {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "w300 w301"}}})}}})}};
  auto r = anthropic.Post("/v1/messages", key, msg.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = json::parse(r->body);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  ASSERT_EQ(j["content"].size(), 1u);
  EXPECT_EQ(j["content"][0]["type"], "text");
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  EXPECT_EQ(j["usage"]["output_tokens"], 6);
  // The same conversation through the chat endpoint gives the same text.
  auto chat = s.http->Post("/v1/chat/completions",
                           json{{"model", "tiny"}, {"max_tokens", 6}, {"temperature", 0},
                                {"messages", json::array({{{"role", "system"}, {"content", "w310"}}, {{"role", "user"}, {"content", "w300 w301"}}})}}
                               .dump(),
                           "application/json");
  ASSERT_EQ(chat->status, 200);
  EXPECT_EQ(json::parse(chat->body)["choices"][0]["message"]["content"], j["content"][0]["text"]);

  json streamed = msg;
  streamed["stream"] = true;
  auto sr = anthropic.Post("/v1/messages", key, streamed.dump(), "application/json");
  ASSERT_EQ(sr->status, 200);
  std::vector<std::string> events;
  std::string text;
  std::istringstream lines(sr->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("event: ", 0) == 0) events.push_back(line.substr(7));
    if (line.rfind("data: ", 0) == 0) {
      const auto d = json::parse(line.substr(6));
      if (d["type"] == "content_block_delta") text += d["delta"]["text"].get<std::string>();
    }
  }
  ASSERT_GE(events.size(), 5u);
  EXPECT_EQ(events.front(), "message_start");
  EXPECT_EQ(events[1], "content_block_start");
  EXPECT_EQ(events[events.size() - 3], "content_block_stop");
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(events.back(), "message_stop");
  EXPECT_EQ(text, j["content"][0]["text"]);

  auto no_key = anthropic.Post("/v1/messages", msg.dump(), "application/json");
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(json::parse(no_key->body)["type"], "error");
  json no_max = msg;
  no_max.erase("max_tokens");
  EXPECT_EQ(anthropic.Post("/v1/messages", key, no_max.dump(), "application/json")->status, 400);
  json image = msg;
  image["messages"][0]["content"].push_back({{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", ""}}}});
  auto img = anthropic.Post("/v1/messages", key, image.dump(), "application/json");
  EXPECT_EQ(img->status, 400);
  EXPECT_NE(json::parse(img->body)["error"]["message"].get<std::string>().find("image"), std::string::npos);
}

// Probe connections a client keeps open after their answer do not hold the reserved lane's threads:
// the lane answers one request per connection, so the next monitor is answered at once.
TEST(gateway, kept_alive_probe_connections_do_not_hold_the_lane) {
  gateway_options g;
  auto s = serve(g);
  std::vector<int> kept;
  for (int i = 0; i < 8; ++i) {
    kept.push_back(connect_to(s.gw->port()));
    EXPECT_EQ(status_of(kept.back(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
  }
  httplib::Client probe("127.0.0.1", s.gw->port());
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = probe.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  }
  for (int fd : kept) ::close(fd);
}

// A slowloris from the same address as the monitor, at the default caps, reconnecting whatever the
// gateway closes: /health keeps answering within a second, every time, and a completion is served.
TEST(gateway, a_same_address_slowloris_never_starves_health) {
  gateway_options g;
  auto s = serve(g);
  const int port = s.gw->port();
  std::atomic<bool> stop{false};
  std::atomic<int> reconnects{0};
  std::thread loris([&] {
    std::vector<int> socks;
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n";
    std::size_t k = 0;
    while (!stop) {
      while (socks.size() < 130) socks.push_back(connect_to(port));
      for (auto& fd : socks) {
        if (::send(fd, req.data() + (k % req.size()), 1, MSG_NOSIGNAL) <= 0) {
          ::close(fd);
          fd = connect_to(port);
          ++reconnects;
        }
      }
      ++k;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (int fd : socks) ::close(fd);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  double worst = 0;
  int failed = 0;
  for (int i = 0; i < 15; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = connect_to(port);
    failed += status_of(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") != 200;
    ::close(fd);
    worst = std::max(worst, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto ok = s.http->Post("/v1/completions", R"({"model":"tiny","prompt":"w300","max_tokens":2})", "application/json");
  stop = true;
  loris.join();
  EXPECT_EQ(failed, 0);
  EXPECT_LT(worst, 1.0);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_GT(reconnects.load(), 0) << "the slow connections past the cap were closed for newer ones";
}

}  // namespace
}  // namespace troupe::actors
