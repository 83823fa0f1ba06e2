// The pooling a checkpoint declares: a GGUF's <arch>.pooling_type (llama.cpp's numbering), a
// sentence-transformers directory's Pooling module config and Normalize module, else the default.
#include "families/pooling.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/load/gguf.hpp"

namespace troupe::families {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  auto d = fs::temp_directory_path() / ("troupe-pooling-" + std::to_string(::getpid())) / name;
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(pooling, a_gguf_declares_it_by_pooling_type) {
  for (const auto& [type, want] : std::vector<std::pair<std::uint32_t, pooling_mode>>{{1, pooling_mode::mean}, {2, pooling_mode::cls}, {3, pooling_mode::last}}) {
    load::gguf_writer w;
    w.add("general.architecture", "qwen3");
    w.add("qwen3.pooling_type", type);
    const auto path = scratch("gguf") / ("p" + std::to_string(type) + ".gguf");
    ASSERT_TRUE(w.write(path));
    auto cfg = load::raw_config::open(path);
    ASSERT_TRUE(cfg);
    const auto p = pooling_of(path, *cfg);
    EXPECT_EQ(p.mode, want);
    EXPECT_EQ(p.declared_by, "gguf pooling_type");
  }
  load::gguf_writer none;
  none.add("general.architecture", "llama");
  const auto path = scratch("gguf") / "none.gguf";
  ASSERT_TRUE(none.write(path));
  const auto p = pooling_of(path, *load::raw_config::open(path));
  EXPECT_EQ(p.mode, pooling_mode::last);
  EXPECT_TRUE(p.normalize);
  EXPECT_EQ(p.declared_by, "default");
}

TEST(pooling, a_sentence_transformers_directory_declares_it_by_its_modules) {
  const auto dir = scratch("st");
  write(dir / "config.json", R"({"model_type": "qwen3"})");
  write(dir / "modules.json", R"([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])");
  write(dir / "1_Pooling" / "config.json", R"({"word_embedding_dimension": 64, "pooling_mode_cls_token": false,
    "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_lasttoken": false})");
  auto cfg = load::raw_config::open(dir);
  ASSERT_TRUE(cfg);
  auto p = pooling_of(dir, *cfg);
  EXPECT_EQ(p.mode, pooling_mode::mean);
  EXPECT_TRUE(p.normalize);
  EXPECT_EQ(p.declared_by, "sentence-transformers");
  // Without a Normalize module the vectors stay raw; last-token pooling as Qwen3-Embedding declares it.
  write(dir / "modules.json", R"([{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])");
  write(dir / "1_Pooling" / "config.json", R"({"pooling_mode_lasttoken": true})");
  p = pooling_of(dir, *cfg);
  EXPECT_EQ(p.mode, pooling_mode::last);
  EXPECT_FALSE(p.normalize);
  EXPECT_EQ(pooling_named("cls"), pooling_mode::cls);
  EXPECT_FALSE(pooling_named("max"));
  fs::remove_all(dir.parent_path());
}

}  // namespace
}  // namespace troupe::families
