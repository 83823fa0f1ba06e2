// Byte-exact parity with Hugging Face's tokenizers for BERT's pipeline (BertNormalizer, BertPreTokenizer,
// WordPiece, BertProcessing / TemplateProcessing, the WordPiece decoder) on the 3,000-string corpus. No
// BERT tokenizer.json ships with the references, so each variant writes its own: a vocabulary made from
// the corpus as that variant normalizes and splits it (the special tokens, every character alone and
// in its "##" form but a few left out so that words go unknown, the frequent words and word pieces),
// with the switches the uncased, cased and multilingual BERT files use and a few they do not.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/text/normalizer.hpp"
#include "engine/text/pre_tokenizer.hpp"
#include "tests/engine/text/tokenizer_parity_support.hpp"

namespace troupe::text::testing {
namespace {

using json = nlohmann::json;

struct variant {
  std::string_view name;
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents;  // null in the file when unset
  bool lowercase = true;
  std::size_t max_input_chars_per_word = 100;
  bool template_processing = true;  // else BertProcessing
  bool cleanup = true;
};

const variant variants[] = {
    // bert-base-uncased
    {.name = "uncased"},
    // bert-base-cased and bert-base-multilingual-cased
    {.name = "cased", .lowercase = false, .template_processing = false},
    // accents stripped without lowercasing, no CJK spacing, short words only, no decoder cleanup
    {.name = "cased_strip_accents",
     .handle_chinese_chars = false,
     .strip_accents = true,
     .lowercase = false,
     .max_input_chars_per_word = 8,
     .cleanup = false},
    // lowercased with accents kept, BertProcessing
    {.name = "uncased_keep_accents", .strip_accents = false, .template_processing = false},
    // control characters and odd White_Space left in
    {.name = "uncased_unclean", .clean_text = false},
};

const std::vector<std::string> specials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

// The words of the corpus as `v` normalizes and pre-tokenizes it.
std::vector<std::string> corpus_words(const variant& v) {
  normalizer norm;
  norm.add(bert_normalizer{v.clean_text, v.handle_chinese_chars, v.strip_accents, v.lowercase});
  pre_tokenizer pre;
  pre.add(whitespace_split_pre_tokenizer{});
  pre.add(punctuation_pre_tokenizer{split_behavior::isolated});
  std::vector<std::string> words;
  word_list list;
  for (const auto& s : corpus()) {
    pre.apply(norm.apply(s), true, list);
    for (std::size_t i = 0; i < list.size(); ++i) words.emplace_back(list[i]);
  }
  return words;
}

// The characters of a UTF-8 word.
std::vector<std::string> chars_of(std::string_view w) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < w.size();) {
    std::size_t n = 1;
    while (i + n < w.size() && (static_cast<unsigned char>(w[i + n]) & 0xC0) == 0x80) ++n;
    out.emplace_back(w.substr(i, n));
    i += n;
  }
  return out;
}

// The `n` most frequent keys, most frequent first and in byte order among equals.
std::vector<std::string> most_frequent(const std::map<std::string, std::size_t>& counts, std::size_t n,
                                       std::size_t at_least) {
  std::vector<std::pair<std::size_t, std::string>> v;
  for (const auto& [k, c] : counts)
    if (c >= at_least) v.emplace_back(c, k);
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size() && i < n; ++i) out.push_back(v[i].second);
  return out;
}

// Ids in order: the special tokens, the characters (each alone and with "##"; every eleventh
// character of the sorted set left out, so some words go unknown), the frequent words, then the
// frequent word beginnings (2-4 characters) and "##" continuations (2-3 characters).
std::vector<std::string> make_vocab(const variant& v) {
  const auto words = corpus_words(v);
  std::set<std::string> chars;
  std::map<std::string, std::size_t> whole, starts, continuations;
  for (const auto& w : words) {
    const auto cs = chars_of(w);
    chars.insert(cs.begin(), cs.end());
    if (cs.size() > 1) ++whole[w];
    for (std::size_t len = 2; len <= 4 && len < cs.size(); ++len) {
      std::string s;
      for (std::size_t k = 0; k < len; ++k) s += cs[k];
      ++starts[s];
    }
    for (std::size_t at = 1; at < cs.size(); ++at)
      for (std::size_t len = 2; len <= 3 && at + len <= cs.size(); ++len) {
        std::string s = "##";
        for (std::size_t k = at; k < at + len; ++k) s += cs[k];
        ++continuations[s];
      }
  }
  std::vector<std::string> vocab = specials;
  std::set<std::string> seen(vocab.begin(), vocab.end());
  const auto add = [&](const std::string& t) {
    if (seen.insert(t).second) vocab.push_back(t);
  };
  std::size_t k = 0;
  for (const auto& c : chars) {
    if (k++ % 11 == 7) continue;
    add(c);
    add("##" + c);
  }
  for (const auto& w : most_frequent(whole, 2000, 2)) add(w);
  for (const auto& w : most_frequent(starts, 800, 3)) add(w);
  for (const auto& w : most_frequent(continuations, 800, 3)) add(w);
  return vocab;
}

// The tokenizer.json Hugging Face writes for a BERT tokenizer, with `v`'s switches.
json make_tokenizer_json(const variant& v) {
  const auto vocab = make_vocab(v);
  json doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  json added = json::array();
  for (std::size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", i}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  doc["added_tokens"] = added;
  doc["normalizer"] = {{"type", "BertNormalizer"},
                       {"clean_text", v.clean_text},
                       {"handle_chinese_chars", v.handle_chinese_chars},
                       {"strip_accents", v.strip_accents ? json(*v.strip_accents) : json(nullptr)},
                       {"lowercase", v.lowercase}};
  doc["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  const auto id = [&](std::string_view t) {
    return static_cast<int>(std::find(specials.begin(), specials.end(), t) - specials.begin());
  };
  if (v.template_processing) {
    const auto special = [&](std::string_view t, int type) {
      return json{{"SpecialToken", {{"id", t}, {"type_id", type}}}};
    };
    const auto sequence = [](std::string_view s, int type) { return json{{"Sequence", {{"id", s}, {"type_id", type}}}}; };
    doc["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)}},
        {"pair",
         {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0), sequence("B", 1), special("[SEP]", 1)}},
        {"special_tokens",
         {{"[CLS]", {{"id", "[CLS]"}, {"ids", {id("[CLS]")}}, {"tokens", {"[CLS]"}}}},
          {"[SEP]", {{"id", "[SEP]"}, {"ids", {id("[SEP]")}}, {"tokens", {"[SEP]"}}}}}}};
  } else {
    doc["post_processor"] = {{"type", "BertProcessing"},
                             {"sep", {"[SEP]", id("[SEP]")}},
                             {"cls", {"[CLS]", id("[CLS]")}}};
  }
  doc["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", v.cleanup}};
  json model_vocab = json::object();
  for (std::size_t i = 0; i < vocab.size(); ++i) model_vocab[vocab[i]] = i;
  doc["model"] = {{"type", "WordPiece"},
                  {"unk_token", "[UNK]"},
                  {"continuing_subword_prefix", "##"},
                  {"max_input_chars_per_word", v.max_input_chars_per_word},
                  {"vocab", model_vocab}};
  return doc;
}

// So that gtest names a variant instead of printing its bytes.
void PrintTo(const variant& v, std::ostream* os) { *os << v.name; }

class wordpiece_tokenizer_parity : public ::testing::TestWithParam<variant> {};

TEST_P(wordpiece_tokenizer_parity, ids_and_text_equal_hugging_face_on_the_corpus) {
  const variant& v = GetParam();
  const std::string name = "wordpiece-" + std::string(v.name);
  const auto path = scratch().path() / (name + ".json");
  {
    std::ofstream out(path, std::ios::binary);
    out << make_tokenizer_json(v).dump();
  }
  const auto rows = run_reference(path, name);
  ASSERT_EQ(rows.size(), corpus().size()) << "the reference script failed for " << name;
  auto codec = text_codec::open(path);
  ASSERT_TRUE(codec) << codec.error().message();
  const token_id unk = *codec->tokens().token_to_id("[UNK]");

  std::size_t ids_equal = 0, plain_equal = 0, text_equal = 0, skip_equal = 0, stream_equal = 0, unknown = 0,
              reported = 0;
  for (std::size_t i = 0; i < corpus().size(); ++i) {
    const std::string& s = corpus()[i];
    const auto& ref = rows[i];
    auto ids = codec->encode(s, true);
    auto plain = codec->encode(s, false);
    ASSERT_TRUE(ids && plain) << escaped(s);
    const bool ok_ids = *ids == ref.ids, ok_plain = *plain == ref.plain;
    ids_equal += ok_ids;
    plain_equal += ok_plain;
    unknown += std::count(ref.plain.begin(), ref.plain.end(), unk) > 0;
    const std::string text = codec->decode(*plain, false);
    const std::string text_skip = codec->decode(*ids, true);
    text_equal += text == ref.text;
    skip_equal += text_skip == ref.text_skip;
    stream_equal += stream(*codec, *plain, false) == text && stream(*codec, *ids, true) == text_skip;
    if ((!ok_ids || !ok_plain || text != ref.text || text_skip != ref.text_skip) && reported++ < 20) {
      ADD_FAILURE() << name << " string " << i << ": " << escaped(s) << "\n  troupe    " << id_list(*ids)
                    << "\n  reference " << id_list(ref.ids) << "\n  troupe plain    " << id_list(*plain)
                    << "\n  reference plain " << id_list(ref.plain) << "\n  troupe text    " << escaped(text)
                    << "\n  reference text " << escaped(ref.text) << "\n  troupe skip    " << escaped(text_skip)
                    << "\n  reference skip " << escaped(ref.text_skip);
    }
  }
  const std::size_t n = corpus().size();
  std::printf("parity %-32s ids %zu/%zu  plain %zu/%zu  decode %zu/%zu  decode(skip) %zu/%zu  stream %zu/%zu  "
              "(%zu strings with [UNK])\n",
              name.c_str(), ids_equal, n, plain_equal, n, text_equal, n, skip_equal, n, stream_equal, n, unknown);
  EXPECT_EQ(ids_equal, n);
  EXPECT_EQ(plain_equal, n);
  EXPECT_EQ(text_equal, n);
  EXPECT_EQ(skip_equal, n);
  EXPECT_EQ(stream_equal, n);
  // The vocabulary leaves characters out on purpose: unknown words must be part of what is compared.
  EXPECT_GT(unknown, n / 50);
}

INSTANTIATE_TEST_SUITE_P(generated, wordpiece_tokenizer_parity, ::testing::ValuesIn(variants),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace troupe::text::testing
