// GGUF-embedded tokenizers against the tokenizer.json they were made from: each case writes a GGUF the
// way llama.cpp's converter would (tokens, token types, merges or SentencePiece scores, special ids,
// tokenizer.ggml.pre, the chat template) from a real tokenizer.json, reads it back through text_codec,
// and requires the same ids and text as the tokenizer.json path on the whole corpus. A red test says
// which pre-tokenizer recipe or SentencePiece rule went wrong, with the string and both id lists.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <optional>
#include <ostream>

#include "engine/load/gguf.hpp"
#include "engine/text/gguf_tokenizer.hpp"
#include "engine/text/text_codec.hpp"
#include "tests/engine/text/tokenizer_parity_support.hpp"

namespace troupe::text::testing {
namespace {

struct gguf_case {
  std::string_view name;
  std::string_view model;  // tokenizer.ggml.model
  std::string_view pre;    // tokenizer.ggml.pre, for gpt2
  bool add_bos = false;
  bool add_space_prefix = true;  // for llama
};

constexpr gguf_case cases[] = {
    {"qwen3", "gpt2", "qwen2"},
    {"llama3", "gpt2", "llama-bpe"},
    {"llama3_1", "gpt2", "llama-bpe", true},
    {"deepseek_v3", "gpt2", "deepseek-v3"},
    {"gptoss", "gpt2", "gpt-4o"},
    {"llama2", "llama", "", true, true},
    {"gemma3", "llama", "", true, false},
    {"troupe-kjv", "gpt2", "llama-bpe", true},
};

// Names the case in test listings (ctest shows the parameter).
void PrintTo(const gguf_case& c, std::ostream* os) { *os << c.name; }

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return nlohmann::json::parse(in);
}

load::gguf_array string_array(const std::vector<std::string>& v) {
  load::gguf_array a{load::gguf_type::string, {}};
  a.reserve(v.size());
  for (const auto& s : v) a.emplace_back(s);
  return a;
}

// The GGUF llama.cpp's converter would write for this tokenizer.json.
std::filesystem::path write_gguf(const gguf_case& c, const text_codec& reference) {
  const auto tj = read_json(reference_tokenizer(c.name));
  const auto& model = tj["model"];
  std::map<token_id, std::string> by_id;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) by_id[it.value().get<token_id>()] = it.key();
  std::map<token_id, gguf_token_type> added_types;
  const std::string unk = model.contains("unk_token") && model["unk_token"].is_string() ? model["unk_token"].get<std::string>() : "";
  for (const auto& a : tj["added_tokens"]) {
    const auto id = a["id"].get<token_id>();
    by_id[id] = a["content"].get<std::string>();
    added_types[id] = a["content"] == unk         ? gguf_token_type::unknown
                      : a["special"].get<bool>() ? gguf_token_type::control
                                                 : gguf_token_type::user_defined;
  }
  const std::size_t n = static_cast<std::size_t>(by_id.rbegin()->first) + 1;
  std::vector<std::string> tokens(n);
  std::vector<std::int32_t> types(n, static_cast<std::int32_t>(gguf_token_type::normal));
  for (std::size_t i = 0; i < n; ++i) {
    const auto it = by_id.find(static_cast<token_id>(i));
    if (it == by_id.end()) {
      tokens[i] = "<troupe_unused_" + std::to_string(i) + ">";
      types[i] = static_cast<std::int32_t>(gguf_token_type::unused);
      continue;
    }
    tokens[i] = it->second;
    if (const auto t = added_types.find(it->first); t != added_types.end()) {
      types[i] = static_cast<std::int32_t>(t->second);
    } else if (c.model == "llama" && byte_token_value(tokens[i])) {
      types[i] = static_cast<std::int32_t>(gguf_token_type::byte);
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& m : model["merges"]) {
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const auto sp = s.find(' ');
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }

  load::gguf_writer w;
  w.add("general.architecture", "llama");
  w.add("tokenizer.ggml.model", std::string(c.model));
  w.add("tokenizer.ggml.tokens", string_array(tokens));
  load::gguf_array type_array{load::gguf_type::i32, {}};
  for (const auto t : types) type_array.emplace_back(t);
  w.add("tokenizer.ggml.token_type", std::move(type_array));
  if (c.model == "gpt2") {
    w.add("tokenizer.ggml.pre", std::string(c.pre));
    std::vector<std::string> lines;
    for (const auto& [a, b] : merges) lines.push_back(a + " " + b);
    w.add("tokenizer.ggml.merges", string_array(lines));
  } else {
    // SentencePiece scores that order pieces as the merges list does: the earlier a merge makes a
    // piece, the higher its score.
    std::vector<float> scores(n, -1e9f);
    std::map<std::string, std::size_t> vocab_index;
    for (std::size_t i = 0; i < n; ++i) vocab_index.emplace(tokens[i], i);
    for (std::size_t r = merges.size(); r-- > 0;) {
      const auto it = vocab_index.find(merges[r].first + merges[r].second);
      if (it != vocab_index.end()) scores[it->second] = -static_cast<float>(r);
    }
    load::gguf_array score_array{load::gguf_type::f32, {}};
    for (const auto s : scores) score_array.emplace_back(s);
    w.add("tokenizer.ggml.scores", std::move(score_array));
    w.add("tokenizer.ggml.add_space_prefix", c.add_space_prefix);
  }
  const auto& ids = reference.specials();
  if (ids.bos) w.add("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(*ids.bos));
  if (ids.eos) w.add("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(*ids.eos));
  if (ids.unk) w.add("tokenizer.ggml.unknown_token_id", static_cast<std::uint32_t>(*ids.unk));
  if (ids.pad) w.add("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(*ids.pad));
  w.add("tokenizer.ggml.add_bos_token", c.add_bos);
  w.add("tokenizer.ggml.add_eos_token", false);
  if (!reference.chat_template().empty()) w.add("tokenizer.chat_template", reference.chat_template());
  const auto path = scratch().path() / (std::string(c.name) + ".gguf");
  const auto ok = w.write(path);
  EXPECT_TRUE(ok) << ok.error().message();
  return path;
}

class gguf_tokenizer_parity : public ::testing::TestWithParam<gguf_case> {};

TEST_P(gguf_tokenizer_parity, equals_the_tokenizer_json_it_was_made_from) {
  const auto& c = GetParam();
  const auto json_path = reference_tokenizer(c.name);
  ASSERT_TRUE(std::filesystem::exists(json_path)) << json_path << " is missing: run scripts/install-references";
  auto reference = text_codec::open(json_path);
  ASSERT_TRUE(reference) << reference.error().message();
  const auto gguf_path = write_gguf(c, *reference);
  auto codec = text_codec::open(gguf_path);
  ASSERT_TRUE(codec) << codec.error().message();

  EXPECT_EQ(codec->chat_template(), reference->chat_template());
  EXPECT_EQ(codec->specials().bos, reference->specials().bos);
  EXPECT_EQ(codec->specials().eos, reference->specials().eos);
  if (reference->specials().eos) {
    EXPECT_TRUE(codec->specials().is_end(*reference->specials().eos));
  }

  std::size_t equal = 0, reported = 0;
  for (std::size_t i = 0; i < corpus().size(); ++i) {
    const std::string& s = corpus()[i];
    auto want = reference->encode(s, true);
    auto got = codec->encode(s, true);
    auto want_plain = reference->encode(s, false);
    auto got_plain = codec->encode(s, false);
    ASSERT_TRUE(want && got && want_plain && got_plain) << escaped(s);
    const bool same = *want == *got && *want_plain == *got_plain &&
                      reference->decode(*want_plain) == codec->decode(*got_plain) &&
                      reference->decode(*want, true) == codec->decode(*got, true);
    equal += same;
    if (!same && reported++ < 20)
      ADD_FAILURE() << c.name << " string " << i << ": " << escaped(s) << "\n  gguf           " << id_list(*got)
                    << "\n  tokenizer.json " << id_list(*want) << "\n  gguf text           "
                    << escaped(codec->decode(*got_plain)) << "\n  tokenizer.json text "
                    << escaped(reference->decode(*want_plain));
  }
  std::printf("gguf   %-12s %zu/%zu equal to tokenizer.json\n", std::string(c.name).c_str(), equal, corpus().size());
  EXPECT_EQ(equal, corpus().size());
}

INSTANTIATE_TEST_SUITE_P(reference, gguf_tokenizer_parity, ::testing::ValuesIn(cases),
                         [](const auto& info) {
                           auto n = std::string(info.param.name);
                           std::replace(n.begin(), n.end(), '-', '_');  // gtest names take no dashes
                           return n;
                         });

}  // namespace
}  // namespace troupe::text::testing
