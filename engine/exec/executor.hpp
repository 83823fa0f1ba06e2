#pragma once
// The executor contract: what every backend (CPU, CUDA) implements and the driver calls without
// branching on a backend. Weights are loaded once per executable, in their stored formats; each
// specialization the driver needs is an entry (a compiled graph) on that executable; a step binds the
// entry's slots and returns its outputs. Carried states (KV pools) belong to the executable and are
// shared by its entries by name and type, updated in place by each step. A graph the backend cannot
// lower is refused when the entry is added, never when it steps.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/exec/sampling.hpp"
#include "engine/graph/graph.hpp"

namespace troupe::exec {

struct executable_id {
  std::uint32_t value = 0;
  friend bool operator==(executable_id, executable_id) = default;
};
struct entry_id {
  std::uint32_t value = 0;
  friend bool operator==(entry_id, entry_id) = default;
};

enum class exec_error_code : std::uint8_t {
  unsupported,         // the backend cannot lower this graph (op, dtype or pattern): refused at add_entry
  missing_weight,      // the weight source has no tensor for a role the graph reads
  bad_binding,         // a step input is missing or of the wrong type
  index_out_of_range,  // a token id, KV slot or row index outside its table (the step is refused)
  unknown_id,          // an executable or entry this executor did not hand out
  state_conflict,      // two entries declare one state with different types
  device_error,        // the device failed (a backend's own faults)
  bad_sampling,        // a sampling row's parameters, history or mask were refused
  invalid_witness,     // a validation output (a router's selections) failed its check: the step is refused
};
std::string_view name(exec_error_code c);

struct exec_error {
  exec_error_code code;
  std::string where;   // "eqn 12 (linear)", "slot token_ids", "state kv.k.0"
  std::string reason;
  std::string message() const;
};

// Where an executable's weights come from: each weight role to its stored tensor (any dtype).
class weight_source {
 public:
  virtual ~weight_source() = default;
  virtual std::optional<tensor_view> find(const graph::weight_role& role) const = 0;
  // The executor holds `bytes` (part of a view find returned) in its own form and will not read them
  // again: a source whose bytes are a file mapping may drop their pages (a later touch reads them back).
  // `covering`: the pages the bytes share with neighbouring tensors too (for a small tensor, which
  // covers no whole page).
  virtual void release(const tensor_view& bytes, bool covering = false) const { (void)bytes, (void)covering; }
  // Whether `bytes` are pages of a file mapping, which release can drop. An executor keeps its own copy
  // of a small weight it reads at every step from such pages (a norm, a bias), so its steps never
  // fault the file back in.
  virtual bool file_backed(const tensor_view& bytes) const { (void)bytes; return false; }
};

struct step_inputs {
  std::map<std::string, tensor_view> slots;  // by slot name
  std::vector<std::shared_ptr<const tensor>> owned;  // values the views point into that the caller made for this step
};

struct step_outputs {
  std::map<std::string, tensor> outputs;  // by output name
};

// A step's outputs as views into the executor's own buffers, valid until the executor's next step.
struct step_views {
  std::vector<std::pair<std::string, tensor_view>> outputs;  // by output name, in the graph's order
  const tensor_view* find(std::string_view name) const {
    for (const auto& [n, v] : outputs)
      if (n == name) return &v;
    return nullptr;
  }
};

struct memory_report {
  std::size_t weight_bytes = 0;   // packed weights and folded constants
  std::size_t state_bytes = 0;    // carried states (KV pools)
  std::size_t scratch_bytes = 0;  // the entries' activation arenas
};

// One row of a Head::Sample step: which sequence's history it reads and updates, its rules, which of
// its draws this is (the generator is keyed by (seed, draw) alone), and optionally its guided-decoding
// mask (ceil(vocab / 32) words) and whether the row's logits are wanted too (Head::Logits).
struct sample_row_request {
  std::uint64_t sequence = 0;
  sample_params params;
  std::uint64_t draw = 0;
  bool want_logits = false;
};

// Fills the guided-decoding masks while the forward pass runs: called on another thread as the step
// starts; `masks[i]` is row i's mask, left empty for an unguided row.
using mask_hook = std::function<void(std::vector<std::vector<std::uint32_t>>& masks)>;

struct sampled_row {
  sample_pick pick;
  std::vector<float> logits;  // only when the row asked for them
};

// Chained decode (RowWork::Chain): `steps` decode steps of one entry run back to back, each row's
// pick fed as its next token, the caller waiting once. The first step's slots are the step_inputs
// given; for step i > 0 a row's token is its pick of step i - 1, its position `positions[i R + r]`
// and its KV write slot `write_slots[i R + r]` (R: the entry's rows); the read map is the first
// step's, which must already name the slots of every position the chain writes (the causal mask
// hides the ones not yet written). A row whose pick is one of its `stop_ids` takes no further part:
// its later tokens write nothing and are not reported. Draws run from each row's `draw` upward.
struct chain_request {
  std::int64_t steps = 1;
  std::vector<std::int32_t> positions;    // [steps x R]
  std::vector<std::int32_t> write_slots;  // [steps x R]
  std::vector<std::vector<std::int32_t>> stop_ids;  // per sampled row
};

class executor {
 public:
  virtual ~executor() = default;
  virtual std::string_view target() const = 0;

  // The weight source must outlive the executable.
  virtual result<executable_id, exec_error> load(const weight_source& weights) = 0;
  virtual result<entry_id, exec_error> add_entry(executable_id exe, const graph::graph& g) = 0;
  virtual result<step_outputs, exec_error> step(entry_id entry, const step_inputs& in) = 0;
  // step() without copying its outputs: the views stay valid until the next call on this executor.
  // A caller that reads a step's logits once (the bench and parity runner) takes them here, where a
  // step's copy of a large vocabulary's logits was an allocation, its page faults and its unmapping.
  result<step_views, exec_error> step_views_of(entry_id entry, const step_inputs& in) { return step_in_place(entry, in); }

  // Zeroes an executable's states; reads one back (for tests and resumption).
  virtual result<void, exec_error> reset_states(executable_id exe) = 0;
  virtual result<tensor, exec_error> read_state(executable_id exe, const std::string& name) const = 0;
  virtual memory_report memory() const = 0;
  // Copies, in every state of an executable, row `from` to row `to` for each pair (a row: one index of
  // the state's first dimension, one KV slot of a paged pool), in order. Beam search forks a partly
  // filled block this way. A pair outside a state's rows refuses the whole call (bad_binding) before
  // anything is copied. With `only`, just the states it names (a recurrent model's per-row states,
  // which speculation snapshots, and not its KV pools, whose rows are slots). The base executor has no
  // states to copy and answers unsupported.
  virtual result<void, exec_error> copy_state_rows(executable_id exe, std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                                   std::span<const std::string> only = {});

  // Reads expert `index` of the stacked weight `role` (a linear_id weight [E, N, K]) again from the
  // executable's weight source, whose bytes for it changed (a LoRA adapter loaded into a slot of the
  // driver's pools). Nothing to do when no entry has read the weight yet. The base executor answers
  // unsupported.
  virtual result<void, exec_error> reload_expert(executable_id exe, const graph::weight_role& role, std::int64_t index);

  // Head::Sample: the step's `logits` rows (one per row of the shape, the last token of each) are
  // sampled where they were computed; rows[i] is row i, rows past rows.size() are padding. The picks
  // are recorded into each row's sequence history. The base class runs the host rules of
  // engine/exec/sampling.hpp over the logits `step` returns; a device backend overrides it.
  // `rest`, when given, receives the entry's other outputs (a step with a hidden carry: `hidden`).
  virtual result<std::vector<sampled_row>, exec_error> step_sample(entry_id entry, const step_inputs& in,
                                                                   std::span<const sample_row_request> rows,
                                                                   const mask_hook& masks = {}, step_outputs* rest = nullptr);

  // Runs a chain (chain_request); picks[i][r] is row r's pick of step i, for every step the row took
  // part in (a row that stopped at step i has i + 1 picks). The base class loops step_sample on the
  // host side of the executor; a device backend may replay the step on the device.
  virtual result<std::vector<std::vector<sampled_row>>, exec_error> step_chain(entry_id entry, const step_inputs& first,
                                                                               std::span<const sample_row_request> rows, const chain_request& chain);

  // The per-sequence histories the head reads (penalties, bias) and updates. Opening an open sequence
  // replaces its history. A device backend that mirrors the histories overrides these to follow them.
  virtual result<void, exec_error> open_history(std::uint64_t sequence, std::int64_t vocab, std::span<const std::int32_t> prompt,
                                                std::span<const std::pair<std::int32_t, float>> bias = {});
  virtual void close_history(std::uint64_t sequence);
  // Records tokens the sequence produced elsewhere (a resumed sequence's earlier output).
  virtual void record_history(std::uint64_t sequence, std::span<const std::int32_t> tokens);
  const token_history* history(std::uint64_t sequence) const;
  std::size_t open_histories() const { return histories_.size(); }

 protected:
  // step() without the copies: the head samples its logits where they are. The base runs step() and
  // keeps its outputs until the next call; an executor whose outputs stay in its own buffers overrides
  // it (the CPU executor: the entry's arena).
  virtual result<step_views, exec_error> step_in_place(entry_id entry, const step_inputs& in);
  // Runs fn(row, worker) for every row in [0, n), worker in [0, row_workers()): the head's host
  // sampling of a step's rows. The base runs them in order on the calling thread; an executor with
  // host threads of its own spreads them (the CPU executor: its pool).
  virtual int row_workers() const { return 1; }
  virtual void for_each_row(std::size_t n, const std::function<void(std::size_t row, int worker)>& fn);

 private:
  step_outputs held_;  // the base step_in_place's outputs
  std::map<std::uint64_t, token_history> histories_;
  std::vector<sample_scratch> scratch_;  // one per row worker
};

}  // namespace troupe::exec
