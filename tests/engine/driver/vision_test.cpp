// Images through the driver (docs/vision.md): request inputs bound per row from each sequence's values
// by the positions the row feeds, rows with images batched with rows without, prefill chunks that
// never split an image's rows, and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"
#include "tests/support/driver_fixture.hpp"

namespace troupe::driver {
namespace {

namespace fs = std::filesystem;

struct files {
  fs::path hf, text, mmproj;
  families::image_u8 wide, square;
};

const files& fixture() {
  static const files f = [] {
    const auto dir = fs::temp_directory_path() / ("troupe-vision-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    families::vlm_fixture v;
    v.text.vocab = 512, v.text.hidden = 64, v.text.ffn = 128, v.text.layers = 2, v.text.heads = 4, v.text.kv_heads = 2, v.text.head_dim = 16;
    files out{dir / "hf", dir / "text.gguf", dir / "mmproj.gguf", {}, {}};
    auto w = families::write_vlm_fixture(v, out.hf, out.text, out.mmproj);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
    for (auto [name, wdt, hgt, img] : {std::tuple{"wide.png", 48, 40, &out.wide}, std::tuple{"square.png", 32, 32, &out.square}}) {
      EXPECT_TRUE(families::write_test_image(dir / name, wdt, hgt, 3));
      std::ifstream f(dir / name, std::ios::binary);
      std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      auto d = families::decode_image(bytes);
      EXPECT_TRUE(d) << (d ? "" : d.error().message());
      if (d) *img = std::move(*d);
    }
    return out;
  }();
  return f;
}

std::shared_ptr<const families::model_handle> load_gguf() {
  auto h = families::model_handle::load(fixture().text, families::registry::builtin(), fixture().mmproj);
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

driver_options options(std::int64_t chunk = 32) {
  driver_options o;
  o.max_rows = 4;
  o.capacity = 96;
  o.block_size = 8;
  o.prefill_chunk = chunk;
  o.prefix_cache = false;
  return o;
}

constexpr std::int32_t begin = 509;  // <start_of_image> (vocab - 3)

std::vector<std::int32_t> prompt(int i, bool image) {
  std::vector<std::int32_t> p;
  for (int t = 0; t < 6 + i; ++t) p.push_back(300 + 7 * t + i);
  if (image) p.push_back(begin);
  for (int t = 0; t < 3; ++t) p.push_back(400 + t + i);
  return p;
}

void expect_same(const test::run_result& a, const test::run_result& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (std::size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 2e-4) << what << " at " << i;
}

TEST(vision, the_tower_gives_one_row_per_pooled_patch_group) {
  exec::cpu::cpu_executor ex;
  auto d = test::serve(load_gguf(), ex, options());
  auto e = d.encode_image(fixture().wide);
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_EQ(e->shape().str(), "[4, 64]");
  // The Hugging Face form's tower: the same rows.
  auto h = families::model_handle::load(fixture().hf, families::registry::builtin());
  ASSERT_TRUE(h) << families::message(h.error());
  ASSERT_NE((*h)->vision(), nullptr);
  exec::cpu::cpu_executor ex2;
  auto d2 = test::serve(*h, ex2, options());
  auto e2 = d2.encode_image(fixture().wide);
  ASSERT_TRUE(e2);
  for (std::int64_t i = 0; i < e->numel(); ++i) ASSERT_NEAR(e->as<float>()[i], e2->as<float>()[i], 1e-5) << i;
}

// Rows with images (two different ones) and a row without, batched: each equals its own run alone.
TEST(vision, rows_with_and_without_images_share_steps_and_keep_their_outputs) {
  exec::cpu::cpu_executor ex;
  auto d = test::serve(load_gguf(), ex, options());
  const families::image_u8* imgs[] = {&fixture().wide, &fixture().square, nullptr};
  std::vector<seq_request> reqs;
  for (int i = 0; i < 3; ++i) {
    auto r = test::request(prompt(i, imgs[i] != nullptr), 8, 0.0f, 1);
    auto w = d.with_images(r, imgs[i] ? std::span<const families::image_u8>(imgs[i], 1) : std::span<const families::image_u8>{});
    ASSERT_TRUE(w) << w.error().message();
    reqs.push_back(std::move(*w));
  }
  EXPECT_EQ(reqs[0].prompt.size(), prompt(0, true).size() + 5);  // four image rows and the end token
  EXPECT_TRUE(reqs[2].inputs.empty());
  const auto got = test::run_all(d, reqs);
  EXPECT_LT(d.counters().executor_steps, 3 * 9) << "the rows must share steps";
  for (int i = 0; i < 3; ++i) {
    exec::cpu::cpu_executor ref_ex;
    auto ref = test::serve(load_gguf(), ref_ex, options());
    expect_same(got[static_cast<std::size_t>(i)], test::run_all(ref, {reqs[static_cast<std::size_t>(i)]})[0], "row " + std::to_string(i));
  }
  // The images reach the text, and their rows see each other both ways.
  auto same_prompt_other_image = d.with_images(test::request(prompt(0, true), 8, 0.0f, 1), std::span(&fixture().square, 1));
  ASSERT_TRUE(same_prompt_other_image);
  auto causal = reqs[0];
  causal.inputs.erase("attend_until");
  const auto other = test::run_all(d, {*same_prompt_other_image, causal});
  double moved = 0, mask = 0;
  for (std::size_t i = 0; i < got[0].logprobs.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::fabs(got[0].logprobs[i] - other[0].logprobs[i])));
    mask = std::max(mask, static_cast<double>(std::fabs(got[0].logprobs[i] - other[1].logprobs[i])));
  }
  EXPECT_GT(moved, 1e-2) << "another image left the output as it was";
  EXPECT_GT(mask, 1e-4) << "the image's rows attended causally with attend_until given";
}

// A prefill chunk that would end inside an image's rows ends before them: the output is the one a
// chunk holding the whole prompt gives.
TEST(vision, prefill_chunks_never_split_an_image) {
  exec::cpu::cpu_executor ex;
  auto whole = test::serve(load_gguf(), ex, options(32));
  auto r = whole.with_images(test::request(prompt(0, true), 6, 0.0f, 1), std::span(&fixture().wide, 1));
  ASSERT_TRUE(r);
  const auto want = test::run_all(whole, {*r});
  exec::cpu::cpu_executor ex2;
  auto chunked = test::serve(load_gguf(), ex2, options(8));  // the image's rows are positions 7..10
  expect_same(test::run_all(chunked, {*r})[0], want[0], "chunked prefill");
}

TEST(vision, refusals_are_typed) {
  exec::cpu::cpu_executor ex;
  auto d = test::serve(load_gguf(), ex, options(4));
  const families::image_u8 two[] = {fixture().wide, fixture().square};
  auto r = d.with_images(test::request(prompt(0, true), 4, 0.0f, 1), two);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, driver_error_code::bad_request);
  // The four image rows fit a prefill chunk of 4; a row reaching 7 positions on does not.
  auto ok = d.with_images(test::request(prompt(0, true), 4, 0.0f, 1), std::span(&fixture().wide, 1));
  ASSERT_TRUE(ok);
  auto far = *ok;
  auto& until = far.inputs.at("attend_until");
  until.values.as<std::int32_t>()[0] += 4;
  auto o = d.open(far);
  ASSERT_FALSE(o);
  EXPECT_EQ(o.error().code, driver_error_code::bad_input);
  auto undeclared = *ok;
  undeclared.inputs["no_such_input"] = undeclared.inputs.at("embed_mask");
  auto u = d.open(undeclared);
  ASSERT_FALSE(u);
  EXPECT_EQ(u.error().code, driver_error_code::bad_input);
  // Without a tower: program_not_offered.
  auto plain = families::model_handle::load(fixture().text, families::registry::builtin());
  ASSERT_TRUE(plain);
  exec::cpu::cpu_executor ex2;
  auto t = test::serve(*plain, ex2, options());
  auto e = t.encode_image(fixture().wide);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, driver_error_code::program_not_offered);
}

TEST(vision, malformed_image_bytes_are_refused) {
  const std::uint8_t junk[] = {0x89, 'P', 'N', 'G', 0, 1, 2, 3};
  EXPECT_FALSE(families::decode_image(junk));
  EXPECT_FALSE(families::decode_image({}));
}

}  // namespace
}  // namespace troupe::driver
