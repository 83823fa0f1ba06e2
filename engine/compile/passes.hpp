#pragma once
// Target-independent compilation of a traced graph, shared by every executor: constant folding (an
// equation whose inputs are all known at prepare, such as a cast of a norm weight or a rotary table
// divided by llama.cpp's rope_freqs, is computed once with the oracle, so the folded value means
// exactly what the graph said), dead-code removal, and buffer planning by liveness so that a step
// allocates nothing. Lowering to kernels is the target's.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/graph/graph.hpp"

namespace troupe::compile {

struct compile_error {
  std::string where;
  std::string reason;
  std::string message() const { return where + ": " + reason; }
};

// Weights by role, as stored (the same lookup the executor's weight source offers).
using weight_lookup = std::function<std::optional<tensor_view>(const graph::weight_role&)>;

struct fold_options {
  std::int64_t max_folded_bytes = 64LL << 20;  // a larger constant is computed at step time instead
};

// The graph after folding and dead-code removal: which equations run, which values are constants
// (literals, weights, folded results) and where each value is last read.
struct pruned_graph {
  const graph::graph* source = nullptr;
  std::vector<bool> runs;                           // per equation
  std::map<std::uint32_t, tensor> folded;           // value index -> computed at prepare
  std::vector<bool> constant;                       // per value: a literal, weight or folded value
  std::vector<std::int64_t> last_use;               // per value: last running equation that reads it;
                                                    // equations().size() for outputs and state outputs
};

// Equations `keep` rejects are never folded (a target keeps e.g. linear and gather_rows over stored
// weights for its own kernels).
result<pruned_graph, compile_error> fold_and_prune(const graph::graph& g, const weight_lookup& weights,
                                                   const std::function<bool(const graph::equation&)>& foldable,
                                                   const fold_options& opt = {});

// Where each value lives during a step.
enum class storage : std::uint8_t {
  arena,     // an offset in the entry's scratch arena
  alias,     // the same bytes as another value (a reshape, an in-place update)
  external,  // owned elsewhere: constants, carried states
};

struct buffer_plan {
  std::vector<storage> kind;            // per value
  std::vector<std::int64_t> offset;     // per arena value: byte offset
  std::vector<std::uint32_t> alias_of;  // per alias value: the value whose bytes it shares
  std::int64_t arena_bytes = 0;
};

// `aliases(e)`: the input index whose bytes equation e's output may share (a reshape, or an update
// the target performs in place), or -1. Slots are arena values defined before the first equation.
buffer_plan plan_buffers(const pruned_graph& p, const std::function<int(const graph::equation&)>& aliases);

}  // namespace troupe::compile
