// The tokenizer pipeline on tokenizers small enough to work out by hand: merge order, both merge
// formats, ignore_merges, byte fallback and unknown tokens, added tokens with their strip and
// single-word rules, normalizers, pre-tokenizer behaviours, post-processor templates and decoders.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "engine/text/detail/regex.hpp"
#include "tests/engine/text/text_test_support.hpp"

namespace troupe::text::testing {
namespace {

using ids = std::vector<token_id>;

// a b c d, their merges, and a word the merges cannot reach.
std::string abcd(std::string_view merges, bool ignore_merges = false) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "ab": 4, "bc": 5, "abc": 6,
             "cd": 7, "abcd": 8, "dd": 9, "ddd": 10}, "merges": )" +
         std::string(merges) + R"(, "ignore_merges": )" + (ignore_merges ? "true" : "false") + "}}";
}

TEST(bpe, merges_the_lowest_ranked_pair_first) {
  // "a b" outranks "b c", so "abc" becomes ab+c and then abc.
  const auto c = codec_from(abcd(R"(["a b", "b c", "ab c", "c d", "abc d"])"));
  EXPECT_EQ(ids_of(c, "abc"), (ids{6}));
  EXPECT_EQ(ids_of(c, "abcd"), (ids{8}));
  // With "b c" first there is no merge of a with bc: the word stops at a + bc.
  const auto d = codec_from(abcd(R"(["b c", "a b", "ab c"])"));
  EXPECT_EQ(ids_of(d, "abc"), (ids{0, 5}));
}

TEST(bpe, reads_merges_as_pairs_and_as_strings_alike) {
  const auto strings = codec_from(abcd(R"(["a b", "ab c", "c d"])"));
  const auto pairs = codec_from(abcd(R"([["a", "b"], ["ab", "c"], ["c", "d"]])"));
  for (const std::string_view w : {"abc", "abcd", "cdab", "dcba", "aabbccdd"})
    EXPECT_EQ(ids_of(strings, w), ids_of(pairs, w)) << w;
}

TEST(bpe, equal_ranks_merge_the_leftmost_pair_first) {
  // "dd" at rank 0 applies to the first two d's of "ddd"; the third stays alone.
  const auto c = codec_from(abcd(R"(["d d"])"));
  EXPECT_EQ(ids_of(c, "ddd"), (ids{9, 3}));
}

TEST(bpe, ignore_merges_takes_a_whole_word_from_the_vocabulary) {
  const auto with = codec_from(abcd(R"(["d d"])", true));
  const auto without = codec_from(abcd(R"(["d d"])", false));
  EXPECT_EQ(ids_of(with, "ddd"), (ids{10}));
  EXPECT_EQ(ids_of(without, "ddd"), (ids{9, 3}));
}

std::string spm_like(bool byte_fallback, bool fuse_unk) {
  auto tokens = byte_fallback_tokens({"<unk>", "\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi"});
  return R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
             "model": {"type": "BPE", "vocab": )" +
         vocab_json(tokens) + R"(, "merges": ["▁ h", "▁h i"], "unk_token": "<unk>", "byte_fallback": )" +
         (byte_fallback ? "true" : "false") + R"(, "fuse_unk": )" + (fuse_unk ? "true" : "false") + R"(},
             "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
             {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})";
}

TEST(bpe, byte_fallback_spells_an_unknown_character_in_byte_tokens) {
  const auto c = codec_from(spm_like(true, true));
  // é is C3 A9: two byte tokens after ▁hi.
  EXPECT_EQ(ids_of(c, "hié"), (ids{261, 0xC3, 0xA9}));
  EXPECT_EQ(c.decode(ids_of(c, "hié")), "hié");
  EXPECT_EQ(c.decode(ids_of(c, "hi 😀 hi")), "hi 😀 hi");
}

TEST(bpe, unknown_characters_become_unk_fused_when_asked) {
  const auto fused = codec_from(spm_like(false, true));
  const auto unfused = codec_from(spm_like(false, false));
  EXPECT_EQ(ids_of(fused, "hiéé"), (ids{261, 256}));
  EXPECT_EQ(ids_of(unfused, "hiéé"), (ids{261, 256, 256}));
}

TEST(normalizer, prepend_and_replace_make_sentencepiece_words) {
  const auto c = codec_from(spm_like(true, true));
  EXPECT_EQ(ids_of(c, "hi hi"), (ids{261, 261}));
  EXPECT_EQ(c.decode(ids{261, 261}), "hi hi");  // Strip removes the prepended space again
}

// A byte-level tokenizer over single bytes, with added tokens given as JSON objects.
std::string with_added(std::string_view added, std::string_view extra = "") {
  return R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
             "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": )" +
         vocab_json(byte_level_tokens()) + R"(, "merges": []}, "added_tokens": [)" + std::string(added) + "]" +
         std::string(extra) + "}";
}

std::string added_token(int id, std::string_view content, std::string_view flags) {
  return R"({"id": )" + std::to_string(id) + R"(, "content": )" + json_string(content) + ", " + std::string(flags) + "}";
}

ids bytes_of(std::string_view s) {
  ids out;
  for (const char ch : s) out.push_back(static_cast<unsigned char>(ch));
  return out;
}

ids concat(std::initializer_list<ids> parts) {
  ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(added_tokens, are_cut_out_before_the_model_longest_match_first) {
  const auto c = codec_from(with_added(added_token(300, "<x>", R"("special": true)") + "," +
                                       added_token(301, "<x>>", R"("special": false, "normalized": false)")));
  EXPECT_EQ(ids_of(c, "a<x>b"), concat({bytes_of("a"), {300}, bytes_of("b")}));
  EXPECT_EQ(ids_of(c, "a<x>>b"), concat({bytes_of("a"), {301}, bytes_of("b")}));
  EXPECT_EQ(c.decode(ids_of(c, "a<x>b"), true), "ab");
  EXPECT_EQ(c.decode(ids_of(c, "a<x>b"), false), "a<x>b");
  EXPECT_EQ(c.decode(ids_of(c, "a<x>>b"), true), "a<x>>b");  // not special: kept
}

TEST(added_tokens, lstrip_and_rstrip_swallow_the_whitespace_beside_them) {
  const auto l = codec_from(with_added(added_token(300, "<m>", R"("lstrip": true, "special": true)")));
  EXPECT_EQ(ids_of(l, "a  <m> b"), concat({bytes_of("a"), {300}, bytes_of(" b")}));
  const auto r = codec_from(with_added(added_token(300, "<m>", R"("rstrip": true, "special": true)")));
  EXPECT_EQ(ids_of(r, "a <m> \t b"), concat({bytes_of("a "), {300}, bytes_of("b")}));
}

TEST(added_tokens, single_word_matches_only_a_whole_word) {
  const auto c = codec_from(with_added(added_token(300, "ab", R"("single_word": true)")));
  EXPECT_EQ(ids_of(c, "ab cab abc ab"),
            concat({{300}, bytes_of(" cab abc "), {300}}));
}

TEST(added_tokens, split_special_tokens_leaves_special_text_to_the_model) {
  auto tok = parse_tokenizer_json(with_added(added_token(300, "<x>", R"("special": true)")), "t.json",
                                  {.split_special_tokens = true});
  ASSERT_TRUE(tok);
  EXPECT_EQ(*tok->encode("a<x>", false), bytes_of("a<x>"));
}

TEST(added_tokens, normalized_tokens_are_matched_in_normalized_text) {
  // With a lowercasing normalizer, a normalized token "<X>" is looked for as "<x>" after lowercasing;
  // a raw one only as written.
  const std::string norm = R"(, "normalizer": {"type": "Lowercase"})";
  const auto normalized = codec_from(with_added(added_token(300, "<X>", R"("normalized": true)"), norm));
  EXPECT_EQ(ids_of(normalized, "<x>"), (ids{300}));
  EXPECT_EQ(ids_of(normalized, "<X>"), (ids{300}));
  const auto raw = codec_from(with_added(added_token(300, "<X>", R"("normalized": false)"), norm));
  EXPECT_EQ(ids_of(raw, "<X>"), (ids{300}));
  EXPECT_EQ(ids_of(raw, "<x>"), bytes_of("<x>"));
}

TEST(post_processor, template_adds_bos_and_eos_only_with_special_tokens) {
  const std::string post = R"(, "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [301], "tokens": ["</s>"]}}})";
  const auto c = codec_from(with_added(added_token(300, "<s>", R"("special": true)") + "," +
                                           added_token(301, "</s>", R"("special": true)"),
                                       post));
  EXPECT_EQ(ids_of(c, "a", true), (ids{300, 'a', 301}));
  EXPECT_EQ(ids_of(c, "a", false), (ids{'a'}));
}

std::string split_with(std::string_view behavior, bool invert) {
  return R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": "-"},
             "behavior": ")" +
         std::string(behavior) + R"(", "invert": )" + (invert ? "true" : "false") +
         R"(}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
             "model": {"type": "BPE", "vocab": )" +
         vocab_json(byte_level_tokens({"a-", "-b"})) + R"(, "merges": ["a -", "- b"]}})";
}

TEST(pre_tokenizer, split_behaviours_decide_where_the_delimiter_goes) {
  // "a-b": merges could make "a-" or "-b"; which one the delimiter joins decides the ids.
  EXPECT_EQ(ids_of(codec_from(split_with("MergedWithPrevious", false)), "a-b"), (ids{256, 'b'}));
  EXPECT_EQ(ids_of(codec_from(split_with("MergedWithNext", false)), "a-b"), (ids{'a', 257}));
  EXPECT_EQ(ids_of(codec_from(split_with("Isolated", false)), "a-b"), (ids{'a', '-', 'b'}));
  EXPECT_EQ(ids_of(codec_from(split_with("Removed", false)), "a-b"), (ids{'a', 'b'}));
  EXPECT_EQ(ids_of(codec_from(split_with("Contiguous", false)), "a--b"), (ids{'a', '-', '-', 'b'}));
}

TEST(pre_tokenizer, regex_splits_keep_oniguruma_white_space) {
  // U+180E (Mongolian vowel separator) is not White_Space, so for Oniguruma \S+ runs through it and the
  // merges below make one token of "a" and it; PCRE2's own \s would take it as a space and split it off.
  const std::string sep = "\xE1\xA0\x8E";
  const std::string json = R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split",
      "pattern": {"Regex": "\\s+|\\S+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
      "model": {"type": "BPE", "vocab": )" +
                           vocab_json(byte_level_tokens({byte_level("a\xE1"), byte_level("a\xE1\xA0"),
                                                         byte_level("a" + sep)})) +
                           R"(, "merges": [)" + json_string(byte_level("a") + " " + byte_level("\xE1")) + ", " +
                           json_string(byte_level("a\xE1") + " " + byte_level("\xA0")) + ", " +
                           json_string(byte_level("a\xE1\xA0") + " " + byte_level("\x8E")) + "]}}";
  const auto c = codec_from(json);
  EXPECT_EQ(ids_of(c, "a" + sep + " b"), (ids{258, ' ', 'b'}));
  // U+0085 is White_Space for both engines: a word of its own.
  EXPECT_EQ(ids_of(c, "a\u0085b"), (ids{'a', 0xC2, 0x85, 'b'}));
}

TEST(pre_tokenizer, the_white_space_rewrite_keeps_classes_and_escapes_intact) {
  const std::string ws = "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
                         "\\x{205F}\\x{3000}";
  EXPECT_EQ(detail::oniguruma_compatible("\\s+(?!\\S)"), "[" + ws + "]+(?![^" + ws + "])");
  EXPECT_EQ(detail::oniguruma_compatible("[^\\s\\p{L}]"), "[^" + ws + "\\p{L}]");
  // An escaped backslash followed by s is a backslash and an s; ']' first in a class is a member.
  EXPECT_EQ(detail::oniguruma_compatible("\\\\s[]\\s]"), "\\\\s[]" + ws + "]");
}

TEST(decoder, metaspace_drops_the_first_tokens_replacement) {
  const std::string json = R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
      "split": true}, "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
      "model": {"type": "BPE", "vocab": {"▁": 0, "h": 1, "i": 2, "▁h": 3, "▁hi": 4}, "merges": ["▁ h", "▁h i"]}})";
  const auto c = codec_from(json);
  EXPECT_EQ(ids_of(c, "hi hi"), (ids{4, 4}));
  EXPECT_EQ(c.decode(ids{4, 4}), "hi hi");
}

TEST(decoder, byte_level_replaces_invalid_utf8_as_rust_does) {
  const auto c = codec_from(with_added(""));
  // A lone continuation byte and a truncated 3-byte sequence: one U+FFFD each.
  EXPECT_EQ(c.decode(ids{'a', 0x80, 'b', 0xE2, 0x82}), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(encode, refuses_text_that_is_not_utf8) {
  const auto c = codec_from(with_added(""));
  const auto r = c.encode("ok\xFF", false);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, text_error_code::invalid_utf8);
  EXPECT_NE(r.error().message().find("byte 2"), std::string::npos) << r.error().message();
}

TEST(encode, is_safe_from_several_threads) {
  const auto c = codec_from(abcd(R"(["a b", "ab c", "c d", "abc d"])"));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i)
        if (ids_of(c, i % 2 ? "abcd" : "abc") != (i % 2 ? ids{8} : ids{6})) ++wrong;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace troupe::text::testing

namespace troupe::text::testing {
namespace {

class model_dir {
 public:
  model_dir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("troupe-codec-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~model_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  model_dir(const model_dir&) = delete;
  model_dir& operator=(const model_dir&) = delete;
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string three_specials() {
  return with_added(added_token(300, "<s>", R"("special": true)") + "," + added_token(301, "</s>", R"("special": true)") +
                    "," + added_token(302, "<|im_end|>", R"("special": true)"));
}

TEST(text_codec, reads_special_ids_and_the_chat_template_beside_tokenizer_json) {
  model_dir dir;
  dir.write("tokenizer.json", three_specials());
  dir.write("tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "__type": "AddedToken"},
      "pad_token": null, "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  dir.write("generation_config.json", R"({"eos_token_id": [301, 302]})");
  for (const auto& p : {dir.path(), dir.path() / "tokenizer.json"}) {
    auto c = text_codec::open(p);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->specials().bos, 300);
    EXPECT_EQ(c->specials().eos, 301);
    EXPECT_FALSE(c->specials().pad);
    EXPECT_EQ(c->specials().end_ids, (std::vector<token_id>{301, 302}));
    EXPECT_EQ(c->chat_template(), "D");
    EXPECT_EQ(c->token_string(302), "<|im_end|>");
    EXPECT_EQ(c->token_to_id("<s>"), 300);
    EXPECT_EQ(c->token_string('a'), "a");
    EXPECT_EQ(c->vocab_size(), 303u);
    EXPECT_TRUE(c->is_special(301));
  }
}

TEST(text_codec, split_special_tokens_in_tokenizer_config_is_honoured) {
  model_dir dir;
  dir.write("tokenizer.json", three_specials());
  dir.write("tokenizer_config.json", R"({"split_special_tokens": true})");
  auto c = text_codec::open(dir.path());
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(ids_of(*c, "<s>"), bytes_of("<s>"));
}

TEST(text_codec, a_malformed_side_file_is_a_typed_error_naming_it) {
  model_dir dir;
  dir.write("tokenizer.json", three_specials());
  dir.write("tokenizer_config.json", "{ not json");
  auto c = text_codec::open(dir.path());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, text_error_code::bad_json);
  EXPECT_NE(c.error().file.find("tokenizer_config.json"), std::string::npos) << c.error().message();
}

TEST(text_codec, a_directory_without_tokenizer_json_is_an_io_error) {
  model_dir dir;
  auto c = text_codec::open(dir.path());
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, text_error_code::io);
}

}  // namespace
}  // namespace troupe::text::testing
