#pragma once
// The CPU executor: compiles each entry's graph (folding, dead code, buffer planning) and lowers it
// to a list of kernel calls over one preallocated arena, with linear weights packed once per
// executable in their stored formats. A step copies the slots in, runs the calls on the thread pool
// and copies the outputs out; it allocates nothing else.
#include <memory>

#include "engine/core/collective.hpp"

#include "engine/exec/cpu/isa.hpp"
#include "engine/exec/executor.hpp"

namespace troupe::exec::cpu {

struct cpu_options {
  int threads = 0;                 // 0: one per core
  std::optional<isa> level;        // default: the best this CPU runs
  // The tensor-parallel group this executor is one rank of: a shard's all_reduce ops sum over it (it
  // must outlive the executor). None: a graph with all_reduce is refused at add_entry.
  collective* group = nullptr;
  // The pipeline this executor is one stage of (its rank is the stage): a stage's pipe_send and
  // pipe_recv ops talk over it (it must outlive the executor). None: such a graph is refused.
  collective* pipe = nullptr;
};

// The CPU executor's accuracy against the oracle (the same stored weights, exact f32 activations): how
// far a log-probability may move for a model whose matrices are stored as `weights`. f32 and f16: f32
// accumulation order only (~1e-5 measured). bf16 on AVX-512: activations rounded to bf16 for vdpbf16ps
// (2^-9 relative per product; measured 2.4e-2). Block formats with their own kernels: activations
// quantized to 8-bit blocks as llama.cpp does (measured 0.05 to 0.17 on random test models, as
// llama.cpp's own q8_0 path moves against f32; the tight check of those paths is llama.cpp itself).
// Block formats decoded to f16 (no kernel of their own): the f16 rounding of the decoded weights
// (measured 3-4e-3).
double logprob_bound(dtype weights);

class cpu_executor final : public executor {
 public:
  explicit cpu_executor(cpu_options opt = {});
  ~cpu_executor() override;

  std::string_view target() const override { return "cpu"; }
  result<executable_id, exec_error> load(const weight_source& weights) override;
  result<entry_id, exec_error> add_entry(executable_id exe, const graph::graph& g) override;
  result<step_outputs, exec_error> step(entry_id entry, const step_inputs& in) override;

 protected:
  // The outputs where the step left them, in the entry's arena.
  result<step_views, exec_error> step_in_place(entry_id entry, const step_inputs& in) override;
  // Rows are sampled on the pool.
  int row_workers() const override;
  void for_each_row(std::size_t n, const std::function<void(std::size_t row, int worker)>& fn) override;

 public:
  result<void, exec_error> reset_states(executable_id exe) override;
  result<tensor, exec_error> read_state(executable_id exe, const std::string& name) const override;
  result<void, exec_error> copy_state_rows(executable_id exe, std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                           std::span<const std::string> only = {}) override;
  result<void, exec_error> reload_expert(executable_id exe, const graph::weight_role& role, std::int64_t index) override;
  memory_report memory() const override;

  isa level() const;
  int threads() const;
  // How many kernel calls one step of the entry runs (after fusion); 0 for an unknown entry.
  std::size_t kernel_calls(entry_id entry) const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::exec::cpu
