#include "engine/load/gguf.hpp"

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

constexpr std::uint32_t ggml_f32 = 0;

// GGUF bytes written by hand, field by field, for the files the writer refuses to produce.
class gguf_bytes {
 public:
  template <class T>
  gguf_bytes& put(T x) {
    const auto* p = reinterpret_cast<const std::byte*>(&x);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  gguf_bytes& raw(std::string_view s) {
    for (const char c : s) bytes.push_back(static_cast<std::byte>(c));
    return *this;
  }
  gguf_bytes& str(std::string_view s) { return put<std::uint64_t>(s.size()).raw(s); }
  gguf_bytes& header(std::uint32_t version, std::uint64_t tensors, std::uint64_t kvs) {
    return raw("GGUF").put(version).put(tensors).put(kvs);
  }
  gguf_bytes& kv_u32(std::string_view key, std::uint32_t v) {
    return str(key).put<std::uint32_t>(4).put(v);
  }
  gguf_bytes& kv_str(std::string_view key, std::string_view v) { return str(key).put<std::uint32_t>(8).str(v); }
  gguf_bytes& tensor(std::string_view name, std::vector<std::uint64_t> dims, std::uint32_t type,
                     std::uint64_t offset) {
    str(name).put(static_cast<std::uint32_t>(dims.size()));
    for (const auto d : dims) put(d);
    return put(type).put(offset);
  }
  gguf_bytes& pad(std::size_t alignment) {
    bytes.resize((bytes.size() + alignment - 1) / alignment * alignment);
    return *this;
  }
  gguf_bytes& data(const std::vector<std::byte>& d) {
    bytes.insert(bytes.end(), d.begin(), d.end());
    return *this;
  }

  std::vector<std::byte> bytes;
};

result<gguf_file, load_error> open_bytes(const temp_dir& dir, const gguf_bytes& b) {
  write_bytes(dir / "bad.gguf", b.bytes);
  return gguf_file::open(dir / "bad.gguf");
}

std::vector<dtype> gguf_dtypes() {
  std::vector<dtype> out;
  for (int i = 0; i < dtype_count; ++i)
    if (info(static_cast<dtype>(i)).gguf_id) out.push_back(static_cast<dtype>(i));
  return out;
}

TEST(gguf, round_trips_every_dtype_gguf_can_store_in_versions_2_and_3) {
  const auto types = gguf_dtypes();
  // f32 f16 bf16 f64 i8 i16 i32 i64, the twelve block types q4_0 .. q8_k, mxfp4, iq4_nl and iq4_xs.
  ASSERT_EQ(types.size(), 23u);
  for (const std::uint32_t version : {2u, 3u}) {
    temp_dir dir;
    std::vector<std::vector<std::byte>> storage;
    gguf_writer w({.version = version});
    std::vector<named_view> written;
    for (const auto t : types) {
      // Plain types get three dimensions; block types two rows of two blocks of raw block bytes.
      const troupe::shape s = is_quantized(t) ? troupe::shape{2, static_cast<std::int64_t>(2 * info(t).block_elems)}
                                              : troupe::shape{2, 3, 5};
      storage.push_back(pattern(*storage_bytes(t, static_cast<std::uint64_t>(s.numel())), static_cast<unsigned>(t)));
      written.push_back({"t." + std::string(name(t)), tensor_view(t, s, storage.back().data())});
      w.add_tensor(written.back().name, written.back().view);
    }
    const auto path = dir / "model.gguf";
    ASSERT_TRUE(w.write(path));

    auto f = gguf_file::open(path);
    ASSERT_TRUE(f) << f.error().message();
    EXPECT_EQ(f->version(), version);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->data_offset() % 32, 0u);
    ASSERT_EQ(f->tensors().size(), written.size());
    for (std::size_t i = 0; i < written.size(); ++i) {
      EXPECT_EQ(f->tensors()[i].name, written[i].name);  // file order is write order
      const auto v = f->find(written[i].name);
      ASSERT_TRUE(v) << written[i].name;
      EXPECT_EQ(v->type(), written[i].view.type());
      EXPECT_EQ(v->shape(), written[i].view.shape());
      // The mapping is page aligned, so an aligned offset makes an aligned pointer.
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v->data()) % 32, 0u) << written[i].name;
      ASSERT_EQ(v->bytes(), written[i].view.bytes());
      EXPECT_EQ(std::memcmp(v->data(), written[i].view.data(), v->bytes()), 0) << written[i].name;
    }
  }
}

TEST(gguf, writes_the_format_byte_for_byte_with_dimensions_fastest_first) {
  const auto data = pattern(24, 5);
  gguf_writer w;
  w.add("general.architecture", "llama");
  w.add_tensor("t", tensor_view(dtype::f32, {2, 3}, data.data()));
  auto bytes = w.serialize("mem");
  ASSERT_TRUE(bytes) << bytes.error().message();

  gguf_bytes expected;
  expected.header(3, 1, 1).kv_str("general.architecture", "llama").tensor("t", {3, 2}, ggml_f32, 0).pad(32);
  expected.data(data).pad(32);
  EXPECT_EQ(*bytes, expected.bytes);

  auto f = gguf_file::parse(*bytes, "mem");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->find("t")->shape(), (troupe::shape{2, 3}));
  // Zero copy: the view points into the caller's bytes.
  EXPECT_EQ(f->find("t")->data(), bytes->data() + f->data_offset());
}

gguf_value array_of(gguf_type t, std::vector<gguf_value> values) { return gguf_array{t, std::move(values)}; }

std::vector<gguf_kv> every_metadata_type() {
  return {
      {"u8", std::uint8_t{200}},
      {"i8", std::int8_t{-5}},
      {"u16", std::uint16_t{60000}},
      {"i16", std::int16_t{-300}},
      {"u32", std::uint32_t{4000000000u}},
      {"i32", std::int32_t{-2000000000}},
      {"f32", 1.25f},
      {"bool", true},
      {"string", "llama ünïcode"},
      {"u64", std::uint64_t{1} << 40},
      {"i64", -(std::int64_t{1} << 40)},
      {"f64", 0.1},
      {"array.u32", array_of(gguf_type::u32, {std::uint32_t{1}, std::uint32_t{2}, std::uint32_t{3}})},
      {"array.string", array_of(gguf_type::string, {"a", "", "ccc"})},
      {"array.bool", array_of(gguf_type::boolean, {true, false})},
      {"array.empty", array_of(gguf_type::f32, {})},
      {"array.nested",
       array_of(gguf_type::array, {array_of(gguf_type::i16, {std::int16_t{1}, std::int16_t{-2}}),
                                   array_of(gguf_type::i16, {}),
                                   array_of(gguf_type::i16, {std::int16_t{7}})})},
      {"array.deeper",
       array_of(gguf_type::array, {array_of(gguf_type::array, {array_of(gguf_type::f64, {1.5, -2.5})})})},
  };
}

TEST(gguf, metadata_of_every_type_round_trips_including_nested_arrays) {
  for (const std::uint32_t version : {2u, 3u}) {
    temp_dir dir;
    gguf_writer w({.version = version});
    const auto kvs = every_metadata_type();
    for (const auto& kv : kvs) w.add(kv.key, kv.value);
    ASSERT_TRUE(w.write(dir / "m.gguf"));
    auto f = gguf_file::open(dir / "m.gguf");
    ASSERT_TRUE(f) << f.error().message();
    ASSERT_EQ(f->metadata().size(), kvs.size());
    for (std::size_t i = 0; i < kvs.size(); ++i) {
      EXPECT_EQ(f->metadata()[i].key, kvs[i].key);
      EXPECT_TRUE(f->metadata()[i].value == kvs[i].value) << kvs[i].key;
      const auto v = f->find_value(kvs[i].key);
      ASSERT_TRUE(v) << kvs[i].key;
      EXPECT_EQ(v->get().type(), kvs[i].value.type());
    }
    EXPECT_FALSE(f->find_value("absent"));
    EXPECT_EQ(f->find_value("u8")->get().as_int(), 200);
    EXPECT_EQ(f->find_value("i64")->get().as_int(), -(std::int64_t{1} << 40));
    EXPECT_EQ(f->find_value("f32")->get().as_float(), 1.25);
    EXPECT_EQ(f->find_value("u32")->get().as_float(), 4e9);
    EXPECT_FALSE(f->find_value("bool")->get().as_int());
    EXPECT_EQ(*f->find_value("string")->get().get_if<std::string>(), "llama ünïcode");
    const auto* nested = f->find_value("array.nested")->get().get_if<gguf_array>();
    ASSERT_NE(nested, nullptr);
    EXPECT_EQ(nested->type, gguf_type::array);
    ASSERT_EQ(nested->size(), 3u);
    EXPECT_EQ(nested->array_at(0).at(1).as_int(), -2);
  }
}

TEST(gguf, arrays_are_compact_and_read_back_element_by_element) {
  gguf_array strings(gguf_type::string, {"a", "", "\xe2\x96\x81llama", "ccc"});
  ASSERT_EQ(strings.size(), 4u);
  EXPECT_EQ(strings.string_at(0), "a");
  EXPECT_EQ(strings.string_at(1), "");
  EXPECT_EQ(strings.string_at(2), "\xe2\x96\x81llama");
  EXPECT_EQ(*strings.at(3).get_if<std::string>(), "ccc");
  gguf_array ints(gguf_type::i32);
  for (std::int32_t i = -3; i < 1000; ++i) ints.emplace_back(i);
  ASSERT_EQ(ints.size(), 1003u);
  EXPECT_EQ(ints.scalar_at<std::int32_t>(0), -3);
  EXPECT_EQ(ints.at(1002).as_int(), 999);
  const gguf_array doubles(gguf_type::f64, {0.1, -2.5});
  EXPECT_EQ(doubles.scalar_at<double>(0), 0.1);
  EXPECT_EQ(doubles.at(1).as_float(), -2.5);
  EXPECT_FALSE(strings == gguf_array(gguf_type::string, {"a", "", "\xe2\x96\x81llama"}));
  EXPECT_TRUE(strings == gguf_array(gguf_type::string, {"a", "", "\xe2\x96\x81llama", "ccc"}));
  // "ab" + "c" is not "a" + "bc": the string boundaries are part of the array.
  EXPECT_FALSE(gguf_array(gguf_type::string, {"ab", "c"}) == gguf_array(gguf_type::string, {"a", "bc"}));
}

TEST(gguf, an_array_holding_an_element_of_another_type_is_refused_by_the_writer) {
  gguf_array a(gguf_type::u32, {std::uint32_t{1}});
  a.emplace_back("two");
  a.emplace_back(std::uint32_t{3});
  EXPECT_EQ(a.mismatch(), gguf_type::string);
  gguf_writer w;
  w.add("bad", a);
  const auto r = w.serialize("bad.gguf");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, load_error_code::bad_metadata);
  EXPECT_NE(r.error().message().find("an array of uint32 holds a string"), std::string::npos) << r.error().message();
}

TEST(gguf, a_custom_alignment_is_stored_and_honoured) {
  for (const std::uint32_t alignment : {1u, 64u, 256u}) {
    temp_dir dir;
    const auto a = pattern(6, 1), b = pattern(34, 2);
    gguf_writer w({.alignment = alignment});
    w.add_tensor("a", tensor_view(dtype::i16, {3}, a.data()));
    w.add_tensor("b", tensor_view(dtype::q8_0, {1, 32}, b.data()));
    ASSERT_TRUE(w.write(dir / "m.gguf"));
    auto f = gguf_file::open(dir / "m.gguf");
    ASSERT_TRUE(f) << f.error().message();
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    ASSERT_TRUE(f->find_value("general.alignment"));
    EXPECT_EQ(f->find_value("general.alignment")->get().as_int(), alignment);
    for (const auto& t : f->tensors())
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.view.data()) % alignment, 0u) << t.name;
    EXPECT_EQ(std::memcmp(f->find("b")->data(), b.data(), 34), 0);
  }
}

TEST(gguf, bad_magic_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.raw("GGML").put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(0);
  expect_load_error(open_bytes(dir, b), load_error_code::bad_magic, (dir / "bad.gguf").string(), "");
}

TEST(gguf, a_file_cut_inside_the_header_is_a_truncated_header) {
  temp_dir dir;
  gguf_writer w;
  w.add("general.name", "a name long enough to cut in half");
  auto bytes = w.serialize("mem");
  ASSERT_TRUE(bytes);
  bytes->resize(24 + 8 + 12 + 4 + 8 + 10);  // the fixed header, the key, its type, the length, half the value
  gguf_bytes cut;
  cut.data(*bytes);
  expect_load_error(open_bytes(dir, cut), load_error_code::truncated_header, (dir / "bad.gguf").string(),
                    "general.name");
}

TEST(gguf, counts_past_the_end_of_the_file_are_refused_before_allocating) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, std::uint64_t{1} << 40, 0);
  expect_load_error(open_bytes(dir, b), load_error_code::truncated_header, (dir / "bad.gguf").string(), "");
}

TEST(gguf, a_file_cut_inside_the_data_is_truncated_data) {
  temp_dir dir;
  const auto a = pattern(64, 1), b = pattern(64, 2);
  gguf_writer w;
  w.add_tensor("a", tensor_view(dtype::f32, {16}, a.data()));
  w.add_tensor("b", tensor_view(dtype::f32, {16}, b.data()));
  ASSERT_TRUE(w.write(dir / "cut.gguf"));
  auto bytes = read_bytes(dir / "cut.gguf");
  bytes.erase(bytes.end() - 5, bytes.end());
  write_bytes(dir / "cut.gguf", bytes);
  expect_load_error(gguf_file::open(dir / "cut.gguf"), load_error_code::truncated_data, (dir / "cut.gguf").string(),
                    "b");
}

TEST(gguf, tensor_data_past_the_data_section_is_out_of_range) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w", {4}, ggml_f32, 1024).pad(32).data(pattern(16, 0));
  expect_load_error(open_bytes(dir, b), load_error_code::tensor_out_of_range, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, overlapping_tensors_are_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 2, 0).tensor("a", {16}, ggml_f32, 0).tensor("b", {16}, ggml_f32, 32).pad(32).data(pattern(96, 0));
  expect_load_error(open_bytes(dir, b), load_error_code::tensor_overlap, (dir / "bad.gguf").string(), "b");
}

TEST(gguf, a_shape_whose_element_count_overflows_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w", {std::uint64_t{1} << 32, std::uint64_t{1} << 32}, ggml_f32, 0).pad(32);
  expect_load_error(open_bytes(dir, b), load_error_code::shape_overflow, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, an_unknown_ggml_type_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w", {256}, 16, 0).pad(32).data(pattern(256, 0));  // 16: IQ2_XXS
  expect_load_error(open_bytes(dir, b), load_error_code::unknown_dtype, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, a_tensor_name_given_twice_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 2, 0).tensor("w", {8}, ggml_f32, 0).tensor("w", {8}, ggml_f32, 32).pad(32).data(pattern(64, 0));
  expect_load_error(open_bytes(dir, b), load_error_code::duplicate_name, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, a_metadata_key_given_twice_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 0, 2).kv_str("general.name", "a").kv_str("general.name", "b");
  expect_load_error(open_bytes(dir, b), load_error_code::duplicate_name, (dir / "bad.gguf").string(),
                    "general.name");
}

TEST(gguf, a_metadata_key_that_is_not_utf8_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 0, 1).kv_u32("general.\xc3(", 1);
  expect_load_error(open_bytes(dir, b), load_error_code::non_utf8_key, (dir / "bad.gguf").string(),
                    "general.\\xc3(");
}

TEST(gguf, a_tensor_name_that_is_not_utf8_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w\xed\xa0\x80", {4}, ggml_f32, 0).pad(32).data(pattern(16, 0));  // a surrogate
  expect_load_error(open_bytes(dir, b), load_error_code::non_utf8_key, (dir / "bad.gguf").string(),
                    "w\\xed\\xa0\\x80");
}

TEST(gguf, versions_other_than_2_and_3_are_refused) {
  for (const std::uint32_t version : {1u, 4u, 0x03000000u /* a big-endian v3 */}) {
    temp_dir dir;
    gguf_bytes b;
    b.header(version, 0, 0);
    expect_load_error(open_bytes(dir, b), load_error_code::unsupported_version, (dir / "bad.gguf").string(), "");
  }
}

TEST(gguf, an_alignment_that_is_not_a_power_of_two_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 0, 1).kv_u32("general.alignment", 48);
  expect_load_error(open_bytes(dir, b), load_error_code::bad_alignment, (dir / "bad.gguf").string(),
                    "general.alignment");
}

TEST(gguf, a_tensor_offset_off_the_alignment_is_refused) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w", {4}, ggml_f32, 8).pad(32).data(pattern(32, 0));
  expect_load_error(open_bytes(dir, b), load_error_code::bad_alignment, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, more_than_four_dimensions_is_a_bad_header) {
  temp_dir dir;
  gguf_bytes b;
  b.header(3, 1, 0).tensor("w", {1, 1, 1, 1, 1}, ggml_f32, 0).pad(32).data(pattern(4, 0));
  expect_load_error(open_bytes(dir, b), load_error_code::bad_header, (dir / "bad.gguf").string(), "w");
}

TEST(gguf, malformed_metadata_values_are_refused) {
  temp_dir dir;
  gguf_bytes bad_bool;
  bad_bool.header(3, 0, 1).str("flag").put<std::uint32_t>(7).put<std::uint8_t>(2);
  expect_load_error(open_bytes(dir, bad_bool), load_error_code::bad_metadata, (dir / "bad.gguf").string(), "flag");

  gguf_bytes bad_type;
  bad_type.header(3, 0, 1).str("k").put<std::uint32_t>(13).put<std::uint32_t>(0);
  expect_load_error(open_bytes(dir, bad_type), load_error_code::bad_metadata, (dir / "bad.gguf").string(), "k");

  // 40 levels of arrays of one array each.
  gguf_bytes deep;
  deep.header(3, 0, 1).str("deep").put<std::uint32_t>(9);
  for (int i = 0; i < 40; ++i) deep.put<std::uint32_t>(9).put<std::uint64_t>(1);
  deep.put<std::uint32_t>(0).put<std::uint64_t>(0);
  expect_load_error(open_bytes(dir, deep), load_error_code::bad_metadata, (dir / "bad.gguf").string(), "deep");

  gguf_bytes long_string;
  long_string.header(3, 0, 1).str("s").put<std::uint32_t>(8).put<std::uint64_t>(1000).raw("short");
  expect_load_error(open_bytes(dir, long_string), load_error_code::truncated_header, (dir / "bad.gguf").string(),
                    "s");
}

TEST(gguf, writer_refuses_what_the_format_cannot_hold) {
  temp_dir dir;
  const auto path = dir / "w.gguf";
  const auto data = pattern(64, 0);
  {
    gguf_writer w;
    w.add_tensor("fp8", tensor_view(dtype::fp8_e4m3, {4}, data.data()));
    expect_load_error(w.write(path), load_error_code::unknown_dtype, path.string(), "fp8");
  }
  {
    gguf_writer w;
    w.add_tensor("r5", tensor_view(dtype::i8, {1, 1, 1, 1, 2}, data.data()));
    expect_load_error(w.write(path), load_error_code::bad_header, path.string(), "r5");
  }
  {
    gguf_writer w;
    w.add("mixed", array_of(gguf_type::u32, {std::uint32_t{1}, std::int32_t{2}}));
    expect_load_error(w.write(path), load_error_code::bad_metadata, path.string(), "mixed");
  }
  {
    gguf_writer w;
    w.add("k", 1);
    w.add("k", 2);
    expect_load_error(w.write(path), load_error_code::duplicate_name, path.string(), "k");
  }
  {
    gguf_writer w({.alignment = 48});
    expect_load_error(w.write(path), load_error_code::bad_alignment, path.string(), "general.alignment");
    gguf_writer v1({.version = 1});
    expect_load_error(v1.write(path), load_error_code::unsupported_version, path.string(), "");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace troupe::load
