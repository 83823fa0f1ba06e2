// Every message kind round-trips through the codec; malformed, truncated, oversized, over-deep and
// unknown messages are typed refusals.
#include "transport/codec.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

namespace troupe::transport {
namespace {

sampling full_sampling() {
  sampling s;
  s.temperature = 0.7f;
  s.top_k = 40;
  s.top_p = 0.9f;
  s.min_p = 0.05f;
  s.repetition_penalty = 1.1f;
  s.presence_penalty = 0.5f;
  s.frequency_penalty = 0.25f;
  s.top_logprobs = 3;
  s.seed = 0xdeadbeefcafeull;
  s.logit_bias = {{5, -100.0f}, {7, 2.5f}};
  return s;
}

std::vector<message> one_of_each() {
  std::vector<message> all;
  job_submit j;
  j.job_id = 42;
  j.model = "qwen";
  j.prompt = std::vector<std::int32_t>{1, 2, 3};
  j.sampling = full_sampling();
  j.stop = {"\n\n", "END"};
  j.stop_ids = {2};
  j.max_tokens = 77;
  j.ignore_eos = true;
  j.inputs = {{"embeds", troupe::dtype::f32, {2, 4}, std::string(32, '\x01'), {0, 3}}};
  j.priority = -3;
  j.deadline_ms = 1500;
  j.tools_json = R"([{"type":"function"}])";
  j.prior_output = {9, 8};
  j.no_speculation = true;
  j.beams = 4;
  j.length_penalty = 0.5f;
  j.early_stopping = true;
  all.push_back(j);
  j.prompt = std::string("héllo wörld");
  all.push_back(j);
  j.prompt = std::vector<chat_message>{{"system", "be brief"}, {"user", "hi"}};
  all.push_back(j);
  all.push_back(token_chunk{9, {5, 6}, "ab", {{5, -0.5f, {{5, -0.5f}, {8, -1.5f}}}, {6, -0.25f, {}}}, finish_reason::length, {10, 2, 8}});
  token_chunk beamed{9, {5, 6}, "ab", {}, finish_reason::eos, {10, 2, 0}};
  beamed.beams = {{{5, 6}, "ab", -1.5, -0.75, finish_reason::eos}, {{5, 7}, "ac", -2.0, -1.0, finish_reason::length}};
  all.push_back(beamed);
  all.push_back(cancel_job{9});
  all.push_back(error{9, error_code::overloaded, "too many jobs", retry::overloaded});
  entry_key ek{program_kind::step, 2, 1, 64, kv_layout::paged, 16, 32, logit_rows::all, true, {"mask"}};
  all.push_back(step_batch{ek, {1, 2}, {0, 7}, {3, 4}, {0, 1, -1, 2}, {{1, 0, full_sampling(), true}, {2, 5, {}, false}}});
  all.push_back(ek);
  all.push_back(load_request{"/m.gguf", "cpu:0", "layers 0-11", 16, 1024, 16, 1024, 256, 512, true, false, 4, 2, true, 3, "replica-7", 42});
  all.push_back(load_request{"/m.gguf", "cpu:0", "", 16, 1024, 16, 0, 256, 512, false, false, 0, 0, false, 0, "", 0, true, "model", "/d.gguf", 5});
  all.push_back(node_hello{"node-1", "127.0.0.1", 4242, {{"cpu:0", device_kind::cpu, 1ull << 34}}});
  all.push_back(inventory{{{"node-1", {{"cpu:0", device_kind::cpu, 1}}},
                           {"node-2", {{"cuda:0", device_kind::cuda, 2}, {"cuda:1", device_kind::cuda, 3}}}}});
  all.push_back(deploy{"m", 2, {"/m.gguf", "cpu:0", "", 4, 256, 16, 0}, "capacity"});
  all.push_back(scale{"m", 3});
  all.push_back(stats{1, 2, 3, 4, 123.5, 6, 7, 8, 9, 10, 11});
  all.push_back(resolved_model{"/m.gguf", "llama", 123456, 2048, 4, 1000, 200, 300, 1024, 5000, 8, 2, true, ""});
  cluster_status cs;
  cs.nodes.push_back({"node-1", {{"cpu:0", device_kind::cpu, 1ull << 30}}, "ready", 2, 1ull << 24});
  cs.replicas.push_back({7, "m", {"node-1", "node-2"}, {"node-1/cpu:0", "node-2/cpu:0"}, replica_state::draining, 3, 10, 12, 1, 2});
  cs.deployments.push_back({"m", "/m.gguf", 2, 1, "llama"});
  cs.jobs = 5;
  cs.refused = 1;
  all.push_back(cs);
  return all;
}

TEST(codec, every_message_kind_round_trips) {
  std::set<std::size_t> kinds;
  for (const auto& m : one_of_each()) {
    SCOPED_TRACE(std::string(kind(m)));
    const auto bytes = encode(m);
    EXPECT_EQ(bytes.size() % 8, 0u);
    auto back = decode(bytes);
    ASSERT_TRUE(back) << back.error().message();
    EXPECT_EQ(*back, m);
    kinds.insert(m.index());
  }
  EXPECT_EQ(kinds.size(), std::variant_size_v<message>);
}

TEST(codec, defaults_survive_a_round_trip) {
  job_submit j;
  j.prompt = std::vector<std::int32_t>{};
  auto back = decode(encode(j));
  ASSERT_TRUE(back);
  EXPECT_EQ(std::get<job_submit>(*back), j);
  EXPECT_EQ(std::get<job_submit>(*back).sampling.top_p, 1.0f);
}

TEST(codec, size_and_framing_refusals) {
  const auto good = encode(cancel_job{1});
  EXPECT_EQ(decode("").error().code, decode_error_code::not_words);
  EXPECT_EQ(decode(good.substr(0, good.size() - 3)).error().code, decode_error_code::not_words);
  decode_limits small;
  small.max_bytes = 8;
  EXPECT_EQ(decode(good, small).error().code, decode_error_code::too_large);
}

TEST(codec, truncated_messages_are_malformed) {
  for (const auto& m : one_of_each()) {
    const auto bytes = encode(m);
    for (std::size_t cut = 8; cut < bytes.size(); cut += 8) {
      auto r = decode(std::string_view(bytes).substr(0, cut));
      // A prefix may still frame a valid smaller message only if the segment table says so; it never
      // does here, since the table names the full length.
      ASSERT_FALSE(r) << kind(m) << " cut at " << cut;
      EXPECT_EQ(r.error().code, decode_error_code::malformed);
    }
  }
}

TEST(codec, garbage_is_refused_without_throwing) {
  std::mt19937_64 rng(7);
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b(8 * (1 + rng() % 16), '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    if (i % 3 == 0) std::memset(b.data(), 0, 4);  // one segment: a more plausible frame
    auto r = decode(b);
    refused += !r;
  }
  EXPECT_GT(refused, 15000);
  // Mutations of valid messages: any outcome but a crash or exception; many stay decodable.
  for (const auto& m : one_of_each()) {
    auto bytes = encode(m);
    for (int i = 0; i < 500; ++i) {
      auto b = bytes;
      b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8));
      (void)decode(b);
    }
  }
}

// A list of empty structs costs no bytes per element: a 1-row step batch rewritten to claim 114,688
// rows of zero words each (the transport fuzzer's finding: 376 bytes that re-encoded past 8 MiB) is
// refused, not materialised.
TEST(codec, a_list_of_empty_structs_does_not_amplify) {
  step_batch b;
  b.rows.push_back({7, 1, {}, true});
  auto bytes = encode(b);
  const auto words = bytes.size() / 8;
  auto word = [&](std::size_t i) {
    std::uint64_t w;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    return w;
  };
  auto set = [&](std::size_t i, std::uint64_t w) { std::memcpy(bytes.data() + 8 * i, &w, 8); };
  // The rows list: an inline-composite list pointer (element size 7) whose tag word says 1 element.
  bool patched = false;
  for (std::size_t i = 0; i + 1 < words && !patched; ++i) {
    const auto p = word(i);
    if ((p & 3) != 1 || ((p >> 32) & 7) != 7) continue;
    const auto offset = static_cast<std::int32_t>(static_cast<std::uint32_t>(p) >> 2);
    const auto tag_at = static_cast<std::size_t>(static_cast<std::int64_t>(i) + 1 + offset);
    if (tag_at >= words) continue;
    const auto tag = word(tag_at);
    if (((static_cast<std::uint32_t>(tag) >> 2) & 0x3fffffff) != 1) continue;
    set(i, (p & 0x7ffffffffull) | (0ull << 35));       // 0 words of elements
    set(tag_at, (std::uint64_t{114688} << 2));            // 114,688 elements of 0 data words, 0 pointers
    patched = true;
  }
  ASSERT_TRUE(patched);
  auto r = decode(bytes);
  if (r) {
    ASSERT_TRUE(std::holds_alternative<step_batch>(*r));
    EXPECT_LE(std::get<step_batch>(*r).rows.size(), 2 * words) << "rows materialised from " << bytes.size() << " bytes";
  } else {
    EXPECT_EQ(r.error().code, decode_error_code::malformed) << r.error().message();
  }
}

TEST(codec, depth_and_traversal_limits_are_enforced) {
  cluster_status nested;
  nested.replicas.push_back({1, "m", {"node-1"}, {"node-1/cuda:0"}, replica_state::serving, 0, 0, 0, 1, 1});
  const auto plan = encode(nested);
  decode_limits shallow;
  shallow.nesting = 2;
  auto r = decode(plan, shallow);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, decode_error_code::malformed);

  token_chunk big;
  big.ids.assign(100000, 7);
  const auto bytes = encode(big);
  decode_limits tight;
  tight.traversal_words = 1000;
  auto t = decode(bytes, tight);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().code, decode_error_code::malformed);
  EXPECT_TRUE(decode(bytes));
}

TEST(codec, unknown_kinds_and_versions_are_typed) {
  auto bytes = encode(cancel_job{5});
  // Flat layout: segment table (8 bytes), root pointer (8), then Envelope's data: version (4 bytes),
  // the body's union discriminant (2 bytes).
  std::uint16_t which = 99;
  std::memcpy(bytes.data() + 20, &which, 2);
  auto r = decode(bytes);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, decode_error_code::unknown_kind);
  EXPECT_EQ(r.error().retry(), retry::unimplemented);

  auto v = encode(cancel_job{5});
  std::memset(v.data() + 16, 0, 4);
  EXPECT_EQ(decode(v).error().code, decode_error_code::bad_version);

  // A newer version is read (unknown fields are ignored).
  auto newer = encode(cancel_job{5});
  std::uint32_t nine = 9;
  std::memcpy(newer.data() + 16, &nine, 4);
  auto n = decode(newer);
  ASSERT_TRUE(n);
  EXPECT_EQ(std::get<cancel_job>(*n).job_id, 5u);
}

TEST(codec, out_of_range_values_are_refused) {
  job_submit j;
  j.prompt = std::string("x");
  j.max_tokens = -1;
  EXPECT_EQ(decode(encode(j)).error().code, decode_error_code::bad_value);
  EXPECT_EQ(decode(encode(scale{"m", -2})).error().code, decode_error_code::bad_value);
}

}  // namespace
}  // namespace troupe::transport
