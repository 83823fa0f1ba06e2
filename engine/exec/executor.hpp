#pragma once
// The executor contract: what every backend (CPU, CUDA) implements and the driver calls without
// branching on a backend. Weights are loaded once per executable, in their stored formats; each
// specialization the driver needs is an entry (a compiled graph) on that executable; a step binds the
// entry's slots and returns its outputs. Carried states (KV pools) belong to the executable and are
// shared by its entries by name and type, updated in place by each step. A graph the backend cannot
// lower is refused when the entry is added, never when it steps.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
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
};

struct step_inputs {
  std::map<std::string, tensor_view> slots;  // by slot name
};

struct step_outputs {
  std::map<std::string, tensor> outputs;  // by output name
};

struct memory_report {
  std::size_t weight_bytes = 0;   // packed weights and folded constants
  std::size_t state_bytes = 0;    // carried states (KV pools)
  std::size_t scratch_bytes = 0;  // the entries' activation arenas
};

class executor {
 public:
  virtual ~executor() = default;
  virtual std::string_view target() const = 0;

  // The weight source must outlive the executable.
  virtual result<executable_id, exec_error> load(const weight_source& weights) = 0;
  virtual result<entry_id, exec_error> add_entry(executable_id exe, const graph::graph& g) = 0;
  virtual result<step_outputs, exec_error> step(entry_id entry, const step_inputs& in) = 0;

  // Zeroes an executable's states; reads one back (for tests and resumption).
  virtual result<void, exec_error> reset_states(executable_id exe) = 0;
  virtual result<tensor, exec_error> read_state(executable_id exe, const std::string& name) const = 0;
  virtual memory_report memory() const = 0;
};

}  // namespace troupe::exec
