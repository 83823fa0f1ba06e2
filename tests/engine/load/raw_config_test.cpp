#include "engine/load/raw_config.hpp"

#include <gtest/gtest.h>

#include "tests/engine/load/load_test_support.hpp"

namespace troupe::load {
namespace {

using testing::expect_load_error;
using testing::temp_dir;
using testing::write_text;

constexpr std::string_view llama_config = R"({
  "model_type": "llama",
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 4096,
  "num_hidden_layers": 32,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "eos_token_id": [128001, 128008, 128009],
  "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original": {"max_position_embeddings": 8192}},
  "sliding_window": null,
  "huge": 18446744073709551615
})";

raw_config parse(std::string_view text) {
  auto c = raw_config::from_json_string(text);
  EXPECT_TRUE(c) << c.error().message();
  return *c;
}

TEST(raw_config, reads_typed_values_from_config_json) {
  const auto c = parse(llama_config);
  EXPECT_EQ(c.source(), config_source::hf_json);
  EXPECT_EQ(c.name(), "config.json");
  EXPECT_EQ(*c.get_string("model_type"), "llama");
  EXPECT_EQ(*c.get_int("hidden_size"), 4096);
  EXPECT_EQ(*c.get_float("rms_norm_eps"), 1e-5);
  EXPECT_EQ(*c.get_bool("tie_word_embeddings"), false);
  EXPECT_EQ(*c.get_int_array("eos_token_id"), (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(*c.get_float_array("eos_token_id"), (std::vector<double>{128001, 128008, 128009}));
  EXPECT_EQ(*c.get_string_array("architectures"), std::vector<std::string>{"LlamaForCausalLM"});
}

TEST(raw_config, dotted_keys_reach_into_nested_objects) {
  const auto c = parse(llama_config);
  EXPECT_EQ(*c.get_float("rope_scaling.factor"), 8.0);
  EXPECT_EQ(*c.get_string("rope_scaling.rope_type"), "llama3");
  EXPECT_EQ(*c.get_int("rope_scaling.original.max_position_embeddings"), 8192);
  EXPECT_TRUE(c.has("rope_scaling"));
  EXPECT_FALSE(c.has("rope_scaling.absent"));
  // A key that itself holds a dot is found as written.
  const auto d = parse(R"({"a.b": 1, "a": {"c": 2}})");
  EXPECT_EQ(*d.get_int("a.b"), 1);
  EXPECT_EQ(*d.get_int("a.c"), 2);
}

TEST(raw_config, lookups_are_strict_about_types) {
  const auto c = parse(llama_config);
  // A float is read from an integer, never an integer from a float.
  EXPECT_EQ(*c.get_float("hidden_size"), 4096.0);
  expect_load_error(c.get_int("rope_theta"), load_error_code::wrong_type, "config.json", "rope_theta");
  expect_load_error(c.get_bool("num_hidden_layers"), load_error_code::wrong_type, "config.json", "num_hidden_layers");
  expect_load_error(c.get_int("huge"), load_error_code::wrong_type, "config.json", "huge");
  expect_load_error(c.get_string_array("eos_token_id"), load_error_code::wrong_type, "config.json", "eos_token_id");
  expect_load_error(c.get_int("rope_scaling"), load_error_code::wrong_type, "config.json", "rope_scaling");
}

TEST(raw_config, a_wrong_type_names_the_key_and_both_types) {
  const auto c = parse(llama_config);
  const auto r = c.get_int("model_type");
  expect_load_error(r, load_error_code::wrong_type, "config.json", "model_type");
  EXPECT_NE(r.error().reason.find("string"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find("integer"), std::string::npos) << r.error().reason;
}

TEST(raw_config, a_missing_key_is_named) {
  const auto c = parse(llama_config);
  EXPECT_FALSE(c.has("num_key_value_heads"));
  expect_load_error(c.get_int("num_key_value_heads"), load_error_code::missing_key, "config.json",
                    "num_key_value_heads");
  // Hugging Face writes null for an unset option: it counts as absent.
  EXPECT_FALSE(c.has("sliding_window"));
  expect_load_error(c.get_int("sliding_window"), load_error_code::missing_key, "config.json", "sliding_window");
}

TEST(raw_config, keys_lists_every_leaf_as_a_dotted_path) {
  const auto c = parse(R"({"b": 1, "a": {"y": [1], "x": "s"}, "n": null})");
  EXPECT_EQ(c.keys(), (std::vector<std::string>{"a.x", "a.y", "b"}));
  // An empty key keeps its place in the path, so every listed key is found again.
  const auto e = parse(R"({"": {"x": 1}})");
  EXPECT_EQ(e.keys(), std::vector<std::string>{".x"});
  EXPECT_EQ(*e.get_int(".x"), 1);
}

TEST(raw_config, malformed_json_is_refused_with_a_typed_error) {
  expect_load_error(raw_config::from_json_string(R"({"a": 1,)", "cfg.json"), load_error_code::bad_header, "cfg.json",
                    "");
  expect_load_error(raw_config::from_json_string("[1, 2]", "cfg.json"), load_error_code::bad_header, "cfg.json", "");
  expect_load_error(raw_config::from_json_string(R"({"a": {"k": 1, "k": 2}})", "cfg.json"),
                    load_error_code::duplicate_name, "cfg.json", "a.k");
  std::string deep(200, '[');
  expect_load_error(raw_config::from_json_string(R"({"d": )" + deep, "cfg.json"), load_error_code::bad_header,
                    "cfg.json", "d[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
                                "[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
                                "[0][0][0][0][0][0][0][0][0][0][0]");
}

TEST(raw_config, opens_a_file_or_a_directory_holding_config_json) {
  temp_dir dir;
  write_text(dir / "config.json", llama_config);
  auto f = raw_config::open(dir / "config.json");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->name(), (dir / "config.json").string());
  auto d = raw_config::open(dir.path());
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(*d->get_int("num_hidden_layers"), 32);
  expect_load_error(raw_config::open(dir / "absent.json"), load_error_code::io, (dir / "absent.json").string(), "");
}

TEST(raw_config, reads_gguf_metadata_by_its_stored_keys) {
  temp_dir dir;
  gguf_writer w;
  w.add("general.architecture", "llama");
  w.add("llama.block_count", std::uint32_t{32});
  w.add("llama.context_length", std::uint64_t{8192});
  w.add("llama.rope.freq_base", 500000.0f);
  w.add("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add("tokenizer.ggml.add_bos_token", true);
  w.add("tokenizer.ggml.tokens", gguf_array{gguf_type::string, {"<s>", "a"}});
  w.add("tokenizer.ggml.token_type", gguf_array{gguf_type::i32, {std::int32_t{3}, std::int32_t{1}}});
  w.add("tokenizer.ggml.scores", gguf_array{gguf_type::f32, {0.0f, -1.5f}});
  ASSERT_TRUE(w.write(dir / "m.gguf"));
  auto c = raw_config::open(dir / "m.gguf");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->source(), config_source::gguf);
  EXPECT_EQ(c->name(), (dir / "m.gguf").string());
  EXPECT_EQ(*c->get_string("general.architecture"), "llama");
  EXPECT_EQ(*c->get_int("llama.block_count"), 32);
  EXPECT_EQ(*c->get_int("llama.context_length"), 8192);
  EXPECT_EQ(*c->get_float("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(*c->get_float("llama.block_count"), 32.0);
  EXPECT_EQ(*c->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*c->get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"<s>", "a"}));
  EXPECT_EQ(*c->get_int_array("tokenizer.ggml.token_type"), (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(*c->get_float_array("tokenizer.ggml.scores"), (std::vector<double>{0.0, -1.5}));
  EXPECT_TRUE(c->has("llama.block_count"));
  EXPECT_FALSE(c->has("llama.expert_count"));
  EXPECT_EQ(c->keys().front(), "general.architecture");  // file order
  EXPECT_EQ(c->keys().size(), 9u);

  const auto file = (dir / "m.gguf").string();
  expect_load_error(c->get_int("llama.expert_count"), load_error_code::missing_key, file, "llama.expert_count");
  expect_load_error(c->get_int("llama.rope.freq_base"), load_error_code::wrong_type, file, "llama.rope.freq_base");
  expect_load_error(c->get_int("tokenizer.ggml.add_bos_token"), load_error_code::wrong_type, file,
                    "tokenizer.ggml.add_bos_token");
  expect_load_error(c->get_int_array("tokenizer.ggml.scores"), load_error_code::wrong_type, file,
                    "tokenizer.ggml.scores");
}

}  // namespace
}  // namespace troupe::load
