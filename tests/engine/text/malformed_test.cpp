// Malformed tokenizer files are typed errors that name the file and the field at fault, never an
// exception or a crash: bad JSON, a missing or ill-typed vocab, an unknown component type, a merge
// naming an unknown token, a regex PCRE2 refuses, a template naming a token it does not define, and
// GGUF tokenizer keys of the wrong form.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "engine/load/gguf.hpp"
#include "engine/text/gguf_tokenizer.hpp"
#include "tests/engine/text/text_test_support.hpp"

namespace troupe::text::testing {
namespace {

void expect_error(const std::string& json, text_error_code code, std::string_view field,
                  std::string_view reason_part = "") {
  auto tok = parse_tokenizer_json(json, "bad-tokenizer.json");
  ASSERT_FALSE(tok) << "accepted: " << json;
  EXPECT_EQ(tok.error().code, code) << tok.error().message();
  EXPECT_EQ(tok.error().file, "bad-tokenizer.json");
  EXPECT_EQ(tok.error().field, field) << tok.error().message();
  EXPECT_NE(tok.error().reason.find(reason_part), std::string::npos) << tok.error().message();
  EXPECT_NE(tok.error().message().find("bad-tokenizer.json"), std::string::npos);
}

const std::string good_model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

TEST(malformed_tokenizer_json, bad_json_syntax) {
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0,}})", text_error_code::bad_json, "", "not valid JSON");
  expect_error("", text_error_code::bad_json, "", "not valid JSON");
  expect_error("[1, 2]", text_error_code::bad_json, "", "not a JSON object");
}

TEST(malformed_tokenizer_json, unknown_model_type) {
  expect_error(R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})", text_error_code::unsupported, "model.type",
               "'Unigram'");
}

TEST(malformed_tokenizer_json, missing_or_ill_typed_vocab) {
  expect_error(R"({"model": {"type": "BPE", "merges": []}})", text_error_code::missing_field, "model.vocab");
  expect_error(R"({"model": {"type": "BPE", "vocab": [1, 2], "merges": []}})", text_error_code::bad_json,
               "model.vocab");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}, "merges": []}})", text_error_code::bad_json,
               "model.vocab.a");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})", text_error_code::bad_value,
               "model.vocab.a");
  expect_error(R"({"normalizer": null})", text_error_code::missing_field, "model");
}

TEST(malformed_tokenizer_json, merge_naming_an_unknown_token) {
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a q"]}})",
               text_error_code::unknown_token, "model.merges[1]", "'q'");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]}})",
               text_error_code::unknown_token, "model.merges[0]", "'ab'");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b c"]}})",
               text_error_code::bad_json, "model.merges[0]");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [42]}})",
               text_error_code::bad_json, "model.merges[0]");
}

TEST(malformed_tokenizer_json, regex_pcre2_refuses) {
  expect_error("{" + good_model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(ab"},
               "behavior": "Isolated", "invert": false}})",
               text_error_code::bad_regex, "pre_tokenizer.pattern.Regex", "missing closing parenthesis");
  expect_error("{" + good_model + R"(, "normalizer": {"type": "Sequence", "normalizers": [{"type": "Replace",
               "pattern": {"Regex": "[z-a]"}, "content": ""}]}})",
               text_error_code::bad_regex, "normalizer.normalizers[0].pattern.Regex", "range out of order");
}

TEST(malformed_tokenizer_json, unknown_component_types) {
  expect_error("{" + good_model + R"(, "normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}})",
               text_error_code::unsupported, "normalizer.type", "'Precompiled'");
  expect_error("{" + good_model + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Nope"}]}})",
               text_error_code::unsupported, "pre_tokenizer.pretokenizers[0].type", "'Nope'");
  expect_error("{" + good_model + R"(, "decoder": {"type": "CTC"}})", text_error_code::unsupported, "decoder.type");
  expect_error("{" + good_model + R"(, "post_processor": {"type": "Nope"}})", text_error_code::unsupported,
               "post_processor.type");
  expect_error("{" + good_model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
               "behavior": "Sideways"}})",
               text_error_code::bad_value, "pre_tokenizer.behavior", "'Sideways'");
  expect_error("{" + good_model + R"(, "decoder": {"pattern": 1}})", text_error_code::missing_field, "decoder.type");
}

TEST(malformed_tokenizer_json, template_naming_an_undefined_special_token) {
  expect_error("{" + good_model + R"(, "post_processor": {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
               "special_tokens": {}}})",
               text_error_code::unknown_token, "post_processor.single[0]", "'<s>'");
}

TEST(malformed_tokenizer_json, bad_added_tokens) {
  expect_error("{" + good_model + R"(, "added_tokens": [{"content": "<s>"}]})", text_error_code::missing_field,
               "added_tokens[0].id");
  expect_error("{" + good_model + R"(, "added_tokens": [{"id": 3, "content": "<s>", "special": "yes"}]})",
               text_error_code::bad_json, "added_tokens[0].special");
}

TEST(malformed_tokenizer_json, a_missing_file_is_an_io_error) {
  auto tok = load_tokenizer_json("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tok);
  EXPECT_EQ(tok.error().code, text_error_code::io);
  auto codec = text_codec::open("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(codec);
  EXPECT_EQ(codec.error().code, text_error_code::io);
}

// A GGUF image with the given tokenizer keys and nothing else.
result<gguf_text, text_error> read_keys(const std::vector<load::gguf_kv>& kvs) {
  load::gguf_writer w;
  for (const auto& kv : kvs) w.add(kv.key, kv.value);
  static std::vector<std::byte> bytes;
  auto image = w.serialize("tok.gguf");
  EXPECT_TRUE(image);
  bytes = std::move(*image);
  auto file = load::gguf_file::parse(bytes, "tok.gguf");
  EXPECT_TRUE(file);
  return read_gguf_tokenizer(*file);
}

load::gguf_array strings(std::vector<std::string> v) {
  load::gguf_array a{load::gguf_type::string, {}};
  for (auto& s : v) a.emplace_back(std::move(s));
  return a;
}

void expect_gguf_error(const std::vector<load::gguf_kv>& kvs, text_error_code code, std::string_view field) {
  auto r = read_keys(kvs);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, code) << r.error().message();
  EXPECT_EQ(r.error().field, field) << r.error().message();
  EXPECT_EQ(r.error().file, "tok.gguf");
}

TEST(malformed_gguf_tokenizer, missing_or_unknown_model) {
  expect_gguf_error({}, text_error_code::missing_field, "tokenizer.ggml.model");
  expect_gguf_error({{"tokenizer.ggml.model", "t5"}}, text_error_code::unsupported, "tokenizer.ggml.model");
  expect_gguf_error({{"tokenizer.ggml.model", "bert"}}, text_error_code::missing_field, "tokenizer.ggml.tokens");
  expect_gguf_error({{"tokenizer.ggml.model", std::uint32_t{3}}}, text_error_code::bad_gguf, "tokenizer.ggml.model");
  expect_gguf_error({{"tokenizer.ggml.model", "gpt2"}}, text_error_code::missing_field, "tokenizer.ggml.tokens");
}

TEST(malformed_gguf_tokenizer, a_wpm_vocabulary_without_its_unknown_token_or_with_a_bad_separator) {
  const load::gguf_kv model{"tokenizer.ggml.model", "bert"};
  const load::gguf_kv tokens{"tokenizer.ggml.tokens", strings({"[UNK]", "[CLS]", "[SEP]", "\xE2\x96\x81" "a", "b"})};
  // Too few tokens for llama.cpp's default unknown id (100), and none named.
  expect_gguf_error({model, tokens}, text_error_code::missing_field, "tokenizer.ggml.unknown_token_id");
  expect_gguf_error({model, tokens, {"tokenizer.ggml.unknown_token_id", std::uint32_t{0}}, {"tokenizer.ggml.seperator_token_id", std::uint32_t{9}}},
                    text_error_code::bad_value, "tokenizer.ggml.seperator_token_id");
  auto ok = read_keys({model, tokens, {"tokenizer.ggml.unknown_token_id", std::uint32_t{0}}, {"tokenizer.ggml.cls_token_id", std::uint32_t{1}},
                       {"tokenizer.ggml.seperator_token_id", std::uint32_t{2}}});
  ASSERT_TRUE(ok) << ok.error().message();
}

TEST(malformed_gguf_tokenizer, unknown_pre_tokenizer_and_bad_merges) {
  const load::gguf_kv model{"tokenizer.ggml.model", "gpt2"};
  const load::gguf_kv tokens{"tokenizer.ggml.tokens", strings({"a", "b", "ab"})};
  expect_gguf_error({model, tokens, {"tokenizer.ggml.pre", "klingon"}, {"tokenizer.ggml.merges", strings({"a b"})}},
                    text_error_code::unsupported, "tokenizer.ggml.pre");
  expect_gguf_error({model, tokens, {"tokenizer.ggml.pre", "qwen2"}, {"tokenizer.ggml.merges", strings({"a c"})}},
                    text_error_code::unknown_token, "tokenizer.ggml.merges[0]");
  expect_gguf_error({model, tokens, {"tokenizer.ggml.pre", "qwen2"}, {"tokenizer.ggml.merges", strings({"ab"})}},
                    text_error_code::bad_value, "tokenizer.ggml.merges[0]");
  expect_gguf_error({model, tokens, {"tokenizer.ggml.merges", strings({"a b"})},
                     {"tokenizer.ggml.bos_token_id", std::uint32_t{7}}},
                    text_error_code::bad_value, "tokenizer.ggml.bos_token_id");
}

TEST(malformed_gguf_tokenizer, scores_that_do_not_match_the_tokens) {
  load::gguf_array scores{load::gguf_type::f32, {}};
  scores.emplace_back(0.0f);
  expect_gguf_error({{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.tokens", strings({"a", "b"})},
                     {"tokenizer.ggml.scores", scores}},
                    text_error_code::bad_value, "tokenizer.ggml.scores");
  load::gguf_array types{load::gguf_type::i32, {}};
  types.emplace_back(std::int32_t{1});
  expect_gguf_error({{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.tokens", strings({"a", "b"})},
                     {"tokenizer.ggml.token_type", types}},
                    text_error_code::bad_value, "tokenizer.ggml.token_type");
}

TEST(gguf_tokenizer, reads_a_small_sentencepiece_vocabulary) {
  load::gguf_array scores{load::gguf_type::f32, {}};
  load::gguf_array types{load::gguf_type::i32, {}};
  // <unk> <s> </s> ▁ h i ▁h ▁hi
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "h", "i", "\xE2\x96\x81h",
                                           "\xE2\x96\x81hi"};
  const std::vector<float> score = {0, 0, 0, -1, -2, -3, -4, -5};
  const std::vector<std::int32_t> type = {2, 3, 3, 1, 1, 1, 1, 1};
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    scores.emplace_back(score[i]);
    types.emplace_back(type[i]);
  }
  auto r = read_keys({{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.tokens", strings(pieces)},
                      {"tokenizer.ggml.scores", scores}, {"tokenizer.ggml.token_type", types},
                      {"tokenizer.ggml.bos_token_id", std::uint32_t{1}}, {"tokenizer.ggml.eos_token_id", std::uint32_t{2}},
                      {"tokenizer.ggml.unknown_token_id", std::uint32_t{0}},
                      {"tokenizer.chat_template", "{{ messages }}"}});
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(*r->tok.encode("hi hi", true), (std::vector<token_id>{1, 7, 7}));
  EXPECT_EQ(*r->tok.encode("hi</s>hi", false), (std::vector<token_id>{7, 2, 7}));
  EXPECT_EQ(r->tok.decode(std::vector<token_id>{1, 7, 7}, true), "hi hi");
  EXPECT_EQ(*r->tok.encode("hé", false), (std::vector<token_id>{6, 0}));  // no byte tokens: unk
  EXPECT_EQ(r->chat_template, "{{ messages }}");
  EXPECT_EQ(r->ids.bos, 1);
  EXPECT_TRUE(r->ids.is_end(2));
}

}  // namespace
}  // namespace troupe::text::testing
