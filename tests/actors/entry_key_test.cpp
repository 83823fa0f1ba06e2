// An entry's key between a driver and its remote ranks (actors/entry_key.hpp): every shape the driver
// makes survives driver -> EntryKey -> bytes -> EntryKey -> driver with the head left out; keys out of
// range are refused by what is wrong; 20,000 random byte mutations of encoded keys never crash the
// decoder, and whatever decodes and converts encodes back to the same key.
#include <gtest/gtest.h>

#include <random>

#include "actors/entry_key.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace {

driver::entry_key key(std::int64_t rows, std::int64_t tokens, driver::head_kind head = driver::head_kind::sample) {
  driver::entry_key k;
  k.shape = families::step_shape(rows, tokens, 64).with_kv(families::kv_layout::paged(16, 32));
  k.head = head;
  return k;
}

std::vector<driver::entry_key> keys() {
  std::vector<driver::entry_key> out{key(1, 1), key(4, 1, driver::head_kind::logits), key(1, 16), key(1, 256)};
  driver::entry_key contiguous;
  contiguous.shape = families::step_shape(2, 3, 128).with_logits(families::logit_rows::all).with_hidden_carry(true);
  contiguous.carried = {"pixel_values", "mask"};
  out.push_back(contiguous);
  driver::entry_key encode;
  encode.program = families::program::encode;
  encode.shape = families::step_shape(1, 32, 32);
  out.push_back(encode);
  return out;
}

TEST(entry_key, round_trips_every_shape_through_the_wire_without_the_head) {
  for (const auto& k : keys()) {
    const auto bytes = transport::encode(to_wire(k));
    auto m = transport::decode(bytes);
    ASSERT_TRUE(m) << m.error().message();
    ASSERT_TRUE(std::holds_alternative<transport::entry_key>(*m));
    auto back = from_wire(std::get<transport::entry_key>(*m));
    ASSERT_TRUE(back) << back.error();
    auto want = k;
    want.head = driver::head_kind::sample;  // not on the wire
    EXPECT_EQ(*back, want) << k.str();
    EXPECT_EQ(back->str(), want.str());
  }
}

TEST(entry_key, keys_out_of_range_are_refused_by_what_is_wrong) {
  const auto good = to_wire(key(4, 1));
  std::vector<std::pair<transport::entry_key, std::string>> bad;
  auto with = [&](auto f, std::string why) {
    auto k = good;
    f(k);
    bad.emplace_back(k, std::move(why));
  };
  with([](auto& k) { k.rows = 0; }, "out of range");
  with([](auto& k) { k.tokens = -1; }, "out of range");
  with([](auto& k) { k.capacity = std::int64_t{1} << 40; }, "out of range");
  with([](auto& k) { k.block_size = 0; }, "needs a block size");
  with([](auto& k) { k.carried = {""}; }, "carried input");
  with([](auto& k) { k.carried.assign(65, "x"); }, "at most 64");
  for (const auto& [k, why] : bad) {
    auto r = from_wire(k);
    ASSERT_FALSE(r) << why;
    EXPECT_NE(r.error().find(why), std::string::npos) << r.error();
  }
}

TEST(entry_key, random_mutations_never_crash_and_accepted_keys_round_trip) {
  std::mt19937_64 rng(7);
  std::vector<std::string> seeds;
  for (const auto& k : keys()) seeds.push_back(transport::encode(to_wire(k)));
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) s[rng() % s.size()] = static_cast<char>(rng() & 0xff);
    auto m = transport::decode(s);
    if (!m || !std::holds_alternative<transport::entry_key>(*m)) continue;
    auto k = from_wire(std::get<transport::entry_key>(*m));
    if (!k) continue;
    ++accepted;
    auto again = from_wire(to_wire(*k));
    ASSERT_TRUE(again);
    EXPECT_EQ(*again, *k);
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace troupe::actors
