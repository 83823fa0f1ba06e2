#pragma once
// What the driver tests share: a family's small fixture (vocab 512, hidden 128, ffn 256, 2 layers, 4
// heads over 2 KV heads of 32) as GGUF in a given matrix format, a prepared driver, and a run of
// requests opened at once and stepped to their ends.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "engine/driver/driver.hpp"
#include "families/fixtures/fixture.hpp"
#include "families/registry.hpp"

namespace troupe::test {

inline families::fixture_dims small_dims(dtype format = dtype::f32) {
  families::fixture_dims d;
  d.vocab = 512;
  d.hidden = 128;
  d.ffn = 256;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 32;
  d.layers = 2;
  d.matrix_type = format;
  return d;
}

inline std::shared_ptr<const families::model_handle> small_fixture(std::string_view family = "llama", dtype format = dtype::f32) {
  namespace fs = std::filesystem;
  const auto d = small_dims(format);
  const auto dir = fs::temp_directory_path() / ("troupe-driver-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = dir / (std::string(family) + "_" + std::string(troupe::name(format)) + ".gguf");
  if (!fs::exists(path)) {
    auto w = families::write_fixture(family, d, path, true);
    EXPECT_TRUE(w) << (w ? "" : w.error().message());
  }
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

inline driver::driver<driver::serving> serve(std::shared_ptr<const families::model_handle> h, exec::executor& ex, driver::driver_options o) {
  auto d = driver::driver<driver::unprepared>(std::move(h), ex, std::move(o)).prepare();
  if (!d) {
    ADD_FAILURE() << d.error().second.message();
    std::abort();
  }
  return std::move(*d);
}

// A request that ignores eos; sampled (temperature > 0) with top_p 0.95 and the seed.
inline driver::seq_request request(std::vector<std::int32_t> p, std::int64_t max_tokens, float temperature = 0.0f, std::uint64_t seed = 0) {
  driver::seq_request r;
  r.prompt = std::move(p);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  if (temperature > 0) r.sampling.top_p = 0.95f;
  return r;
}

struct run_result {
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<float>> logits;
  std::optional<driver::finish_reason> finished;
};

// Opens every request at once and steps until all finish.
inline std::vector<run_result> run_all(driver::driver<driver::serving>& d, const std::vector<driver::seq_request>& reqs) {
  std::vector<driver::seq_id> ids;
  for (const auto& r : reqs) {
    auto id = d.open(r);
    EXPECT_TRUE(id) << (id ? "" : id.error().message());
    ids.push_back(id ? *id : 0);
  }
  std::map<driver::seq_id, run_result> out;
  for (int round = 0; round < 10000 && !d.idle(); ++round) {
    auto r = d.step();
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    if (!r) break;
    for (const auto& u : r->updates) {
      auto& o = out[u.id];
      o.tokens.insert(o.tokens.end(), u.tokens.begin(), u.tokens.end());
      for (const auto& p : u.picks) o.logprobs.push_back(p.logprob);
      o.logits.insert(o.logits.end(), u.logits.begin(), u.logits.end());
      if (u.finished) o.finished = u.finished;
    }
  }
  std::vector<run_result> res;
  for (auto id : ids) {
    res.push_back(out[id]);
    (void)d.release(id);
  }
  return res;
}

}  // namespace troupe::test
