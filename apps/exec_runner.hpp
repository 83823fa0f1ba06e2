#pragma once
// One sequence run through a model's traced steps on an executor (CPU, CUDA), with a contiguous KV
// cache of `capacity` positions: what `troupe bench` and the parity tests drive (`troupe generate` goes
// through the driver). Entries are compiled once per (tokens, logits) shape.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/driver/weight_source.hpp"
#include "engine/exec/executor.hpp"
#include "families/model_handle.hpp"

namespace troupe::app {

// An executor's weight source over a model's weight map (the driver's).
using weight_map_weights = driver::weight_map_source;

class exec_runner {
 public:
  // Loads the model's weights into `ex` (which must outlive the runner).
  static result<exec_runner, std::string> create(std::shared_ptr<const families::model_handle> handle, exec::executor& ex,
                                                 std::int64_t capacity);

  // Compiles the entry for a step shape ahead of use (a step otherwise compiles on first use).
  result<void, std::string> prepare(std::int64_t tokens, bool all_logits);
  result<std::vector<float>, std::string> feed(std::span<const std::int32_t> tokens, bool all_logits = false);
  std::int64_t position() const { return pos_; }
  result<void, std::string> reset();

 private:
  exec_runner(std::shared_ptr<const families::model_handle> h, exec::executor& ex, std::int64_t capacity);
  result<exec::entry_id, std::string> entry_for(std::int64_t tokens, bool all_logits);

  std::shared_ptr<const families::model_handle> handle_;
  exec::executor* ex_;
  std::int64_t capacity_;
  std::int64_t pos_ = 0;
  std::unique_ptr<weight_map_weights> weights_;
  exec::executable_id exe_;
  std::map<std::pair<std::int64_t, bool>, exec::entry_id> entries_;
  // The step's slots, kept between feeds: a long capacity's read map is a tensor large enough to be
  // mapped and unmapped on every step otherwise.
  tensor ids_, pos_slot_, read_, row_;
};

}  // namespace troupe::app
