#pragma once
// Beam search from its definition, for the driver's beam tests (tests/engine/driver/beam_test.cpp,
// recurrent_test.cpp): every prefix recomputed from scratch on its own runner (no KV sharing, no forks,
// no carried state), its log-softmax in double, the driver's ranking rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "apps/exec_runner.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"

namespace troupe::test {

struct ref_beam {
  std::vector<std::int32_t> tokens;
  double logprob = 0, score = 0;
  bool ended = false;
};

// Beam search from its definition over full recomputation of every prefix.
inline std::vector<ref_beam> reference(const std::shared_ptr<const families::model_handle>& h, const std::vector<std::int32_t>& prompt, int W,
                                std::int64_t max_tokens, const std::vector<std::int32_t>& stop, double penalty, bool early) {
  exec::cpu::cpu_executor ex({1, std::nullopt});
  auto run = app::exec_runner::create(h, ex, 256);
  EXPECT_TRUE(run);
  auto logsoftmax = [&](const std::vector<std::int32_t>& toks) {
    (void)run->reset();
    auto l = run->feed(toks);
    EXPECT_TRUE(l);
    double m = -1e300;
    for (float v : *l) m = std::max(m, static_cast<double>(v));
    double z = 0;
    for (float v : *l) z += std::exp(static_cast<double>(v) - m);
    std::vector<double> out(l->size());
    for (std::size_t i = 0; i < l->size(); ++i) out[i] = static_cast<double>((*l)[i]) - m - std::log(z);
    return out;
  };
  auto score = [&](double lp, std::size_t len) { return lp / std::pow(static_cast<double>(len), penalty); };
  struct cand {
    double lp;
    std::size_t parent;
    std::int32_t token;
  };
  std::vector<ref_beam> live{{}}, done;
  auto trim = [&] {
    std::stable_sort(done.begin(), done.end(), [](const ref_beam& a, const ref_beam& b) { return a.score > b.score; });
    if (done.size() > static_cast<std::size_t>(W)) done.resize(static_cast<std::size_t>(W));
  };
  for (std::int64_t len = 1; len <= max_tokens; ++len) {
    std::vector<cand> cands;
    for (std::size_t j = 0; j < live.size(); ++j) {
      auto toks = prompt;
      toks.insert(toks.end(), live[j].tokens.begin(), live[j].tokens.end());
      const auto ls = logsoftmax(toks);
      std::vector<std::int32_t> ids(ls.size());
      for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<std::int32_t>(t);
      std::stable_sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) { return ls[static_cast<std::size_t>(a)] > ls[static_cast<std::size_t>(b)]; });
      for (int k = 0; k < 2 * W; ++k) cands.push_back({live[j].logprob + ls[static_cast<std::size_t>(ids[static_cast<std::size_t>(k)])], j, ids[static_cast<std::size_t>(k)]});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const cand& a, const cand& b) {
      if (a.lp != b.lp) return a.lp > b.lp;
      if (a.parent != b.parent) return a.parent < b.parent;
      return a.token < b.token;
    });
    std::vector<ref_beam> next;
    for (std::size_t rank = 0; rank < cands.size() && next.size() < static_cast<std::size_t>(W); ++rank) {
      auto b = live[cands[rank].parent];
      b.tokens.push_back(cands[rank].token);
      b.logprob = cands[rank].lp;
      b.score = score(b.logprob, b.tokens.size());
      if (std::find(stop.begin(), stop.end(), cands[rank].token) != stop.end()) {
        b.ended = true;
        if (rank < static_cast<std::size_t>(W)) done.push_back(b);
        continue;
      }
      next.push_back(b);
    }
    trim();
    if (len == max_tokens) {
      done.insert(done.end(), next.begin(), next.end());
      break;
    }
    if (next.empty()) break;
    if (done.size() >= static_cast<std::size_t>(W) && (early || next.front().score <= done.back().score)) break;
    live = next;
  }
  trim();
  return done;
}

inline void expect_same(const std::vector<driver::beam_result>& got, const std::vector<ref_beam>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("beam " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 2e-3);
    EXPECT_NEAR(got[i].score, want[i].score, 2e-3);
    EXPECT_EQ(got[i].finished == driver::finish_reason::eos, want[i].ended);
  }
}

}  // namespace troupe::test
