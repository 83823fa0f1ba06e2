#include "apps/embed.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "apps/default_model.hpp"
#include "engine/driver/cpu_replica.hpp"
#include "engine/driver/driver.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {

int run_embed(const embed_options& o) {
  const auto model = model_or_default(o.model, "embed");
  if (!model) {
    std::fprintf(stderr, "%s\n", model.error().c_str());
    return 2;
  }
  auto h = families::model_handle::load(*model, families::registry::builtin());
  if (!h) {
    std::fprintf(stderr, "troupe embed: %s\n", families::message(h.error()).c_str());
    return 2;
  }
  const auto* codec = (*h)->text();
  if (!codec) {
    std::fprintf(stderr, "troupe embed: the model's tokenizer is needed (%s)\n", (*h)->text_problem().c_str());
    return 2;
  }
  auto how = (*h)->pooling();
  if (!o.pooling.empty()) {
    auto m = families::pooling_named(o.pooling);
    if (!m) {
      std::fprintf(stderr, "troupe embed: --pooling is mean, cls or last, not '%s'\n", o.pooling.c_str());
      return 2;
    }
    how.mode = *m;
    how.declared_by = "--pooling";
  }
  if (o.no_normalize) how.normalize = false;
  std::vector<std::string> texts = o.inputs;
  if (texts.empty())
    for (std::string line; std::getline(std::cin, line);)
      if (!line.empty()) texts.push_back(line);
  if (texts.empty()) {
    std::fprintf(stderr, "troupe embed: no input (give --input TEXT, or lines on stdin)\n");
    return 2;
  }
  std::vector<std::vector<std::int32_t>> rows;
  for (const auto& t : texts) {
    auto ids = codec->encode(t, true);
    if (!ids) {
      std::fprintf(stderr, "troupe embed: %s\n", ids.error().message().c_str());
      return 2;
    }
    rows.emplace_back(ids->begin(), ids->end());
  }
  auto replica = driver::cpu_replica::make(*h, 1, 1, static_cast<int>(o.threads));
  if (!replica) {
    std::fprintf(stderr, "troupe embed: %s\n", replica.error().c_str());
    return 2;
  }
  driver::driver_options opt;
  (*replica)->attach(opt);
  std::int64_t longest = 1;
  for (const auto& r : rows) longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(r.size()));
  opt.max_rows = 1;
  opt.block_size = 16;
  opt.prefill_chunk = (longest + 15) / 16 * 16;
  opt.capacity = opt.prefill_chunk;
  opt.token_budget = opt.prefill_chunk + 1;
  opt.prefix_cache = false;
  auto prepared = driver::driver<driver::unprepared>((*replica)->head(), (*replica)->head_executor(), opt).prepare();
  if (!prepared) {
    std::fprintf(stderr, "troupe embed: %s\n", prepared.error().second.message().c_str());
    return 1;
  }
  auto e = prepared->embed(rows, how);
  if (!e) {
    std::fprintf(stderr, "troupe embed: %s\n", e.error().message().c_str());
    return e.error().code == driver::driver_error_code::step_failed ? 1 : 2;
  }
  nlohmann::json out = {{"model", model->c_str()}, {"pooling", families::name(how.mode)}, {"normalize", how.normalize},
                        {"declared_by", how.declared_by}, {"data", nlohmann::json::array()}};
  for (std::size_t i = 0; i < e->size(); ++i) out["data"].push_back({{"index", i}, {"tokens", rows[i].size()}, {"embedding", (*e)[i]}});
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace troupe::app
