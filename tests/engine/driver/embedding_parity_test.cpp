// Embeddings against llama.cpp (node-llama-cpp's embedding context, tests/reference/llama_embed.mjs) on
// each dense family's GGUF fixture and on the encoder families' (bert, nomic-bert): troupe's pooled
// encode states point the same way (cosine > 0.9999) for inputs of several lengths, batched several to a
// step. A decoder fixture declares no pooling (the last token's state after the output norm, as
// llama.cpp returns it); an encoder's declares mean pooling (pooling_type 1), bidirectional attention
// over each input alone. For the encoders, troupe's tokenizer of the GGUF (llama.cpp's phantom-space
// WPM vocabulary read back as WordPiece) gives llama.cpp's ids too (tests/reference/llama_tokenize.mjs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/driver_fixture.hpp"
#include "families/model_handle.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

class embedding_parity : public ::testing::TestWithParam<std::string> {};

TEST_P(embedding_parity, pooled_encode_states_match_llama_cpp) {
  const auto dir = fs::temp_directory_path() / ("troupe-embed-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = dir / (GetParam() + ".gguf");
  ASSERT_TRUE(families::write_fixture(GetParam(), test::small_dims(), path, true));
  auto h = families::model_handle::load(path, families::registry::builtin());
  ASSERT_TRUE(h) << families::message(h.error());
  const bool encoder = GetParam() == "bert" || GetParam() == "nomic_bert";
  EXPECT_EQ((*h)->pooling().declared_by, encoder ? "gguf pooling_type" : "default");
  if (encoder) {
    EXPECT_EQ((*h)->pooling().mode, families::pooling_mode::mean);
  }
  exec::cpu::cpu_executor ex;
  driver_options o;
  o.max_rows = 4;
  o.capacity = 64;
  o.block_size = 16;
  o.prefill_chunk = 64;
  o.token_budget = 65;
  auto drv = driver<unprepared>(*h, ex, o).prepare();
  ASSERT_TRUE(drv) << drv.error().second.message();
  std::vector<std::vector<std::int32_t>> rows;
  std::string spec;
  // node-llama-cpp puts [CLS] first and [SEP] last in an encoder's input when they are not there: the
  // inputs hold them, as a tokenized text does.
  for (int n : encoder ? std::vector<int>{3, 5, 17, 40} : std::vector<int>{1, 5, 17, 40}) {
    std::vector<std::int32_t> ids;
    for (int t = 0; t < n; ++t) ids.push_back(5 + (t * 37 + n * 11) % 500);
    if (encoder) ids.front() = 2, ids.back() = 3;
    if (!spec.empty()) spec += ";";
    for (std::size_t t = 0; t < ids.size(); ++t) spec += (t ? "," : "") + std::to_string(ids[t]);
    rows.push_back(std::move(ids));
  }
  auto mine = drv->embed(rows, (*h)->pooling());
  ASSERT_TRUE(mine) << mine.error().message();
  const auto out = dir / (GetParam() + ".json");
  const std::string cmd = "cd \"" + std::string(TROUPE_SOURCE_DIR) + "\" && node tests/reference/llama_embed.mjs \"" + path.string() + "\" \"" +
                          spec + "\" > \"" + out.string() + "\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  const auto ref = nlohmann::json::parse(f);
  ASSERT_EQ(ref.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto theirs = ref[i].get<std::vector<double>>();
    ASSERT_EQ(theirs.size(), (*mine)[i].size());
    double dot = 0, a = 0, b = 0;
    for (std::size_t c = 0; c < theirs.size(); ++c) {
      dot += theirs[c] * (*mine)[i][c];
      a += theirs[c] * theirs[c];
      b += static_cast<double>((*mine)[i][c]) * (*mine)[i][c];
    }
    EXPECT_GT(dot / std::sqrt(a * b), 0.9999) << GetParam() << " input " << i << " (" << rows[i].size() << " tokens)";
  }
  if (encoder) {
    const std::vector<std::string> texts = {"the world is good", "Hello, World! It's 42.", "playing runs: walked (talked)",
                                            "qzx unknownword the", "  spaced   out\ttabs\nlines  ", "embedding-ness of THE years"};
    const auto tpath = dir / "texts.json";
    std::ofstream(tpath) << nlohmann::json(texts).dump();
    const auto tout = dir / "tokens.json";
    const std::string tcmd = "cd \"" + std::string(TROUPE_SOURCE_DIR) + "\" && node tests/reference/llama_tokenize.mjs \"" + path.string() + "\" \"" +
                             tpath.string() + "\" > \"" + tout.string() + "\"";
    ASSERT_EQ(std::system(tcmd.c_str()), 0) << tcmd;
    std::ifstream tf(tout);
    const auto tref = nlohmann::json::parse(tf);
    const auto* codec = (*h)->text();
    ASSERT_NE(codec, nullptr) << (*h)->text_problem();
    for (std::size_t i = 0; i < texts.size(); ++i) {
      auto mine_ids = codec->encode(texts[i], false);
      ASSERT_TRUE(mine_ids) << mine_ids.error().message();
      std::vector<std::int32_t> got(mine_ids->begin(), mine_ids->end());
      EXPECT_EQ(got, tref[i].get<std::vector<std::int32_t>>()) << "'" << texts[i] << "'";
      auto with = codec->encode(texts[i], true);  // [CLS] text [SEP]
      ASSERT_TRUE(with);
      ASSERT_EQ(with->size(), got.size() + 2);
      EXPECT_EQ(with->front(), 2);
      EXPECT_EQ(with->back(), 3);
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(families, embedding_parity, ::testing::Values("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "bert",
                                                                        "nomic_bert"));

}  // namespace
}  // namespace troupe::driver
