#pragma once
// The batch the parallel-replica tests serve on one device and on a split replica: four sampled
// sequences of different prompt lengths (batched decode, chunked prefill), ten tokens each; the tokens
// by sequence.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "engine/driver/driver.hpp"
#include "families/model_handle.hpp"

namespace troupe::testing {

inline driver::driver_options serve_batch_options() {
  driver::driver_options opt;
  opt.max_rows = 4;
  opt.capacity = 64;
  opt.block_size = 16;
  opt.prefill_chunk = 16;
  opt.token_budget = 20;
  return opt;
}

inline std::map<driver::seq_id, std::vector<std::int32_t>> serve_batch(std::shared_ptr<const families::model_handle> h, exec::executor& ex,
                                                                       driver::driver_options o) {
  std::map<driver::seq_id, std::vector<std::int32_t>> out;
  const auto vocab = h->model().config().vocab;
  auto d = driver::driver<driver::unprepared>(std::move(h), ex, std::move(o)).prepare();
  EXPECT_TRUE(d) << (d ? "" : d.error().second.message());
  if (!d) return out;
  for (int i = 0; i < 4; ++i) {
    driver::seq_request r;
    for (int t = 0; t < 5 + 9 * i; ++t) r.prompt.push_back(static_cast<std::int32_t>(3 + (t * 31 + i * 7) % (vocab - 3)));
    r.max_tokens = 10;
    r.ignore_eos = true;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = static_cast<std::uint64_t>(i + 1);
    EXPECT_TRUE(d->open(std::move(r)));
  }
  while (!d->idle()) {
    auto rep = d->step();
    EXPECT_TRUE(rep) << (rep ? "" : rep.error().message());
    if (!rep) break;
    for (const auto& u : rep->updates) {
      out[u.id].insert(out[u.id].end(), u.tokens.begin(), u.tokens.end());
      if (u.finished) (void)d->release(u.id);
    }
  }
  return out;
}

}  // namespace troupe::testing
