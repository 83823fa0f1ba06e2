// BERT's pipeline on vocabularies small enough to work out by hand: WordPiece's greedy longest match,
// unknown words (a piece the vocabulary lacks, a word over max_input_chars_per_word), BertNormalizer's
// cleaning, CJK spacing, accent stripping and lowercasing, BertPreTokenizer, the [CLS] / [SEP]
// templates, the WordPiece decoder and its streaming form, and the errors a bad file gives.
#include <gtest/gtest.h>

#include "engine/text/detokenizer.hpp"
#include "engine/text/normalizer.hpp"
#include "engine/text/pre_tokenizer.hpp"
#include "tests/engine/text/text_test_support.hpp"

namespace troupe::text::testing {
namespace {

using ids = std::vector<token_id>;

struct bert_options {
  std::string normalizer = R"({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                               "strip_accents": null, "lowercase": true})";
  std::string model_extra = R"("max_input_chars_per_word": 100)";
  std::string decoder = R"({"type": "WordPiece", "prefix": "##", "cleanup": true})";
  std::string post_processor = R"({"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]})";
};

// [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4, then `tokens`.
std::string bert_json(const std::vector<std::string>& tokens, const bert_options& o = {}) {
  std::vector<std::string> all = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  all.insert(all.end(), tokens.begin(), tokens.end());
  std::string added = "[";
  for (std::size_t i = 0; i < 5; ++i) {
    if (i > 0) added += ",";
    added += R"({"id": )" + std::to_string(i) + R"(, "content": )" + json_string(all[i]) +
             R"(, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
  }
  added += "]";
  return R"({"added_tokens": )" + added + R"(, "normalizer": )" + o.normalizer +
         R"(, "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": )" + o.post_processor +
         R"(, "decoder": )" + o.decoder + R"(, "model": {"type": "WordPiece", "unk_token": "[UNK]",
         "continuing_subword_prefix": "##", )" +
         o.model_extra + R"(, "vocab": )" + vocab_json(all) + "}}";
}

constexpr token_id unk = 1, cls = 2, sep = 3;

// un=5 ##aff=6 ##able=7 una=8 ##ffa=9 ##ble=10 a=11 ##a=12 b=13 ##b=14 hello=15 ##s=16 ,=17 world=18
// .=19 é=20 ##é=21 cafe=22 café=23 中=24 文=25 do=26 n=27 '=28 t=29 not=30
const std::vector<std::string> small = {"un", "##aff", "##able", "una", "##ffa", "##ble", "a", "##a", "b",
                                        "##b", "hello", "##s", ",", "world", ".", "\xC3\xA9", "##\xC3\xA9",
                                        "cafe", "caf\xC3\xA9", "\xE4\xB8\xAD", "\xE6\x96\x87", "do", "n", "'",
                                        "t", "not"};

TEST(wordpiece_tokenizer, takes_the_longest_piece_first_not_the_best_split) {
  const auto c = codec_from(bert_json(small));
  // "una" is longer than "un", so the rest must start "##ffa"; "un ##aff ##able" is never tried.
  EXPECT_EQ(ids_of(c, "unaffable"), (ids{8, 9, 10}));
  EXPECT_EQ(ids_of(c, "aab"), (ids{11, 12, 14}));
  EXPECT_EQ(ids_of(c, "hellos"), (ids{15, 16}));
}

TEST(wordpiece_tokenizer, a_word_with_a_piece_the_vocabulary_lacks_is_one_unknown_token) {
  const auto c = codec_from(bert_json(small));
  // "un" matches, but nothing covers "x": the whole word goes, not just its tail.
  EXPECT_EQ(ids_of(c, "unx"), (ids{unk}));
  EXPECT_EQ(ids_of(c, "a unx b"), (ids{11, unk, 13}));
  // A character missing from the vocabulary, alone or inside a word.
  EXPECT_EQ(ids_of(c, "\xE2\x98\x83"), (ids{unk}));
  EXPECT_EQ(ids_of(c, "a\xE2\x98\x83" "b"), (ids{unk}));
  // Punctuation is split off first, so only its own word is unknown.
  EXPECT_EQ(ids_of(c, "hello!world"), (ids{15, unk, 18}));
}

TEST(wordpiece_tokenizer, counts_max_input_chars_per_word_in_characters) {
  bert_options o;
  o.model_extra = R"("max_input_chars_per_word": 4)";
  const auto c = codec_from(bert_json(small, o));
  EXPECT_EQ(ids_of(c, "aaaa"), (ids{11, 12, 12, 12}));
  EXPECT_EQ(ids_of(c, "aaaaa"), (ids{unk}));
  // Four characters of eight bytes are within the limit.
  bert_options cased = o;
  cased.normalizer = R"({"type": "BertNormalizer", "lowercase": false, "strip_accents": false})";
  const auto d = codec_from(bert_json(small, cased));
  EXPECT_EQ(ids_of(d, "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"), (ids{20, 21, 21, 21}));
  EXPECT_EQ(ids_of(d, "\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9"), (ids{unk}));
  // Zero: every word is unknown.
  bert_options zero;
  zero.model_extra = R"("max_input_chars_per_word": 0)";
  EXPECT_EQ(ids_of(codec_from(bert_json(small, zero)), "a b"), (ids{unk, unk}));
}

TEST(wordpiece_tokenizer, empty_text_gives_only_the_template) {
  const auto c = codec_from(bert_json(small));
  EXPECT_EQ(ids_of(c, ""), ids{});
  EXPECT_EQ(ids_of(c, "", true), (ids{cls, sep}));
  EXPECT_EQ(ids_of(c, " \t\n ", false), ids{});
  EXPECT_EQ(ids_of(c, "a", true), (ids{cls, 11, sep}));
  bert_options o;
  o.post_processor = R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                         "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}})";
  const auto t = codec_from(bert_json(small, o));
  EXPECT_EQ(ids_of(t, "", true), (ids{cls, sep}));
  EXPECT_EQ(ids_of(t, "a b", true), (ids{cls, 11, 13, sep}));
}

TEST(wordpiece_tokenizer, clean_text_drops_control_characters_and_maps_white_space) {
  const auto c = codec_from(bert_json(small));
  // NUL, U+0001, U+FFFD, a zero-width space (Cf) and a private-use character vanish inside the word.
  EXPECT_EQ(ids_of(c, std::string("a\0b", 3)), (ids{11, 14}));
  EXPECT_EQ(ids_of(c, "a\x01" "b"), (ids{11, 14}));
  EXPECT_EQ(ids_of(c, "a\xEF\xBF\xBD" "b"), (ids{11, 14}));
  EXPECT_EQ(ids_of(c, "a\xE2\x80\x8B" "b"), (ids{11, 14}));
  EXPECT_EQ(ids_of(c, "a\xEE\x80\x80" "b"), (ids{11, 14}));
  // Tab, newline, carriage return and no-break space separate words.
  EXPECT_EQ(ids_of(c, "a\tb\na\rb\xC2\xA0" "a"), (ids{11, 13, 11, 13, 11}));
  // Without clean_text the control character stays, and the word is unknown.
  bert_options o;
  o.normalizer = R"({"type": "BertNormalizer", "clean_text": false})";
  EXPECT_EQ(ids_of(codec_from(bert_json(small, o)), "a\x01" "b"), (ids{unk}));
}

TEST(wordpiece_tokenizer, bert_normalizer_spaces_cjk_strips_accents_and_lowercases) {
  const auto uncased = codec_from(bert_json(small));
  EXPECT_EQ(ids_of(uncased, "\xE4\xB8\xAD\xE6\x96\x87"), (ids{24, 25}));  // 中文: two words
  EXPECT_EQ(ids_of(uncased, "CAF\xC3\x89"), (ids{22}));                   // CAFÉ -> cafe
  EXPECT_EQ(ids_of(uncased, "Cafe\xCC\x81"), (ids{22}));                  // decomposed é too
  bert_options cased;
  cased.normalizer = R"({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": false,
                         "strip_accents": null, "lowercase": false})";
  const auto c = codec_from(bert_json(small, cased));
  EXPECT_EQ(ids_of(c, "caf\xC3\xA9"), (ids{23}));       // accents kept when not lowercasing
  EXPECT_EQ(ids_of(c, "CAFE"), (ids{unk}));
  EXPECT_EQ(ids_of(c, "\xE4\xB8\xAD\xE6\x96\x87"), (ids{unk}));  // one word, "##文" is not in the vocabulary
  bert_options keep;
  keep.normalizer = R"({"type": "BertNormalizer", "strip_accents": false, "lowercase": true})";
  EXPECT_EQ(ids_of(codec_from(bert_json(small, keep)), "CAF\xC3\x89"), (ids{23}));
}

TEST(wordpiece_tokenizer, decoder_joins_pieces_and_cleans_up_punctuation) {
  const auto c = codec_from(bert_json(small));
  EXPECT_EQ(c.decode(ids{15, 16, 17, 18, 19}, false), "hellos, world.");
  EXPECT_EQ(c.decode(ids{cls, 15, 18, sep}, false), "[CLS] hello world [SEP]");
  EXPECT_EQ(c.decode(ids{cls, 15, 18, sep}, true), "hello world");
  // A first token keeps its prefix, as Hugging Face's decoder leaves it.
  EXPECT_EQ(c.decode(ids{16, 15}, false), "##s hello");
  // Cleanup looks at one token at a time, as Hugging Face's does: " do not" spans two tokens here.
  EXPECT_EQ(c.decode(ids{15, 26, 30}, false), "hello do not");
  bert_options o;
  o.decoder = R"({"type": "WordPiece", "prefix": "##", "cleanup": false})";
  const auto raw = codec_from(bert_json(small, o));
  EXPECT_EQ(raw.decode(ids{15, 16, 17, 18, 19}, false), "hellos , world .");
}

TEST(wordpiece_tokenizer, unicode_categories_are_hugging_faces_not_utf8procs) {
  // Hugging Face's tables predate Unicode 14: U+0890 (Cf since 14) is kept by clean_text, U+2E52 (Po
  // since 13) is no punctuation, and U+166D (So since 12) still is. U+0085 (Cc) and U+200B (Cf) go.
  normalizer clean;
  clean.add(bert_normalizer{.clean_text = true, .handle_chinese_chars = false, .strip_accents = false,
                            .lowercase = false});
  EXPECT_EQ(clean.apply("a\xE0\xA2\x90" "b\xE2\x80\x8B" "c\xC2\x85" "d"), "a\xE0\xA2\x90" "bcd");
  pre_tokenizer bert;
  bert.add(whitespace_split_pre_tokenizer{});
  bert.add(punctuation_pre_tokenizer{split_behavior::isolated});
  word_list words;
  bert.apply("a\xE2\xB9\x92" "b a\xE1\x99\xAD" "b", true, words);
  ASSERT_EQ(words.size(), 4u);
  EXPECT_EQ(words[0], "a\xE2\xB9\x92" "b");
  EXPECT_EQ(words[2], "\xE1\x99\xAD");
  // StripAccents drops every combining mark (a Devanagari vowel sign is Mc); BertNormalizer only Mn.
  normalizer strip;
  strip.add(strip_accents_normalizer{});
  EXPECT_EQ(strip.apply("a\xE0\xA4\xBF" "b\xCC\x81" "c"), "abc");
  normalizer bert_strip;
  bert_strip.add(bert_normalizer{.clean_text = false, .handle_chinese_chars = false, .strip_accents = true,
                                 .lowercase = false});
  EXPECT_EQ(bert_strip.apply("a\xE0\xA4\xBF" "b\xCC\x81" "c"), "a\xE0\xA4\xBF" "bc");
}

std::string streamed(const text_codec& c, const ids& in, bool skip) {
  detokenizer d(c, {.skip_special = skip, .stop = {}});
  std::string out;
  for (const auto id : in) out += d.push(id).text;
  return out + d.finish().text;
}

TEST(wordpiece_tokenizer, streaming_gives_the_batch_decode) {
  for (const bool cleanup : {true, false}) {
    bert_options o;
    o.decoder = std::string(R"({"type": "WordPiece", "cleanup": )") + (cleanup ? "true" : "false") + "}";
    const auto c = codec_from(bert_json(small, o));
    for (const ids& in : {ids{15, 16, 17, 18, 19}, ids{cls, 15, 18, sep}, ids{16, 15, 26, 30, 28, 29}, ids{}}) {
      EXPECT_EQ(streamed(c, in, false), c.decode(in, false));
      EXPECT_EQ(streamed(c, in, true), c.decode(in, true));
    }
  }
}

TEST(wordpiece_tokenizer, bad_files_are_errors_naming_the_field) {
  // The unknown token must be in the vocabulary.
  auto no_unk = parse_tokenizer_json(R"({"model": {"type": "WordPiece", "unk_token": "[X]", "vocab": {"a": 0}}})");
  ASSERT_FALSE(no_unk);
  EXPECT_EQ(no_unk.error().code, text_error_code::unknown_token);
  EXPECT_EQ(no_unk.error().field, "model.vocab");
  auto negative = parse_tokenizer_json(
      R"({"model": {"type": "WordPiece", "max_input_chars_per_word": -1, "vocab": {"[UNK]": 0}}})");
  ASSERT_FALSE(negative);
  EXPECT_EQ(negative.error().code, text_error_code::bad_value);
  EXPECT_EQ(negative.error().field, "model.max_input_chars_per_word");
  auto bad_flag = parse_tokenizer_json(R"({"normalizer": {"type": "BertNormalizer", "lowercase": "yes"},
      "model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}})");
  ASSERT_FALSE(bad_flag);
  EXPECT_EQ(bad_flag.error().code, text_error_code::bad_json);
  EXPECT_EQ(bad_flag.error().field, "normalizer.lowercase");
  auto bad_vocab = parse_tokenizer_json(R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": "zero"}}})");
  ASSERT_FALSE(bad_vocab);
  EXPECT_EQ(bad_vocab.error().code, text_error_code::bad_json);
}

TEST(wordpiece_tokenizer, fields_left_out_take_hugging_faces_defaults) {
  // Hugging Face's reader wants every field; troupe takes its builders' defaults for those left out:
  // [UNK], "##" and 100 characters, and a decoder prefix of "##".
  const auto c = codec_from(R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1, "##a": 2}},
      "pre_tokenizer": {"type": "BertPreTokenizer"}, "decoder": {"type": "WordPiece"}})");
  EXPECT_EQ(ids_of(c, "aaa b"), (ids{1, 2, 2, 0}));
  EXPECT_EQ(ids_of(c, std::string(100, 'a')).size(), 100u);
  EXPECT_EQ(ids_of(c, std::string(101, 'a')), (ids{0}));
  EXPECT_EQ(c.decode(ids{1, 2, 1}, false), "aa a");
  EXPECT_EQ(c.tokens().parts().model.unk_token(), std::optional<std::string_view>("[UNK]"));
}

}  // namespace
}  // namespace troupe::text::testing
