#pragma once
// One sequence run through a model's traced steps on the CPU oracle, with a contiguous KV cache of
// `capacity` positions: the reference path behind `troupe generate --backend oracle` and the family
// parity tests. Graphs are traced once per (tokens, logits) shape and reused.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/eval/oracle.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {

// Weight consts for the oracle from a model's weight map.
class weight_map_source final : public eval::const_source {
 public:
  explicit weight_map_source(const families::weight_map& w) : w_(w) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override { return w_.view(role); }

 private:
  const families::weight_map& w_;
};

class oracle_runner {
 public:
  // `group`: the tensor-parallel group when `handle` is one rank's shard (model_handle::shard); `pipe`:
  // the pipeline when it is a stage (model_handle::stage). A stage before the last returns no logits.
  oracle_runner(std::shared_ptr<const families::model_handle> handle, std::int64_t capacity, collective* group = nullptr,
                collective* pipe = nullptr);

  // Feeds `tokens` at the next positions; returns the logits of the last token ([vocab]) or, with
  // `all_logits`, of every token ([tokens x vocab], row-major).
  result<std::vector<float>, std::string> feed(std::span<const std::int32_t> tokens, bool all_logits = false);
  std::int64_t position() const { return pos_; }
  std::int64_t capacity() const { return capacity_; }
  void reset();

 private:
  std::shared_ptr<const families::model_handle> handle_;
  collective* group_ = nullptr;
  collective* pipe_ = nullptr;
  std::int64_t capacity_;
  std::int64_t pos_ = 0;
  weight_map_source weights_;
  std::map<std::string, tensor> states_;
  std::map<std::pair<std::int64_t, bool>, graph::graph> graphs_;
};

}  // namespace troupe::app
