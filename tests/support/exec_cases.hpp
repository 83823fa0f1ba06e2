#pragma once
// The model cases every executor's parity test runs: a family's fixture in a weight format and
// checkpoint form, written to a temporary directory and loaded (tests/engine/exec/cpu and cuda).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <span>
#include <vector>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "apps/exec_runner.hpp"
#include "apps/oracle_runner.hpp"
#include "families/fixtures/fixture.hpp"
#include "tests/support/logprobs.hpp"
#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::testing {

struct model_case {
  std::string_view family;
  dtype format;
  bool gguf;
};

inline std::string case_name(const model_case& c) {
  return std::string(c.family) + "_" + std::string(troupe::name(c.format)) + (c.gguf ? "_gguf" : "_hf");
}
inline void PrintTo(const model_case& c, std::ostream* os) { *os << case_name(c); }

// The cases' fixture dimensions: vocab 512, hidden 256, ffn 512, 4 heads over 2 KV heads of 64; 2 layers,
// gemma3 6 so that its global layer is reached.
inline families::fixture_dims case_dims(std::string_view family, dtype format = dtype::f32) {
  families::fixture_dims d;
  d.vocab = 512;
  d.hidden = 256;
  d.ffn = 512;
  d.heads = 4;
  d.kv_heads = 2;
  d.head_dim = 64;
  d.layers = family == "gemma3" ? 6 : 2;
  d.matrix_type = format;
  return d;
}

// The case's fixture under a directory named for `prefix` and this process.
inline std::shared_ptr<const families::model_handle> load_case(const model_case& c, std::string_view prefix) {
  namespace fs = std::filesystem;
  const auto d = case_dims(c.family, c.format);
  const auto dir = fs::temp_directory_path() / (std::string(prefix) + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = dir / (case_name(c) + (c.gguf ? ".gguf" : ""));
  auto w = families::write_fixture(c.family, d, path, c.gguf);
  EXPECT_TRUE(w) << (w ? "" : w.error().message());
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  return h ? *h : nullptr;
}

// The oracle's log-probabilities for a 20-token prompt and the 4 greedy steps after it: what every
// executor's parity test compares against.
struct oracle_steps {
  std::vector<std::int32_t> prompt, decoded;
  std::vector<std::vector<double>> logprobs;  // prompt's last position, then each decoded token's
};
inline oracle_steps oracle_reference(const std::shared_ptr<const families::model_handle>& h) {
  oracle_steps r;
  for (int i = 0; i < 20; ++i) r.prompt.push_back(3 + (i * 53 + 7) % 500);
  app::oracle_runner oracle(h, 32);
  auto l = oracle.feed(r.prompt);
  EXPECT_TRUE(l) << (l ? "" : l.error());
  if (!l) return r;
  r.logprobs.push_back(log_softmax(*l));
  for (int s = 0; s < 4; ++s) {
    const auto& last = r.logprobs.back();
    r.decoded.push_back(static_cast<std::int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    auto d = oracle.feed(std::span(&r.decoded.back(), 1));
    EXPECT_TRUE(d) << (d ? "" : d.error());
    if (!d) return r;
    r.logprobs.push_back(log_softmax(*d));
  }
  return r;
}

// The same steps on an executor (empty on failure, with the failure recorded).
inline std::vector<std::vector<double>> executor_steps(const std::shared_ptr<const families::model_handle>& h, exec::executor& ex,
                                                       const oracle_steps& ref) {
  std::vector<std::vector<double>> got;
  auto run = app::exec_runner::create(h, ex, 32);
  EXPECT_TRUE(run) << (run ? "" : run.error());
  if (!run) return {};
  auto g = run->feed(ref.prompt);
  EXPECT_TRUE(g) << (g ? "" : g.error());
  if (!g) return {};
  got.push_back(log_softmax(*g));
  for (auto t : ref.decoded) {
    auto d = run->feed(std::span(&t, 1));
    EXPECT_TRUE(d) << (d ? "" : d.error());
    if (!d) return {};
    got.push_back(log_softmax(*d));
  }
  return got;
}

// The largest |dlogprob| over each step's 10 most likely tokens (by the oracle). Where the executor's
// top token differs, the oracle's top two must lie within `tie` of each other.
inline double worst_top10(const oracle_steps& ref, const std::vector<std::vector<double>>& got, double tie) {
  double worst = 0;
  EXPECT_EQ(got.size(), ref.logprobs.size());
  for (std::size_t s = 0; s < ref.logprobs.size() && s < got.size(); ++s) {
    const auto& want = ref.logprobs[s];
    std::vector<std::size_t> ids(want.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + 10, ids.end(), [&](auto a, auto b) { return want[a] > want[b]; });
    for (int k = 0; k < 10; ++k) worst = std::max(worst, std::fabs(got[s][ids[k]] - want[ids[k]]));
    const auto top = std::max_element(got[s].begin(), got[s].end()) - got[s].begin();
    if (static_cast<std::size_t>(top) != ids[0]) {
      EXPECT_LT(want[ids[0]] - want[ids[1]], tie) << "step " << s;
    }
  }
  return worst;
}

}  // namespace troupe::testing
