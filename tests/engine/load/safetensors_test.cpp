#include "engine/load/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/engine/load/load_test_support.hpp"

namespace troupe::load {
namespace {

using testing::expect_load_error;
using testing::pattern;
using testing::read_bytes;
using testing::temp_dir;
using testing::write_bytes;
using testing::write_text;

// A file image from a header written by hand and a data section.
std::vector<std::byte> image(std::string_view header, const std::vector<std::byte>& data) {
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xff);
  for (const char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Writes a hand-made file and opens it: the malformed cases go through open() like a real checkpoint.
result<safetensors_file, load_error> open_image(const temp_dir& dir, std::string_view header,
                                                const std::vector<std::byte>& data) {
  write_bytes(dir / "bad.safetensors", image(header, data));
  return safetensors_file::open(dir / "bad.safetensors");
}

TEST(safetensors, round_trips_every_dtype_with_a_safetensors_code) {
  temp_dir dir;
  std::vector<std::vector<std::byte>> storage;
  std::vector<named_view> written;
  for (int i = 0; i < dtype_count; ++i) {
    const auto t = static_cast<dtype>(i);
    if (!info(t).safetensors) continue;
    const troupe::shape s{3, 5};
    storage.push_back(pattern(*storage_bytes(t, 15), static_cast<unsigned>(i)));
    if (t == dtype::boolean)
      for (auto& b : storage.back()) b &= std::byte{1};
    written.push_back({"w." + std::string(name(t)), tensor_view(t, s, storage.back().data())});
  }
  ASSERT_EQ(written.size(), 12u);
  const string_map meta{{"format", "pt"}, {"note", "ünïcode"}};
  const auto path = dir / "model.safetensors";
  ASSERT_TRUE(write_safetensors(path, written, meta));

  auto f = safetensors_file::open(path);
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->name(), path.string());
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->data_offset() % 8, 0u);
  ASSERT_EQ(f->tensors().size(), written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    // Data order is write order.
    EXPECT_EQ(f->tensors()[i].name, written[i].name);
    const auto v = f->find(written[i].name);
    ASSERT_TRUE(v) << written[i].name;
    EXPECT_EQ(v->type(), written[i].view.type());
    EXPECT_EQ(v->shape(), written[i].view.shape());
    ASSERT_EQ(v->bytes(), written[i].view.bytes());
    EXPECT_EQ(std::memcmp(v->data(), written[i].view.data(), v->bytes()), 0) << written[i].name;
  }
  EXPECT_FALSE(f->find("absent"));
}

TEST(safetensors, scalars_and_empty_tensors_round_trip) {
  temp_dir dir;
  const float one = 1.5f;
  const std::vector<named_view> written = {
      {"scalar", tensor_view(dtype::f32, troupe::shape{}, reinterpret_cast<const std::byte*>(&one))},
      {"empty", tensor_view(dtype::f16, troupe::shape{0, 4}, nullptr)},
  };
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", written));
  auto f = safetensors_file::open(dir / "m.safetensors");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->metadata().size(), 0u);
  const auto s = f->find("scalar");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->shape().rank(), 0u);
  EXPECT_EQ(*s->as<float>(), 1.5f);
  const auto e = f->find("empty");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shape(), (troupe::shape{0, 4}));
  EXPECT_EQ(e->bytes(), 0u);
}

TEST(safetensors, parse_reads_an_image_held_in_memory) {
  temp_dir dir;
  const auto data = pattern(24, 3);
  const std::vector<named_view> written = {{"x", tensor_view(dtype::i16, {3, 4}, data.data())}};
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", written));
  const auto bytes = read_bytes(dir / "m.safetensors");
  auto f = safetensors_file::parse(bytes, "in-memory");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->name(), "in-memory");
  const auto v = f->find("x");
  ASSERT_TRUE(v);
  // Zero copy: the view points into the caller's bytes.
  EXPECT_EQ(v->data(), bytes.data() + f->data_offset());
  EXPECT_EQ(std::memcmp(v->data(), data.data(), 24), 0);
}

TEST(safetensors, views_stay_valid_after_the_file_object_that_made_them_is_copied_and_dropped) {
  temp_dir dir;
  const auto data = pattern(16, 9);
  const std::vector<named_view> written = {{"x", tensor_view(dtype::u8, {16}, data.data())}};
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", written));
  std::optional<safetensors_file> keep;
  tensor_view v;
  {
    auto f = safetensors_file::open(dir / "m.safetensors");
    ASSERT_TRUE(f);
    v = *f->find("x");
    keep = *f;
  }
  EXPECT_EQ(std::memcmp(v.data(), data.data(), 16), 0);
}

TEST(safetensors, a_file_shorter_than_the_length_field_is_a_truncated_header) {
  temp_dir dir;
  write_bytes(dir / "bad.safetensors", {std::byte{1}, std::byte{0}, std::byte{0}});
  expect_load_error(safetensors_file::open(dir / "bad.safetensors"), load_error_code::truncated_header,
                    (dir / "bad.safetensors").string(), "");
}

TEST(safetensors, a_header_length_past_the_file_is_refused) {
  temp_dir dir;
  auto bytes = image("{}", {});
  bytes[0] = std::byte{200};  // 200 bytes of header in a 10-byte file
  write_bytes(dir / "bad.safetensors", bytes);
  expect_load_error(safetensors_file::open(dir / "bad.safetensors"), load_error_code::header_too_large,
                    (dir / "bad.safetensors").string(), "");
}

TEST(safetensors, a_header_that_is_not_json_is_a_bad_header) {
  temp_dir dir;
  expect_load_error(open_image(dir, R"({"x": {"dtype": "F32",)", {}), load_error_code::bad_header,
                    (dir / "bad.safetensors").string(), "x");
}

TEST(safetensors, a_file_cut_inside_the_data_is_truncated_data) {
  temp_dir dir;
  const auto a = pattern(16, 1), b = pattern(16, 2);
  const std::vector<named_view> written = {{"a", tensor_view(dtype::f32, {4}, a.data())},
                                           {"b", tensor_view(dtype::f32, {4}, b.data())}};
  ASSERT_TRUE(write_safetensors(dir / "cut.safetensors", written));
  auto bytes = read_bytes(dir / "cut.safetensors");
  bytes.erase(bytes.end() - 5, bytes.end());
  write_bytes(dir / "cut.safetensors", bytes);
  expect_load_error(safetensors_file::open(dir / "cut.safetensors"), load_error_code::truncated_data,
                    (dir / "cut.safetensors").string(), "b");
}

TEST(safetensors, offsets_past_the_data_section_are_out_of_range) {
  temp_dir dir;
  expect_load_error(
      open_image(dir, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [64, 80]}})", pattern(16, 0)),
      load_error_code::tensor_out_of_range, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, overlapping_tensors_are_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir,
                               R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                               pattern(24, 0)),
                    load_error_code::tensor_overlap, (dir / "bad.safetensors").string(), "b");
}

TEST(safetensors, a_shape_whose_element_count_overflows_is_refused) {
  temp_dir dir;
  expect_load_error(
      open_image(dir, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", {}),
      load_error_code::shape_overflow, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, an_unknown_dtype_is_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir, R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})", pattern(1, 0)),
                    load_error_code::unknown_dtype, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, a_tensor_name_given_twice_is_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir,
                               R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                                   "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                               pattern(2, 0)),
                    load_error_code::duplicate_name, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, a_metadata_key_given_twice_is_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir, R"({"__metadata__": {"format": "pt", "format": "np"}})", {}),
                    load_error_code::duplicate_name, (dir / "bad.safetensors").string(), "__metadata__.format");
}

TEST(safetensors, a_key_that_is_not_utf8_is_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir, "{\"w\xff\xfe\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
                               pattern(1, 0)),
                    load_error_code::non_utf8_key, (dir / "bad.safetensors").string(), "w\\xff");
}

TEST(safetensors, offsets_that_disagree_with_dtype_and_shape_are_a_bad_header) {
  temp_dir dir;
  expect_load_error(open_image(dir, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})", pattern(16, 0)),
                    load_error_code::bad_header, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, an_entry_with_an_extra_field_is_a_bad_header) {
  temp_dir dir;
  expect_load_error(
      open_image(dir, R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "scale": 2}})", pattern(1, 0)),
      load_error_code::bad_header, (dir / "bad.safetensors").string(), "w");
}

TEST(safetensors, metadata_that_is_not_string_to_string_is_refused) {
  temp_dir dir;
  expect_load_error(open_image(dir, R"({"__metadata__": {"step": 3}})", {}), load_error_code::bad_metadata,
                    (dir / "bad.safetensors").string(), "__metadata__.step");
}

TEST(safetensors, writer_refuses_what_the_format_cannot_hold) {
  temp_dir dir;
  const auto data = pattern(64, 0);
  const auto path = dir / "w.safetensors";
  const std::vector<named_view> quantized = {{"q", tensor_view(dtype::q4_0, {1, 32}, data.data())}};
  expect_load_error(write_safetensors(path, quantized), load_error_code::unknown_dtype, path.string(), "q");
  const std::vector<named_view> twice = {{"a", tensor_view(dtype::u8, {1}, data.data())},
                                         {"a", tensor_view(dtype::u8, {1}, data.data())}};
  expect_load_error(write_safetensors(path, twice), load_error_code::duplicate_name, path.string(), "a");
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Two shards and an index, as Hugging Face writes them.
void write_sharded(const temp_dir& dir, std::string_view index) {
  const auto a = pattern(8, 1), b = pattern(12, 2), c = pattern(4, 3);
  const std::vector<named_view> s1 = {{"embed.weight", tensor_view(dtype::bf16, {2, 2}, a.data())},
                                      {"layers.0.w", tensor_view(dtype::i32, {3}, b.data())}};
  const std::vector<named_view> s2 = {{"lm_head.weight", tensor_view(dtype::i8, {4}, c.data())}};
  ASSERT_TRUE(write_safetensors(dir / "model-00001-of-00002.safetensors", s1));
  ASSERT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors", s2));
  write_text(dir / "model.safetensors.index.json", index);
}

constexpr std::string_view good_index = R"({
  "metadata": {"total_size": 24},
  "weight_map": {
    "embed.weight": "model-00001-of-00002.safetensors",
    "layers.0.w": "model-00001-of-00002.safetensors",
    "lm_head.weight": "model-00002-of-00002.safetensors"
  }
})";

TEST(safetensors_dir, reads_a_sharded_checkpoint_through_its_index) {
  temp_dir dir;
  write_sharded(dir, good_index);
  auto d = open_safetensors_dir(dir.path());
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->shards().size(), 2u);
  EXPECT_EQ(d->names(), (std::vector<std::string>{"embed.weight", "layers.0.w", "lm_head.weight"}));
  EXPECT_EQ(d->total_bytes(), 24u);
  const auto v = d->find("lm_head.weight");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->type(), dtype::i8);
  EXPECT_EQ(std::memcmp(v->data(), pattern(4, 3).data(), 4), 0);
  EXPECT_FALSE(d->find("absent"));
}

TEST(safetensors_dir, reads_a_single_file_checkpoint) {
  temp_dir dir;
  const auto a = pattern(8, 1);
  const std::vector<named_view> t = {{"w", tensor_view(dtype::f64, {1}, a.data())}};
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", t));
  auto d = open_safetensors_dir(dir.path());
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->names(), std::vector<std::string>{"w"});
}

TEST(safetensors_dir, an_index_entry_missing_from_its_shard_is_named) {
  temp_dir dir;
  write_sharded(dir, R"({"weight_map": {"embed.weight": "model-00002-of-00002.safetensors",
                                         "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  expect_load_error(open_safetensors_dir(dir.path()), load_error_code::missing_key,
                    (dir / "model-00002-of-00002.safetensors").string(), "embed.weight");
}

TEST(safetensors_dir, a_tensor_stored_in_two_shards_is_a_duplicate) {
  temp_dir dir;
  write_sharded(dir, good_index);
  const auto a = pattern(4, 1);
  const std::vector<named_view> again = {{"layers.0.w", tensor_view(dtype::i32, {1}, a.data())}};
  ASSERT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors", again));
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map": {"layers.0.w": "model-00001-of-00002.safetensors",
                                "x": "model-00002-of-00002.safetensors"}})");
  expect_load_error(open_safetensors_dir(dir.path()), load_error_code::duplicate_name,
                    (dir / "model-00002-of-00002.safetensors").string(), "layers.0.w");
}

TEST(safetensors_dir, a_shard_outside_the_directory_or_absent_is_refused) {
  temp_dir dir;
  write_sharded(dir, R"({"weight_map": {"w": "../elsewhere.safetensors"}})");
  expect_load_error(open_safetensors_dir(dir.path()), load_error_code::bad_header,
                    (dir / "model.safetensors.index.json").string(), "w");
  write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"w": "gone.safetensors"}})");
  expect_load_error(open_safetensors_dir(dir.path()), load_error_code::io, (dir / "gone.safetensors").string(), "");
}

TEST(safetensors_dir, a_directory_without_a_checkpoint_is_an_io_error) {
  temp_dir dir;
  expect_load_error(open_safetensors_dir(dir.path()), load_error_code::io, dir.path().string(), "");
}

}  // namespace
}  // namespace troupe::load
