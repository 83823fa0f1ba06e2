// The text a remote rank compiles an entry from (driver::entry_wire, driver::parse_entry): every shape
// the driver makes survives the round trip with the head left out, and malformed lines (wrong field
// counts, numbers out of range or not numbers, unknown words, a paged layout without blocks, oversized
// lines) are refused by what is wrong. 20,000 random mutations of valid lines never crash and whatever
// is accepted writes back to a line that parses to the same entry: the parser's fuzz check in the unit
// suite (the libFuzzer build uses clang 14, which cannot compile the driver's headers).
#include <gtest/gtest.h>

#include <random>

#include "engine/driver/driver.hpp"

namespace troupe::driver {
namespace {

entry_key key(std::int64_t rows, std::int64_t tokens, head_kind head = head_kind::sample) {
  entry_key k;
  k.shape = families::step_shape(rows, tokens, 64).with_kv(families::kv_layout::paged(16, 32));
  k.head = head;
  return k;
}

TEST(entry_wire, round_trips_every_shape_without_the_head) {
  std::vector<entry_key> keys{key(1, 1), key(4, 1, head_kind::logits), key(1, 16), key(1, 256)};
  entry_key contiguous;
  contiguous.shape = families::step_shape(2, 3, 128).with_logits(families::logit_rows::all).with_hidden_carry(true);
  contiguous.carried = {"pixel_values", "mask"};
  keys.push_back(contiguous);
  entry_key encode;
  encode.program = families::program::encode;
  encode.shape = families::step_shape(1, 32, 32);
  keys.push_back(encode);
  for (const auto& k : keys) {
    const auto text = entry_wire(k);
    auto back = parse_entry(text);
    ASSERT_TRUE(back) << text << ": " << back.error();
    entry_key want = k;
    want.head = head_kind::sample;  // not on the wire
    EXPECT_EQ(*back, want) << text;
    EXPECT_EQ(entry_wire(*back), text);
  }
  EXPECT_EQ(entry_wire(key(4, 1)), "step 4 1 64 paged 16 32 last 0");
  EXPECT_EQ(entry_wire(key(4, 1)), entry_wire(key(4, 1, head_kind::logits)));
}

TEST(entry_wire, malformed_lines_are_refused_by_what_is_wrong) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"", "9 fields"},
      {"step 4 1 64 paged 16 32 last", "9 fields"},
      {"train 4 1 64 paged 16 32 last 0", "unknown program"},
      {"step 0 1 64 paged 16 32 last 0", "not integers in range"},
      {"step 4 x 64 paged 16 32 last 0", "not integers in range"},
      {"step 4 1 -64 paged 16 32 last 0", "not integers in range"},
      {"step 4 1 64 paged 16 99999999999999999999 last 0", "not integers in range"},
      {"step 4 1 64 striped 16 32 last 0", "unknown KV layout"},
      {"step 4 1 64 paged 0 32 last 0", "needs a block size"},
      {"step 4 1 64 paged 16 32 first 0", "unknown logit rows"},
      {"step 4 1 64 paged 16 32 last 2", "hidden carry"},
      {"step 4 1 64 paged 16 32 last 0 mask", "+name"},
      {std::string(5000, 's'), "4096"},
  };
  for (const auto& [line, why] : bad) {
    auto r = parse_entry(line);
    ASSERT_FALSE(r) << line;
    EXPECT_NE(r.error().find(why), std::string::npos) << line << ": " << r.error();
  }
}

TEST(entry_wire, random_mutations_never_crash_and_accepted_lines_round_trip) {
  std::mt19937_64 rng(7);
  const std::vector<std::string> seeds{entry_wire(key(4, 1)), entry_wire(key(1, 256)), "step 2 3 128 contiguous 0 0 all 1 +a +b",
                                       "encode 1 32 32 contiguous 0 0 last 0"};
  const std::string alphabet = " +-0123456789abcdeglnprstuvxz\t\n\x01\xff";
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const auto at = s.empty() ? 0 : rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), alphabet[rng() % alphabet.size()]); break;
        case 1: if (at < s.size()) s.erase(at, 1); break;
        default: if (at < s.size()) s[at] = alphabet[rng() % alphabet.size()]; break;
      }
    }
    auto k = parse_entry(s);
    if (!k) continue;
    ++accepted;
    auto again = parse_entry(entry_wire(*k));
    ASSERT_TRUE(again) << s;
    EXPECT_EQ(*again, *k) << s;
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace troupe::driver
