#include "engine/load/weight_store.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/load/safetensors.hpp"
#include "tests/engine/load/load_test_support.hpp"

namespace troupe::load {
namespace {

using testing::expect_load_error;
using testing::pattern;
using testing::read_bytes;
using testing::temp_dir;
using testing::write_bytes;
using testing::write_text;

struct fixture_tensors {
  std::vector<std::byte> embed = pattern(2 * 64 * 2, 1);  // f16 [2, 64]
  std::vector<std::byte> q = pattern(2 * 34, 2);          // q8_0 [2, 32]
  std::vector<std::byte> norm = pattern(64 * 4, 3);       // f32 [64]
};

void write_gguf(const std::filesystem::path& path, const fixture_tensors& t) {
  gguf_writer w;
  w.add("general.architecture", "llama");
  w.add_tensor("token_embd.weight", tensor_view(dtype::f16, {2, 64}, t.embed.data()));
  w.add_tensor("blk.0.attn_q.weight", tensor_view(dtype::q8_0, {2, 32}, t.q.data()));
  w.add_tensor("output_norm.weight", tensor_view(dtype::f32, {64}, t.norm.data()));
  ASSERT_TRUE(w.write(path));
}

TEST(weight_store, opens_a_gguf_file_zero_copy_in_its_stored_dtypes) {
  temp_dir dir;
  const fixture_tensors t;
  write_gguf(dir / "m.gguf", t);
  auto s = weight_store::open(dir / "m.gguf");
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->format(), weight_format::gguf);
  EXPECT_EQ(s->path(), dir / "m.gguf");
  EXPECT_EQ(s->names(),
            (std::vector<std::string>{"blk.0.attn_q.weight", "output_norm.weight", "token_embd.weight"}));
  EXPECT_EQ(s->size(), 3u);
  EXPECT_EQ(s->total_bytes(), t.embed.size() + t.q.size() + t.norm.size());
  const auto q = s->find("blk.0.attn_q.weight");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->type(), dtype::q8_0);
  EXPECT_EQ(q->shape(), (troupe::shape{2, 32}));
  EXPECT_EQ(std::memcmp(q->data(), t.q.data(), t.q.size()), 0);
  EXPECT_FALSE(s->find("absent"));
  ASSERT_TRUE(s->gguf());
  EXPECT_EQ(*s->gguf()->get().find_value("general.architecture")->get().get_if<std::string>(), "llama");
}

TEST(weight_store, tells_gguf_by_its_magic_whatever_the_extension) {
  temp_dir dir;
  const fixture_tensors t;
  write_gguf(dir / "m.gguf", t);
  std::filesystem::rename(dir / "m.gguf", dir / "weights.bin");
  auto s = weight_store::open(dir / "weights.bin");
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->format(), weight_format::gguf);
}

TEST(weight_store, opens_a_safetensors_file) {
  temp_dir dir;
  const fixture_tensors t;
  const std::vector<named_view> views = {{"model.norm.weight", tensor_view(dtype::f32, {64}, t.norm.data())},
                                         {"model.embed_tokens.weight", tensor_view(dtype::f16, {2, 64}, t.embed.data())}};
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", views));
  auto s = weight_store::open(dir / "model.safetensors");
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->format(), weight_format::safetensors);
  EXPECT_FALSE(s->gguf());
  EXPECT_EQ(s->names(), (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  EXPECT_EQ(s->total_bytes(), t.norm.size() + t.embed.size());
  EXPECT_EQ(std::memcmp(s->find("model.norm.weight")->data(), t.norm.data(), t.norm.size()), 0);
}

TEST(weight_store, opens_single_and_sharded_hugging_face_directories) {
  const fixture_tensors t;
  {
    temp_dir dir;
    const std::vector<named_view> views = {{"a", tensor_view(dtype::f32, {64}, t.norm.data())}};
    ASSERT_TRUE(write_safetensors(dir / "model.safetensors", views));
    auto s = weight_store::open(dir.path());
    ASSERT_TRUE(s) << s.error().message();
    EXPECT_EQ(s->names(), std::vector<std::string>{"a"});
  }
  {
    temp_dir dir;
    const std::vector<named_view> s1 = {{"a", tensor_view(dtype::f32, {64}, t.norm.data())}};
    const std::vector<named_view> s2 = {{"b", tensor_view(dtype::f16, {2, 64}, t.embed.data())}};
    ASSERT_TRUE(write_safetensors(dir / "model-00001-of-00002.safetensors", s1));
    ASSERT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors", s2));
    write_text(dir / "model.safetensors.index.json",
               R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
    auto s = weight_store::open(dir.path());
    ASSERT_TRUE(s) << s.error().message();
    EXPECT_EQ(s->format(), weight_format::safetensors);
    EXPECT_EQ(s->names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(std::memcmp(s->find("b")->data(), t.embed.data(), t.embed.size()), 0);
  }
}

TEST(weight_store, views_stay_valid_while_any_copy_of_the_store_lives) {
  temp_dir dir;
  const fixture_tensors t;
  write_gguf(dir / "m.gguf", t);
  std::optional<weight_store> copy;
  tensor_view v;
  {
    auto s = weight_store::open(dir / "m.gguf");
    ASSERT_TRUE(s);
    v = *s->find("output_norm.weight");
    copy = *s;
  }
  // The original is gone and the file is too; the mapping lives in the copy.
  std::filesystem::remove(dir / "m.gguf");
  EXPECT_EQ(std::memcmp(v.data(), t.norm.data(), t.norm.size()), 0);
  EXPECT_EQ(copy->size(), 3u);
}

TEST(weight_store, reports_the_readers_errors_naming_the_file) {
  temp_dir dir;
  expect_load_error(weight_store::open(dir / "absent.gguf"), load_error_code::io, (dir / "absent.gguf").string(), "");
  const fixture_tensors t;
  write_gguf(dir / "m.gguf", t);
  auto bytes = read_bytes(dir / "m.gguf");
  bytes.erase(bytes.begin() + 30, bytes.end());
  write_bytes(dir / "m.gguf", bytes);
  expect_load_error(weight_store::open(dir / "m.gguf"), load_error_code::truncated_header, (dir / "m.gguf").string(),
                    "");
}

}  // namespace
}  // namespace troupe::load
