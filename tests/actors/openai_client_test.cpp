// The gateway against the official `openai` npm client (pinned in tests/reference/package.json): every
// response parses in the client and carries the engine's own output for the same seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "actors/gateway.hpp"
#include "cluster/local_cluster.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/text/chat_template.hpp"
#include "apps/default_model.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/tiny_model.hpp"
#include "tests/support/served_model.hpp"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixture_path() { return test::tiny_llama_gguf("tiny.gguf"); }

cluster_options options() { return test::tiny_cluster_options(2); }

struct engine {
  std::shared_ptr<const families::model_handle> h;
  exec::cpu::cpu_executor ex{exec::cpu::cpu_options{1, std::nullopt}};
  std::optional<driver::driver<driver::serving>> d;
  explicit engine(const fs::path& p) {
    h = test::served_model(p);
    auto r = driver::driver<driver::unprepared>(h, ex, options().driver).prepare();
    EXPECT_TRUE(r);
    d.emplace(std::move(*r));
  }
  std::vector<std::int32_t> text_ids(const std::string& t) {
    auto ids = h->text()->encode(t, true);
    return {ids->begin(), ids->end()};
  }
  std::vector<std::int32_t> chat_ids(const std::string& user) {
    auto tpl = text::chat_template::parse(h->text()->chat_template());
    text::chat_render_options o;
    o.add_generation_prompt = true;
    auto r = tpl->render(json::array({{{"role", "user"}, {"content", user}}}).dump(), o);
    auto ids = h->text()->encode(*r, false);
    return {ids->begin(), ids->end()};
  }
  driver::generation run(std::vector<std::int32_t> prompt, float temperature, std::uint64_t seed, std::int64_t max_tokens,
                         std::int32_t top = 0, std::vector<std::string> stop = {}) {
    driver::seq_request r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.top_logprobs = top;
    r.max_tokens = max_tokens;
    r.stop = std::move(stop);
    return *d->generate(r);
  }
};

TEST(openai_client, every_scenario_parses_and_matches_the_engine) {
  const auto model = fixture_path();
  auto c = local_cluster::start(model, options());
  ASSERT_TRUE(c) << c.error();
  gateway_options g;
  g.port = 0;
  g.api_keys = {"sk-test"};
  auto gw = gateway::start(**c, model, g);
  ASSERT_TRUE(gw) << gw.error();

  engine e(model);
  const auto greedy = e.run(e.text_ids("w300 w301 w302"), 0.0f, 0, 12);
  // A stop string from the second half of the greedy text, made of word characters (a shell argument).
  std::string stop = greedy.text.substr(greedy.text.size() / 2, 3);
  if (const auto w = greedy.text.find(" w", greedy.text.size() / 2); w != std::string::npos) stop = greedy.text.substr(w, 3);
  ASSERT_EQ(stop.find('\''), std::string::npos);

  const auto root = fs::path(TROUPE_SOURCE_DIR);
  const auto out = fs::temp_directory_path() / ("troupe-openai-" + std::to_string(::getpid()) + ".json");
  const std::string cmd = "node \"" + (root / "tests/reference/openai_client.mjs").string() + "\" --base-url http://127.0.0.1:" +
                          std::to_string((*gw)->port()) + "/v1 --api-key sk-test --model tiny --stop '" + stop + "' > \"" + out.string() + "\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(out);
  const json r = json::parse(f);
  fs::remove(out);

  EXPECT_EQ(r["models"], json::array({"tiny"}));

  const auto chat = e.run(e.chat_ids("w300 w301 w302"), 0.8f, 5, 8);
  EXPECT_EQ(r["chat"]["content"], chat.text) << r["chat"].dump();
  EXPECT_EQ(r["chat"]["object"], "chat.completion");
  EXPECT_EQ(r["chat"]["usage"]["completion_tokens"], 8);
  EXPECT_EQ(r["chat_stream"]["content"], chat.text) << r["chat_stream"].dump();
  EXPECT_EQ(r["chat_stream"]["role"], "assistant");
  EXPECT_EQ(r["chat_stream"]["finish_reason"], "length");
  EXPECT_EQ(r["chat_stream"]["usage"]["completion_tokens"], 8);

  const auto lp = e.run(e.text_ids("w300 w301 w302"), 0.0f, 0, 6, 2);
  EXPECT_EQ(r["completion_logprobs"]["text"], lp.text);
  ASSERT_EQ(r["completion_logprobs"]["logprobs"]["token_logprobs"].size(), 6u) << r["completion_logprobs"].dump();
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(r["completion_logprobs"]["logprobs"]["token_logprobs"][i].get<double>(), lp.picks[i].logprob, 1e-6);
    EXPECT_EQ(r["completion_logprobs"]["logprobs"]["top_logprobs"][i].size(), 2u);
  }

  EXPECT_EQ(r["completion_ids"]["text"], e.run({5, 6, 7, 8}, 0.0f, 0, 5).text);
  EXPECT_EQ(r["completion_ids"]["usage"]["prompt_tokens"], 4);

  ASSERT_EQ(r["n2"]["texts"].size(), 2u) << r["n2"].dump();
  EXPECT_EQ(r["n2"]["texts"][0], e.run(e.text_ids("w310 w311"), 1.0f, 7, 6).text);
  EXPECT_EQ(r["n2"]["texts"][1], e.run(e.text_ids("w310 w311"), 1.0f, 8, 6).text);

  EXPECT_EQ(r["stop"]["text"], greedy.text.substr(0, greedy.text.find(stop))) << r["stop"].dump();
  EXPECT_EQ(r["stop"]["finish_reason"], "stop");

  const auto clp = e.run(e.chat_ids("w320"), 0.0f, 0, 4, 2);
  EXPECT_EQ(r["chat_logprobs"]["content"], clp.text);
  ASSERT_EQ(r["chat_logprobs"]["logprobs"].size(), 4u) << r["chat_logprobs"].dump();
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(r["chat_logprobs"]["logprobs"][i]["logprob"].get<double>(), clp.picks[i].logprob, 1e-6);
    EXPECT_EQ(r["chat_logprobs"]["logprobs"][i]["top"].size(), 2u);
  }

  EXPECT_FALSE(r["tools"].contains("error")) << r["tools"].dump();
  EXPECT_TRUE(r["tools"]["finish_reason"] == "length" || r["tools"]["finish_reason"] == "tool_calls");

  // Embeddings: the engine's pooled encode states, through the client's base64 and float forms.
  ASSERT_FALSE(r["embeddings"].contains("error")) << r["embeddings"].dump();
  {
    std::vector<std::vector<std::int32_t>> rows{e.text_ids("w300 w301"), e.text_ids("w302"), {5, 6, 7}};
    auto want = e.d->embed(rows, e.h->pooling());
    ASSERT_TRUE(want);
    std::vector<json> got{r["embeddings"]["vectors"][0], r["embeddings"]["vectors"][1], r["embeddings"]["ids_vector"]};
    for (std::size_t i = 0; i < 3; ++i) {
      const auto v = got[i].get<std::vector<double>>();
      ASSERT_EQ(v.size(), (*want)[i].size());
      double dot = 0, a = 0, b = 0;
      for (std::size_t c = 0; c < v.size(); ++c) dot += v[c] * (*want)[i][c], a += v[c] * v[c], b += static_cast<double>((*want)[i][c]) * (*want)[i][c];
      EXPECT_GT(dot / std::sqrt(a * b), 0.9999) << i;
    }
    EXPECT_EQ(r["embeddings"]["prompt_tokens"], static_cast<std::int64_t>(rows[0].size() + rows[1].size()));
  }

  EXPECT_EQ(r["bad_key"]["error"]["status"], 401);
  EXPECT_EQ(r["invalid_param"]["error"]["status"], 400);
  EXPECT_EQ(r["invalid_param"]["error"]["param"], "temperature");
  EXPECT_EQ(r["unknown_model"]["error"]["status"], 404);
}

// Structured outputs through the official client, checked by an independent validator (ajv): random
// schemas the server never saw (strict json_schema, recursion through $defs), json_object, a GBNF
// grammar and a regex, streamed and not, on every shipped family's fixture (the recurrent mamba2's too)
// and on the embedded model.
TEST(openai_client, structured_outputs_validate_on_every_family_and_the_embedded_model) {
  const auto root = fs::path(TROUPE_SOURCE_DIR);
  const auto dir = fs::temp_directory_path() / ("troupe-structured-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::pair<std::string, fs::path>> models;
  for (auto family : families::fixture_families()) {
    families::fixture_dims d;
    d.vocab = 512;
    d.hidden = 64;
    d.ffn = 128;
    d.heads = 2;
    d.kv_heads = 1;
    d.head_dim = 32;
    d.layers = 1;
    d.expert_ffn = 32;
    const auto path = dir / (std::string(family) + ".gguf");
    auto w = families::write_fixture(family, d, path, true);
    ASSERT_TRUE(w) << family << ": " << w.error().message();
    models.emplace_back(std::string(family), path);
  }
  for (auto family : families::recurrent_fixture_families()) {  // a recurrent model through the cluster too
    families::fixture_dims d;
    d.vocab = 512;
    d.hidden = 64;
    d.layers = 1;
    d.head_dim = 32;
    const auto path = dir / (std::string(family) + ".gguf");
    auto w = families::write_fixture(family, d, path, true);
    ASSERT_TRUE(w) << family << ": " << w.error().message();
    models.emplace_back(std::string(family), path);
  }
  if (auto kjv = app::find_default_model()) models.emplace_back("troupe-kjv", *kjv);
  else ADD_FAILURE() << "the embedded model: " << kjv.error();

  std::uint64_t seed = 1;
  for (const auto& [name, path] : models) {
    SCOPED_TRACE(name);
    auto o = test::tiny_cluster_options(1);
    // Room for a schema's whole answer: the fixtures' byte tokens spell JSON a character at a time.
    o.driver.capacity = 512;
    auto c = local_cluster::start(path, o);
    ASSERT_TRUE(c) << c.error();
    gateway_options g;
    g.port = 0;
    g.api_keys = {"sk-test"};
    auto gw = gateway::start(**c, path, g);
    ASSERT_TRUE(gw) << gw.error();
    const auto served = (*c)->models();
    ASSERT_FALSE(served.empty());
    const auto out = dir / (name + ".json");
    const std::string cmd = "node \"" + (root / "tests/reference/openai_structured.mjs").string() + "\" --base-url http://127.0.0.1:" +
                            std::to_string((*gw)->port()) + "/v1 --api-key sk-test --model '" + served.front() + "' --seed " +
                            std::to_string(seed++) + " --count 4 --max-tokens 400 > \"" + out.string() + "\"";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    const json r = json::parse(f);
    ASSERT_TRUE(r.contains("cases")) << r.dump();
    EXPECT_EQ(r["cases"].size(), 10u);
    for (const auto& k : r["cases"])
      EXPECT_TRUE(k["valid"].get<bool>()) << k.dump();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::actors
