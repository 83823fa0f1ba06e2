// Byte-exact parity with Hugging Face's tokenizers (the pinned Rust library, through its Node binding)
// on the seven real tokenizer files and a 3,000-string corpus: ids with and without special tokens,
// decode with and without skipping special tokens, round trips, and the streaming detokenizer against
// the batch decode. A red test names the tokenizer and prints each differing string with both id lists.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/text/text_codec.hpp"
#include "tests/engine/text/tokenizer_parity_support.hpp"

namespace troupe::text::testing {
namespace {

class tokenizer_parity : public ::testing::TestWithParam<std::string_view> {};

TEST_P(tokenizer_parity, ids_and_text_equal_hugging_face_on_the_corpus) {
  const std::string_view name = GetParam();
  const auto path = reference_tokenizer(name);
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/install-references";
  const auto rows = run_reference(path, name);
  ASSERT_EQ(rows.size(), corpus().size()) << "the reference script failed for " << name;
  auto codec = text_codec::open(path);
  ASSERT_TRUE(codec) << codec.error().message();

  std::size_t ids_equal = 0, plain_equal = 0, text_equal = 0, skip_equal = 0, round_trips = 0, ref_round_trips = 0,
              stream_equal = 0, reported = 0;
  for (std::size_t i = 0; i < corpus().size(); ++i) {
    const std::string& s = corpus()[i];
    const auto& ref = rows[i];
    auto ids = codec->encode(s, true);
    auto plain = codec->encode(s, false);
    ASSERT_TRUE(ids && plain) << escaped(s);
    const bool ok_ids = *ids == ref.ids, ok_plain = *plain == ref.plain;
    ids_equal += ok_ids;
    plain_equal += ok_plain;
    const std::string text = codec->decode(*plain, false);
    const std::string text_skip = codec->decode(*ids, true);
    text_equal += text == ref.text;
    skip_equal += text_skip == ref.text_skip;
    ref_round_trips += ref.text == s;
    round_trips += ref.text == s && text == s;
    stream_equal += stream(*codec, *plain, false) == text && stream(*codec, *ids, true) == text_skip;
    if ((!ok_ids || !ok_plain || text != ref.text || text_skip != ref.text_skip) && reported++ < 20) {
      ADD_FAILURE() << name << " string " << i << ": " << escaped(s) << "\n  troupe    " << id_list(*ids)
                    << "\n  reference " << id_list(ref.ids) << "\n  troupe plain    " << id_list(*plain)
                    << "\n  reference plain " << id_list(ref.plain) << "\n  troupe text    " << escaped(text)
                    << "\n  reference text " << escaped(ref.text) << "\n  troupe skip    " << escaped(text_skip)
                    << "\n  reference skip " << escaped(ref.text_skip);
    }
  }
  const std::size_t n = corpus().size();
  std::printf("parity %-12s ids %zu/%zu  plain %zu/%zu  decode %zu/%zu  decode(skip) %zu/%zu  round trip %zu/%zu  "
              "stream %zu/%zu\n",
              std::string(name).c_str(), ids_equal, n, plain_equal, n, text_equal, n, skip_equal, n, round_trips,
              ref_round_trips, stream_equal, n);
  EXPECT_EQ(ids_equal, n);
  EXPECT_EQ(plain_equal, n);
  EXPECT_EQ(text_equal, n);
  EXPECT_EQ(skip_equal, n);
  EXPECT_EQ(round_trips, ref_round_trips);
  EXPECT_EQ(stream_equal, n);
}

INSTANTIATE_TEST_SUITE_P(reference, tokenizer_parity, ::testing::ValuesIn(reference_names),
                         [](const auto& info) {
                           auto n = std::string(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');  // gtest names take no dashes
                           return n;
                         });

TEST(tokenizer_parity_corpus, is_large_and_deterministic) {
  EXPECT_GE(corpus().size(), 3000u);
  EXPECT_EQ(make_text_corpus(corpus_size), corpus());
}

}  // namespace
}  // namespace troupe::text::testing
