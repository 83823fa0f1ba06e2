// Token masks: a vocabulary's trie walked through a guide's automaton gives exactly the tokens whose
// bytes keep the output a viable prefix (checked against a brute-force judge of every token), end of
// generation only where the grammar accepts, multi-byte characters split over tokens, the first token's
// own spelling, rollback, caching, and the spec kinds (choice, grammar, regex, json).
#include <gtest/gtest.h>

#include <random>

#include "engine/guide/guide.hpp"
#include "engine/guide/tool_calls.hpp"

namespace troupe::guide {
namespace {

constexpr std::int32_t eos = 1;

// A vocabulary of single bytes, some words, multi-byte pieces and split characters; id 0 is special.
std::shared_ptr<const vocabulary> test_vocab(std::vector<std::pair<std::int32_t, std::string>> first = {}) {
  std::vector<std::optional<std::string>> p = {std::nullopt, std::nullopt};  // 0: special, 1: eos
  for (int c = 0x20; c < 0x7F; ++c) p.emplace_back(std::string(1, static_cast<char>(c)));
  for (const char* w : {"{\"", "\":", "\"}", "true", "false", "null", " \"", "\",", "12", "345", ", ", "yes", "no",
                        "\xC3\xA9", "\xC3", "\xA9t\xC3\xA9", "\xE2\x82\xAC", "\n", "\n  ", "ab", "abc", "a\"b"})
    p.emplace_back(std::string(w));
  p.emplace_back(std::string());  // an empty piece: never allowed
  return std::make_shared<const vocabulary>(p.size() + 3, std::move(p), std::move(first), std::vector<std::int32_t>{eos});
}

std::shared_ptr<guide> make(const guide_spec& spec, std::shared_ptr<const vocabulary> v) {
  auto g = compile(spec);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message());
  return std::make_shared<guide>(*g, std::move(v));
}

bool allowed(const std::vector<std::uint32_t>& m, std::int32_t id) { return (m[static_cast<std::size_t>(id) >> 5] >> (id & 31)) & 1u; }

std::string text_of(const vocabulary& v, std::span<const std::int32_t> out) {
  std::string s;
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::string* f = k == 0 ? v.first_piece(out[k]) : nullptr;
    s += f ? *f : *v.piece(out[k]);
  }
  return s;
}

// Every token judged on its own by the grammar's viable_prefix / matches.
void expect_mask_is_exact(const grammar& g, const vocabulary& v, std::span<const std::int32_t> out, const std::vector<std::uint32_t>& m) {
  const auto prefix = text_of(v, out);
  std::vector<bool> want(v.size(), false);
  bool any = false;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.size()); ++id) {
    if (v.is_eos(id)) {
      want[id] = matches(g, prefix);
    } else if (v.piece(id) && !v.piece(id)->empty()) {
      const std::string* f = out.empty() ? v.first_piece(id) : nullptr;
      const std::string& bytes = f ? *f : *v.piece(id);
      want[id] = !bytes.empty() && viable_prefix(g, prefix + bytes);
    }
    any = any || want[id];
  }
  if (!any)
    for (auto id : v.eos()) want[id] = true;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.size()); ++id)
    EXPECT_EQ(allowed(m, id), want[id]) << "token " << id << " after '" << prefix << "'";
}

TEST(guide_mask, equals_a_brute_force_judge_along_random_walks) {
  auto v = test_vocab();
  const guide_spec spec{guide_kind::grammar,
                        "root ::= \"{\" ws pair (\",\" ws pair)* ws \"}\"\n"
                        "pair ::= \"\\\"\" [a-z\\u00e9]+ \"\\\":\" ws (\"true\" | \"false\" | \"null\" | [0-9]+ | \"\\\"\" [^\"]* \"\\\"\")\n"
                        "ws ::= | \" \" | \"\\n\" \" \"{0,2}\n"};
  auto gr = compile(spec);
  ASSERT_TRUE(gr.has_value()) << gr.error().message();
  auto g = std::make_shared<guide>(*gr, v);
  std::mt19937 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 30; ++walk) {
    guide::cursor c;
    std::vector<std::int32_t> out;
    for (int step = 0; step < 40; ++step) {
      std::vector<std::uint32_t> m(v->words(), 0u);
      g->fill_mask(c, out, m);
      expect_mask_is_exact(**gr, *v, out, m);
      std::vector<std::int32_t> ok;
      for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id)
        if (allowed(m, id)) ok.push_back(id);
      ASSERT_FALSE(ok.empty());
      const auto pick = ok[std::uniform_int_distribution<std::size_t>(0, ok.size() - 1)(rng)];
      if (pick == eos) {
        EXPECT_TRUE(g->accepts(out));
        EXPECT_TRUE(matches(**gr, text_of(*v, out)));
        ++finished;
        break;
      }
      out.push_back(pick);
    }
  }
  EXPECT_GT(finished, 0);
  EXPECT_GT(g->stats().mask_hits, 0);  // states repeat: cached masks were used
}

TEST(guide_mask, end_of_generation_only_where_the_grammar_accepts) {
  auto v = test_vocab();
  auto g = make({guide_kind::choice, R"(["yes", "no", "yes!"])"}, v);
  guide::cursor c;
  std::vector<std::uint32_t> m(v->words(), 0u);
  g->fill_mask(c, {}, m);
  EXPECT_FALSE(allowed(m, eos));
  const std::int32_t y = 2 + ('y' - 0x20), ex = 2 + ('!' - 0x20), n = 2 + ('n' - 0x20), q = 2 + ('q' - 0x20);
  EXPECT_TRUE(allowed(m, y));
  EXPECT_TRUE(allowed(m, n));
  EXPECT_FALSE(allowed(m, q));
  EXPECT_FALSE(allowed(m, 0));  // special
  std::vector<std::int32_t> out = {y, 2 + ('e' - 0x20), 2 + ('s' - 0x20)};
  m.assign(v->words(), 0u);
  g->fill_mask(c, out, m);
  EXPECT_TRUE(allowed(m, eos));
  EXPECT_TRUE(allowed(m, ex));
  out.push_back(ex);
  m.assign(v->words(), 0u);
  g->fill_mask(c, out, m);
  // Complete with nothing to follow: only the end.
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id) EXPECT_EQ(allowed(m, id), id == eos) << id;
}

TEST(guide_mask, characters_split_over_tokens_and_rollback) {
  auto v = test_vocab();
  auto g = make({guide_kind::grammar, "root ::= \"\\u00e9t\\u00e9\" | \"\\u20ac\""}, v);
  guide::cursor c;
  std::vector<std::uint32_t> m(v->words(), 0u);
  g->fill_mask(c, {}, m);
  std::int32_t half = -1, rest = -1, whole = -1, euro = -1;
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id) {
    if (v->piece(id) == std::optional<std::string>("\xC3")) half = id;
    if (v->piece(id) == std::optional<std::string>("\xA9t\xC3\xA9")) rest = id;
    if (v->piece(id) == std::optional<std::string>("\xC3\xA9")) whole = id;
    if (v->piece(id) == std::optional<std::string>("\xE2\x82\xAC")) euro = id;
  }
  EXPECT_TRUE(allowed(m, half));
  EXPECT_TRUE(allowed(m, whole));
  EXPECT_TRUE(allowed(m, euro));
  EXPECT_FALSE(allowed(m, rest));
  std::vector<std::int32_t> out = {half};
  m.assign(v->words(), 0u);
  g->fill_mask(c, out, m);
  EXPECT_TRUE(allowed(m, rest));
  EXPECT_FALSE(allowed(m, whole));
  out.push_back(rest);
  EXPECT_TRUE(g->accepts(out));
  // A shorter output (a preempted sequence recomputed, a rolled-back draft) restarts the cursor.
  std::vector<std::int32_t> other = {euro};
  m.assign(v->words(), 0u);
  g->fill_mask(c, other, m);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id) EXPECT_EQ(allowed(m, id), id == eos);
}

TEST(guide_mask, the_first_token_is_judged_by_its_start_of_text_spelling) {
  // A SentencePiece-like decoder: "▁yes" is " yes" mid-text, "yes" as the first token.
  const std::int32_t first_id = 2 + 95 + 6;  // the " \"" piece: '"' at the start of a text
  auto v = test_vocab({{first_id, "\""}});
  auto g = make({guide_kind::grammar, R"(root ::= "\"" [a-z]* "\"")"}, v);
  guide::cursor c;
  std::vector<std::uint32_t> m(v->words(), 0u);
  g->fill_mask(c, {}, m);
  EXPECT_TRUE(allowed(m, first_id));
  std::vector<std::int32_t> out = {first_id, 2 + ('a' - 0x20), 2 + ('"' - 0x20)};
  EXPECT_TRUE(g->accepts(out));
  // Mid-text the same token is ' "' and does not fit.
  std::vector<std::int32_t> mid = {2 + ('"' - 0x20)};
  m.assign(v->words(), 0u);
  g->fill_mask(c, mid, m);
  EXPECT_FALSE(allowed(m, first_id));
}

TEST(guide_mask, a_dead_output_ends_instead_of_drawing_from_nothing) {
  auto v = test_vocab();
  auto g = make({guide_kind::choice, R"(["ab"])"}, v);
  guide::cursor c;
  std::vector<std::uint32_t> m(v->words(), 0u);
  std::vector<std::int32_t> out = {2 + ('z' - 0x20)};  // resumed output the guide never allowed
  g->fill_mask(c, out, m);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id) EXPECT_EQ(allowed(m, id), id == eos);
}

TEST(guide_spec, kinds_compile_and_refuse_by_name) {
  EXPECT_TRUE(compile({guide_kind::choice, R"(["a", "b"])"}).has_value());
  EXPECT_FALSE(compile({guide_kind::choice, R"([])"}).has_value());
  EXPECT_FALSE(compile({guide_kind::choice, R"(["a", 2])"}).has_value());
  EXPECT_FALSE(compile({guide_kind::none, ""}).has_value());
  auto bad = compile({guide_kind::grammar, "root ::= nope"});
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, guide_error_code::undefined_rule);
  auto j = compile({guide_kind::json_object, ""});
  ASSERT_TRUE(j.has_value());
  EXPECT_TRUE(matches(**j, R"({"a": [1, {"b": null}]})"));
  EXPECT_FALSE(matches(**j, R"([1])"));
  auto r = compile({guide_kind::regex, R"(\d{3}-[A-Z]+)"});
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_TRUE(matches(**r, "123-ABC"));
  EXPECT_FALSE(matches(**r, "12-ABC"));
  auto s = compile({guide_kind::json_schema, R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})"});
  ASSERT_TRUE(s.has_value()) << s.error().message();
  EXPECT_TRUE(matches(**s, R"({"n": 42})"));
  EXPECT_FALSE(matches(**s, R"({"n": 4.2})"));
}

TEST(guide_cache, compiles_once_per_spec) {
  guide_cache cache(test_vocab(), 2);
  std::weak_ptr<guide> first;
  {
    auto a = cache.get({guide_kind::choice, R"(["a"])"});
    auto b = cache.get({guide_kind::choice, R"(["a"])"});
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->get(), b->get());
    first = *a;
  }
  ASSERT_TRUE(cache.get({guide_kind::choice, R"(["b"])"}));
  ASSERT_TRUE(cache.get({guide_kind::choice, R"(["c"])"}));
  EXPECT_TRUE(first.expired());  // evicted past the capacity (no sequence held it)
  EXPECT_TRUE(cache.get({guide_kind::choice, R"(["a"])"}));
  EXPECT_FALSE(cache.get({guide_kind::grammar, "root ::= \"a"}).has_value());

  // A guide a sequence holds stays; bytes bound the rest: under a 1-byte budget only the newest and
  // the held ones remain.
  guide_cache small(test_vocab(), 8, 1);
  auto held = small.get({guide_kind::choice, R"(["held"])"});
  ASSERT_TRUE(held);
  for (const char* c : {R"(["x"])", R"(["y"])", R"(["z"])"}) ASSERT_TRUE(small.get({guide_kind::choice, c}));
  EXPECT_EQ(small.size(), 2u);  // "held" (in use) and "z" (the newest)
  auto again_held = small.get({guide_kind::choice, R"(["held"])"});
  ASSERT_TRUE(again_held);
  EXPECT_EQ(again_held->get(), held->get());
}

}  // namespace
}  // namespace troupe::guide

namespace troupe::guide {
namespace {

// Forced tool calls: the grammar of each format accepts calls of the offered tools with valid
// arguments, and nothing else; the format follows the chat template.
TEST(tool_calls, grammars_in_each_format_accept_only_valid_calls) {
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
      {"type": "function", "function": {"name": "now"}}])";
  const std::string call = R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})";
  const std::string other = R"({"name": "now", "arguments": {}})";
  auto grammar_of = [&](std::string_view only, tool_call_format f, bool parallel = true) {
    auto g = tool_call_gbnf(tools, only, f, parallel);
    EXPECT_TRUE(g) << g.error().message();
    auto parsed = parse_gbnf(*g);
    EXPECT_TRUE(parsed) << parsed.error().message() << "\n" << *g;
    return *parsed;
  };
  auto hermes = grammar_of("", tool_call_format::hermes);
  EXPECT_TRUE(matches(hermes, "<tool_call>\n" + call + "\n</tool_call>"));
  EXPECT_TRUE(matches(hermes, "<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + other + "\n</tool_call>"));
  EXPECT_FALSE(matches(hermes, "<tool_call>\n" + std::string(R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "k"}})") + "\n</tool_call>"));
  EXPECT_FALSE(matches(hermes, "<tool_call>\n" + std::string(R"({"name": "nope", "arguments": {}})") + "\n</tool_call>"));
  EXPECT_FALSE(matches(hermes, call));
  auto one = grammar_of("", tool_call_format::hermes, false);
  EXPECT_FALSE(matches(one, "<tool_call>\n" + call + "\n</tool_call>\n<tool_call>\n" + other + "\n</tool_call>"));
  auto named = grammar_of("now", tool_call_format::json);
  EXPECT_TRUE(matches(named, "[" + other + "]"));
  EXPECT_FALSE(matches(named, "[" + call + "]"));
  auto mistral = grammar_of("", tool_call_format::mistral);
  EXPECT_TRUE(matches(mistral, "[TOOL_CALLS][" + call + ", " + other + "]"));
  auto llama = grammar_of("", tool_call_format::llama3);
  EXPECT_TRUE(matches(llama, R"({"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f"}})"));
  EXPECT_FALSE(matches(llama, call));  // Llama 3 names them "parameters"

  // DeepSeek V3: name and arguments apart, each tool's argument grammar under its own prefix.
  auto deepseek = grammar_of("", tool_call_format::deepseek);
  const std::string ds_all = "<｜tool▁calls▁begin｜>",
                    ds_end_all = "<｜tool▁calls▁end｜>",
                    ds_begin = "<｜tool▁call▁begin｜>",
                    ds_sep = "<｜tool▁sep｜>",
                    ds_end = "<｜tool▁call▁end｜>";
  const std::string ds_call = ds_begin + "function" + ds_sep + "get_weather\n```json\n{\"city\": \"Rome\", \"unit\": \"f\"}\n```" + ds_end;
  const std::string ds_now = ds_begin + "function" + ds_sep + "now\n```json\n{}\n```" + ds_end;
  EXPECT_TRUE(matches(deepseek, ds_all + ds_call + ds_end_all));
  EXPECT_TRUE(matches(deepseek, ds_all + ds_call + "\n" + ds_now + ds_end_all));
  EXPECT_FALSE(matches(deepseek, ds_all + ds_begin + "function" + ds_sep + "get_weather\n```json\n{\"city\": \"x\", \"unit\": \"k\"}\n```" + ds_end + ds_end_all));
  EXPECT_FALSE(matches(deepseek, ds_all + ds_begin + "function" + ds_sep + "nope\n```json\n{}\n```" + ds_end + ds_end_all));
  EXPECT_EQ(tool_call_format_of("{{'<｜tool▁calls▁begin｜>'}}"), tool_call_format::deepseek);
  EXPECT_EQ(tool_call_format_of("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}"), tool_call_format::hermes);
  EXPECT_EQ(tool_call_format_of("[TOOL_CALLS]"), tool_call_format::mistral);
  EXPECT_EQ(tool_call_format_of("<|start_header_id|>ipython<|end_header_id|>"), tool_call_format::llama3);
  EXPECT_EQ(tool_call_format_of(""), tool_call_format::json);
  EXPECT_FALSE(tool_call_gbnf(tools, "missing", tool_call_format::json));
  EXPECT_FALSE(tool_call_gbnf("[]", "", tool_call_format::json));
  EXPECT_FALSE(tool_call_gbnf(R"([{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}])", "", tool_call_format::json));
  EXPECT_EQ(rename_rule("root ::= \"root\" [root] root-x root # root\nx ::= root", "root", "r"), "r ::= \"root\" [root] root-x r # root\nx ::= r");
  EXPECT_EQ(rename_rule("root ::= \"a\" x{2,3}\nx ::= [x]", "", "p-"), "p-root ::= \"a\" p-x{2,3}\np-x ::= [x]");
}

}  // namespace
}  // namespace troupe::guide

namespace troupe::guide {
namespace {

// A budget of tokens: whatever the draws, the output completes within it whenever any completion fits
// (random walks that never end by choice, only when the mask leaves the end alone).
TEST(guide_mask, a_budget_makes_the_output_complete_within_max_tokens) {
  auto v = test_vocab();
  auto g = compile({guide_kind::grammar,
                    "root ::= \"{\" ws \"\\\"k\\\":\" ws \"[\" (item (\",\" ws item)*)? \"]\" ws \"}\"\n"
                    "item ::= \"\\\"\" [a-z\\u00e9]* \"\\\"\" | [0-9]+ | root\n"
                    "ws ::= | \" \" | \"\\n\" \" \"{0,4}\n"});
  ASSERT_TRUE(g) << g.error().message();
  auto gd = std::make_shared<guide>(*g, v);
  std::mt19937 rng(3);
  for (std::int64_t budget : {9, 10, 12, 16, 25, 40}) {
    for (int walk = 0; walk < 25; ++walk) {
      guide::cursor c;
      std::vector<std::int32_t> out;
      bool ended = false;
      while (static_cast<std::int64_t>(out.size()) < budget) {
        std::vector<std::uint32_t> m(v->words(), 0u);
        gd->fill_mask(c, out, m, budget - static_cast<std::int64_t>(out.size()));
        std::vector<std::int32_t> ok;
        for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id)
          if (allowed(m, id) && id != eos) ok.push_back(id);
        if (ok.empty()) {
          ASSERT_TRUE(allowed(m, eos));
          ended = true;
          break;
        }
        out.push_back(ok[rng() % ok.size()]);
      }
      EXPECT_TRUE(gd->accepts(out)) << "budget " << budget << ": '" << text_of(*v, out) << "'";
      EXPECT_LE(static_cast<std::int64_t>(out.size()), budget);
      (void)ended;
    }
  }
  // Without a budget the same walks run on past any length (nothing forces the end).
  guide::cursor c;
  std::vector<std::int32_t> out;
  for (int k = 0; k < 60; ++k) {
    std::vector<std::uint32_t> m(v->words(), 0u);
    gd->fill_mask(c, out, m);
    std::vector<std::int32_t> ok;
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(v->size()); ++id)
      if (allowed(m, id) && id != eos) ok.push_back(id);
    ASSERT_FALSE(ok.empty());
    out.push_back(ok[rng() % ok.size()]);
  }
}

}  // namespace
}  // namespace troupe::guide
