// The encoder families (bert, nomic_bert) on their fixtures, through the oracle:
// - the HF-directory and GGUF forms encode to the same hidden states, batched rows with padding;
// - attention is bidirectional (a later token changes an earlier token's state), and a row's states do
//   not depend on the rows it is batched with or on its padding;
// - they offer the encode program only: a step trace is a typed refusal, the schema says so;
// - both forms' tokenizers (tokenizer.json's WordPiece; the GGUF's phantom-space WPM vocabulary) give
//   the same ids, [CLS] ... [SEP] around them;
// - the HF form declares mean pooling through sentence-transformers' modules.json, the GGUF form
//   through pooling_type;
// - a missing weight and an unsupported config field are typed errors naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/eval/oracle.hpp"
#include "engine/load/safetensors.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/model_handle.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const auto p = fs::temp_directory_path() / ("troupe-encoder-test-" + std::to_string(::getpid())) / name;
  fs::create_directories(p.parent_path());
  return p;
}

fixture_dims dims() {
  fixture_dims d;
  d.vocab = 300;
  d.hidden = 64;
  d.ffn = 96;
  d.heads = 4;
  d.layers = 2;
  d.max_positions = 64;
  return d;
}

std::shared_ptr<const model_handle> load(std::string_view family, bool gguf, const fixture_dims& d = dims()) {
  const auto path = scratch(std::string(family) + (gguf ? ".gguf" : "-hf"));
  auto w = write_fixture(family, d, path, gguf);
  EXPECT_TRUE(w) << (w ? "" : w.error().message());
  auto h = model_handle::load(path, registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : message(h.error()));
  return h ? *h : nullptr;
}

class map_weights final : public eval::const_source {
 public:
  explicit map_weights(const weight_map& m) : m_(m) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override { return m_.view(role); }

 private:
  const weight_map& m_;
};

// Hidden states [rows * T, hidden] of `rows` (each padded to T) through the oracle.
std::vector<float> encode(const model_handle& h, const std::vector<std::vector<std::int32_t>>& rows, std::int64_t T) {
  const auto R = static_cast<std::int64_t>(rows.size());
  step_spec spec;
  spec.program = program::encode;
  spec.shape = step_shape(R, T, T);
  auto g = h.model().trace(spec);
  EXPECT_TRUE(g) << (g ? "" : g.error().message());
  if (!g) return {};
  tensor ids(dtype::i32, {R * T}), pos(dtype::i32, {R * T}), mask(dtype::i32, {R * T});
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t t = 0; t < T; ++t) {
      const bool real = t < static_cast<std::int64_t>(rows[r].size());
      ids.as<std::int32_t>()[r * T + t] = real ? rows[r][t] : 0;
      pos.as<std::int32_t>()[r * T + t] = real ? static_cast<std::int32_t>(t) : 0;
      mask.as<std::int32_t>()[r * T + t] = real ? 1 : 0;
    }
  map_weights w(h.model().weights());
  eval::eval_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"token_mask", mask.view()}};
  in.weights = &w;
  auto e = eval::evaluate(*g, in);
  EXPECT_TRUE(e) << (e ? "" : e.error().message());
  if (!e) return {};
  const auto& out = e->outputs.at("hidden");
  return std::vector<float>(out.as<float>(), out.as<float>() + out.numel());
}

double max_diff(const float* a, const float* b, std::int64_t n) {
  double d = 0;
  for (std::int64_t i = 0; i < n; ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

class encoder_test : public ::testing::TestWithParam<std::string_view> {};

TEST_P(encoder_test, hf_and_gguf_forms_encode_alike_and_attention_is_bidirectional) {
  auto hf = load(GetParam(), false), gg = load(GetParam(), true);
  ASSERT_TRUE(hf && gg);
  EXPECT_FALSE(hf->model().schema().offers(program::step));
  EXPECT_TRUE(hf->model().schema().offers(program::encode));
  const std::vector<std::vector<std::int32_t>> rows = {{2, 50, 61, 72, 83, 94, 105, 116, 127, 3}, {2, 40, 41, 3}};
  const std::int64_t T = 12, H = dims().hidden;
  const auto a = encode(*hf, rows, T), b = encode(*gg, rows, T);
  ASSERT_EQ(a.size(), static_cast<std::size_t>(2 * T * H));
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    EXPECT_LT(max_diff(a.data() + r * T * H, b.data() + r * T * H, static_cast<std::int64_t>(rows[r].size()) * H), 1e-5) << "row " << r;
  // The second row alone, unpadded: the same states as when batched and padded.
  const auto alone = encode(*hf, {rows[1]}, 4);
  EXPECT_LT(max_diff(alone.data(), a.data() + T * H, 4 * H), 1e-5);
  // Changing the last token changes the first token's state: every token sees every token.
  auto changed = rows[1];
  changed[2] = 99;
  const auto c = encode(*hf, {changed}, 4);
  EXPECT_GT(max_diff(c.data(), alone.data(), H), 1e-3);
}

TEST_P(encoder_test, offers_no_step_program) {
  auto h = load(GetParam(), true);
  ASSERT_TRUE(h);
  step_spec spec;
  spec.shape = step_shape(1, 1, 16);
  auto g = h->model().trace(spec);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message().find("step"), std::string::npos) << g.error().message();
}

TEST_P(encoder_test, both_forms_tokenize_alike_and_declare_mean_pooling) {
  auto hf = load(GetParam(), false), gg = load(GetParam(), true);
  ASSERT_TRUE(hf && gg);
  ASSERT_NE(hf->text(), nullptr) << hf->text_problem();
  ASSERT_NE(gg->text(), nullptr) << gg->text_problem();
  for (const char* text : {"the world is good", "Hello, World! It's 42.", "playing runs: walked", "qzx the", "\tTHE\nyears  "}) {
    auto a = hf->text()->encode(text), b = gg->text()->encode(text);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(*a, *b) << text;
    ASSERT_GE(a->size(), 3u);
    EXPECT_EQ(a->front(), 2);
    EXPECT_EQ(a->back(), 3);
  }
  auto ids = gg->text()->encode("The world, is good!");
  ASSERT_TRUE(ids);
  EXPECT_EQ(gg->text()->decode(*ids, true), "the world, is good!");
  EXPECT_EQ(hf->text()->decode(*ids, true), "the world, is good!");
  EXPECT_EQ(hf->pooling().mode, pooling_mode::mean);
  EXPECT_EQ(hf->pooling().declared_by, "sentence-transformers");
  EXPECT_TRUE(hf->pooling().normalize);
  EXPECT_EQ(gg->pooling().mode, pooling_mode::mean);
  EXPECT_EQ(gg->pooling().declared_by, "gguf pooling_type");
  // Without sentence-transformers' modules.json an encoder pools by the mean, not the decoders' last token.
  const auto bare = scratch(std::string(GetParam()) + "-bare");
  ASSERT_TRUE(write_fixture(GetParam(), dims(), bare, false));
  fs::remove(bare / "modules.json");
  auto b = model_handle::load(bare, registry::builtin());
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)->pooling().mode, pooling_mode::mean);
  EXPECT_EQ((*b)->pooling().declared_by, "encoder default");
}

TEST_P(encoder_test, a_missing_weight_and_a_bad_field_are_named) {
  const auto dir = scratch(std::string(GetParam()) + "-broken");
  ASSERT_TRUE(write_fixture(GetParam(), dims(), dir, false));
  {
    // Drop layer 1's output LayerNorm.
    auto st = load::safetensors_file::open(dir / "model.safetensors");
    ASSERT_TRUE(st);
    std::vector<load::named_view> keep;
    std::string dropped;
    for (const auto& t : st->tensors())
      if (t.name == "encoder.layers.1.norm2.weight" || t.name == "encoder.layer.1.output.LayerNorm.weight") dropped = t.name;
      else keep.push_back(t);
    ASSERT_FALSE(dropped.empty());
    ASSERT_TRUE(load::write_safetensors(dir / "pruned.safetensors", keep, {}));
  }
  fs::rename(dir / "pruned.safetensors", dir / "model.safetensors");
  auto h = model_handle::load(dir, registry::builtin());
  ASSERT_FALSE(h);
  EXPECT_NE(message(h.error()).find("layer_output_norm"), std::string::npos) << message(h.error());

  ASSERT_TRUE(write_fixture(GetParam(), dims(), dir, false));
  nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  const std::string field = GetParam() == "bert" ? "hidden_act" : "activation_function";
  c[field] = "relu";
  std::ofstream(dir / "config.json") << c.dump();
  auto bad = model_handle::load(dir, registry::builtin());
  ASSERT_FALSE(bad);
  EXPECT_NE(message(bad.error()).find(field), std::string::npos) << message(bad.error());
}

INSTANTIATE_TEST_SUITE_P(encoders, encoder_test, ::testing::ValuesIn(encoder_fixture_families()),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace troupe::families
