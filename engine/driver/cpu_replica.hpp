#pragma once
// One replica split tensor_parallel x pipeline_parallel ways over simulated CPU devices of this process
// (docs/tensor-parallel.md): an executor per world rank (stage * tp + rank), each over its part of the
// model (model_handle::part), the ranks of a stage joined by an in-process group for their all_reduce
// and all_gather, the same rank of consecutive stages by an in-process pipe for the activations. The
// driver runs on the head (the last stage's rank 0, which samples); `attach` names the other ranks.
#include <memory>
#include <string>
#include <vector>

#include "engine/core/collective.hpp"
#include "engine/driver/driver.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/model_handle.hpp"

namespace troupe::driver {

class cpu_replica {
 public:
  // `threads`: per executor (0: the machine's cores shared out between the ranks). A split the model
  // cannot make (heads or layers that do not divide) is refused before any executor is made.
  static result<std::unique_ptr<cpu_replica>, std::string> make(const std::shared_ptr<const families::model_handle>& model,
                                                               int tensor_parallel, int pipeline_parallel, int threads = 0);

  // The model part and executor the driver itself runs (world rank (pp - 1) * tp: it samples).
  const std::shared_ptr<const families::model_handle>& head() const { return parts_[head_]; }
  exec::cpu::cpu_executor& head_executor() { return *executors_[head_]; }
  // Adds every other rank to `o.other_ranks`.
  void attach(driver_options& o) const;
  int ranks() const { return static_cast<int>(executors_.size()); }

 private:
  cpu_replica() = default;
  std::vector<std::unique_ptr<collective>> groups_;  // per stage, its tp ranks (world order)
  std::vector<std::unique_ptr<collective>> pipes_;   // per tp rank, its pp stages
  std::vector<std::shared_ptr<const families::model_handle>> parts_;
  std::vector<std::unique_ptr<exec::cpu::cpu_executor>> executors_;
  std::size_t head_ = 0;
};

}  // namespace troupe::driver
