// The streaming detokenizer: a character split over several byte tokens comes out whole and only once
// its last byte is in; stop strings are found across token boundaries and never leak; held text that
// turns out not to be a stop is released; decoder rules for the start of a text apply once.
#include <gtest/gtest.h>

#include "engine/text/detokenizer.hpp"
#include "tests/engine/text/text_test_support.hpp"

namespace troupe::text::testing {
namespace {

using ids = std::vector<token_id>;

// Byte-level: ids 0..255 are the bytes; then "</", "s>", "hello", "ab</s>cd", and a special <eos>.
text_codec byte_level_codec() {
  return codec_from(R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
      "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": )" +
                    vocab_json(byte_level_tokens({"</", "s>", "hello", byte_level("ab</s>cd"), "b>"})) +
                    R"(, "merges": []}, "added_tokens": [{"id": 261, "content": "<eos>", "special": true}]})");
}
constexpr token_id lt_slash = 256, s_gt = 257, hello = 258, inner_stop = 259, b_gt = 260, eos = 261;

std::vector<std::string> push_all(detokenizer& d, const ids& in) {
  std::vector<std::string> out;
  for (const auto id : in) out.push_back(d.push(id).text);
  return out;
}

TEST(detokenizer, holds_a_four_byte_emoji_until_its_last_byte) {
  const auto c = byte_level_codec();
  detokenizer d(c);
  // 😀 is F0 9F 98 80.
  EXPECT_EQ(push_all(d, {'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}),
            (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "b"}));
  EXPECT_EQ(d.finish().text, "");
}

TEST(detokenizer, holds_byte_fallback_tokens_split_across_ids) {
  const auto c = codec_from(R"({"model": {"type": "BPE", "vocab": )" + vocab_json(byte_fallback_tokens({"x"})) +
                            R"(, "merges": [], "byte_fallback": true},
      "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})");
  const auto emoji = ids_of(c, "x😀x");
  ASSERT_EQ(emoji, (ids{256, 0xF0, 0x9F, 0x98, 0x80, 256}));
  detokenizer d(c);
  EXPECT_EQ(push_all(d, emoji), (std::vector<std::string>{"x", "", "", "", "😀", "x"}));
}

TEST(detokenizer, an_unfinished_character_at_the_end_becomes_a_replacement_character) {
  const auto c = byte_level_codec();
  detokenizer d(c);
  EXPECT_EQ(push_all(d, {'a', 0xF0, 0x9F}), (std::vector<std::string>{"a", "", ""}));
  EXPECT_EQ(d.finish().text, "\xEF\xBF\xBD");
}

TEST(detokenizer, a_stop_string_split_over_two_tokens_is_caught_and_not_emitted) {
  const auto c = byte_level_codec();
  detokenizer d(c, {.skip_special = true, .stop = {"</s>"}});
  EXPECT_EQ(d.push(hello).text, "hello");
  const auto first = d.push(lt_slash);
  EXPECT_EQ(first.text, "");  // "</" could start "</s>"
  EXPECT_FALSE(first.stop);
  const auto second = d.push(s_gt);
  EXPECT_EQ(second.text, "");
  ASSERT_TRUE(second.stop);
  EXPECT_EQ(*second.stop, 0u);
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.push(hello).text, "");  // nothing after a stop
  EXPECT_EQ(d.finish().text, "");
}

TEST(detokenizer, a_held_prefix_that_is_not_a_stop_is_released) {
  const auto c = byte_level_codec();
  detokenizer d(c, {.skip_special = true, .stop = {"</s>"}});
  EXPECT_EQ(d.push(lt_slash).text, "");
  EXPECT_EQ(d.push(b_gt).text, "</b>");
  EXPECT_EQ(d.push('<').text, "");
  EXPECT_EQ(d.finish().text, "<");  // the stream ended: a held prefix is plain text
  EXPECT_FALSE(d.stopped());
}

TEST(detokenizer, reports_the_text_before_a_stop_inside_one_token) {
  const auto c = byte_level_codec();
  detokenizer d(c, {.skip_special = true, .stop = {"xyz", "</s>"}});
  const auto out = d.push(inner_stop);  // "ab</s>cd"
  EXPECT_EQ(out.text, "ab");
  ASSERT_TRUE(out.stop);
  EXPECT_EQ(*out.stop, 1u);
}

TEST(detokenizer, the_earliest_stop_string_wins) {
  const auto c = byte_level_codec();
  detokenizer d(c, {.skip_special = true, .stop = {"cd", "b<"}});
  const auto out = d.push(inner_stop);  // "ab</s>cd": "b<" starts at 1, "cd" at 6
  EXPECT_EQ(out.text, "a");
  ASSERT_TRUE(out.stop);
  EXPECT_EQ(*out.stop, 1u);
}

TEST(detokenizer, stop_strings_spanning_many_tokens_are_caught) {
  const auto c = byte_level_codec();
  detokenizer d(c, {.skip_special = true, .stop = {"END"}});
  std::string emitted;
  for (const char ch : std::string("abc EN ENDx")) {
    const auto out = d.push(static_cast<unsigned char>(ch));
    emitted += out.text;
    if (out.stop) break;
  }
  EXPECT_EQ(emitted, "abc EN ");
  EXPECT_TRUE(d.stopped());
}

TEST(detokenizer, special_tokens_add_no_text_when_skipped) {
  const auto c = byte_level_codec();
  detokenizer skip(c);
  EXPECT_EQ(skip.push(eos).text, "");
  detokenizer keep(c, {.skip_special = false, .stop = {}});
  EXPECT_EQ(keep.push(eos).text, "<eos>");
}

TEST(detokenizer, strips_the_leading_space_of_a_sentencepiece_stream_once) {
  const auto c = codec_from(R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "model": {"type": "BPE", "vocab": {"▁": 0, "h": 1, "i": 2, "▁h": 3, "▁hi": 4}, "merges": ["▁ h", "▁h i"]},
      "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})");
  const auto in = ids_of(c, "hi hi");
  ASSERT_EQ(in, (ids{4, 4}));
  detokenizer d(c);
  EXPECT_EQ(push_all(d, in), (std::vector<std::string>{"hi", " hi"}));
  EXPECT_EQ(c.decode(in), "hi hi");
}

TEST(detokenizer, metaspace_drops_the_first_tokens_space) {
  const auto c = codec_from(R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
      "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
      "model": {"type": "BPE", "vocab": {"▁": 0, "h": 1, "i": 2, "▁h": 3, "▁hi": 4}, "merges": ["▁ h", "▁h i"]}})");
  detokenizer d(c);
  EXPECT_EQ(push_all(d, {4, 4, 0}), (std::vector<std::string>{"hi", " hi", " "}));
}

TEST(detokenizer, equals_a_byte_level_decode_even_for_invalid_utf8) {
  // Random bytes are mostly invalid UTF-8; a byte-level decode replaces each ill-formed part by U+FFFD
  // as Rust does, and the stream must say exactly the same, piece by piece.
  const auto c = byte_level_codec();
  std::uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(state >> 33);
  };
  for (int round = 0; round < 500; ++round) {
    ids in;
    const std::size_t n = 1 + next() % 12;
    for (std::size_t i = 0; i < n; ++i) {
      // Mostly bytes that start or continue multi-byte sequences.
      const std::uint32_t r = next() % 4;
      in.push_back(static_cast<token_id>(r == 0 ? next() % 128 : r == 1 ? 0x80 + next() % 64 : 0xC0 + next() % 64));
    }
    detokenizer d(c, {.skip_special = false, .stop = {}});
    std::string streamed;
    for (const auto id : in) streamed += d.push(id).text;
    streamed += d.finish().text;
    EXPECT_EQ(streamed, c.decode(in)) << ::testing::PrintToString(in);
  }
}

}  // namespace
}  // namespace troupe::text::testing
