#pragma once
// The contract between a family and the driver for everything a step reads besides weights: the fixed
// step inputs (the same for every family, computed by the driver from its own geometry), the request
// inputs a family declares, and the states each program carries.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/graph/graph.hpp"
#include "families/step_shape.hpp"

namespace troupe::families {

// The step inputs, as slots of every traced step:
//   token_ids    i32 [rows * tokens]          the new tokens, row-major
//   positions    i32 [rows * tokens]          each token's absolute position in its sequence
//   kv_write_map i32 [rows * tokens]          the KV slot each new token is written to; -1 skips (padding)
//   kv_read_map  i32 [rows, capacity]         for each row, the slot holding position j; -1 when none
//   state_rows   i32 [rows]                   the row of each recurrent state pool the sequence owns; -1: none
// (the encode program reads token_ids, positions and token_mask i32 [rows * tokens], 1 = real token;
// the draft program reads the step's four and hidden_states f32 [rows * tokens, hidden]: the target's
// final hidden state at the position before each token).
struct step_input {
  graph::slot_kind kind;
  graph::tensor_type type;
};
std::vector<step_input> step_inputs(program p, const step_shape& shape, std::int64_t hidden = 0);

enum class input_extent : std::uint8_t { per_position, per_row };
enum class input_presence : std::uint8_t { required, defaulted, optional };

// A request input a family declares: values a request supplies (embedding rows over some prompt
// positions, a segment id per token, a vision tower's pixels).
struct request_input_decl {
  std::string name;
  dtype element = dtype::f32;
  input_extent extent = input_extent::per_position;
  std::vector<std::int64_t> width;  // the shape of one position's or one row's value
  double pad = 0.0;                 // bound where a row has no value
  input_presence presence = input_presence::required;
  double fill = 0.0;                // the default when presence is defaulted
};

// A carried state of a program: one tensor of `slot_shape` per KV slot, or per state row (`per_row`:
// a recurrent layer's conv window or scan state, one row per sequence, step_shape::state_rows rows).
struct state_decl {
  std::string name;  // "kv.k.3", "ssm.conv.3"
  dtype element = dtype::f32;
  std::vector<std::int64_t> slot_shape;
  bool per_row = false;
};

struct schema_error {
  std::string input;
  std::string reason;
  std::string message() const { return "request input '" + input + "': " + reason; }
};

class model_schema {
 public:
  // Adds a request input; a duplicate name, an empty name, a block dtype, a non-positive width or a
  // fill on a non-defaulted input is refused.
  result<void, schema_error> declare(request_input_decl d);
  void add_program(program p, std::vector<state_decl> states);

  bool offers(program p) const;
  const std::vector<state_decl>& states(program p) const;
  const std::vector<request_input_decl>& request_inputs() const { return inputs_; }
  const request_input_decl* find_input(const std::string& name) const;

 private:
  std::vector<request_input_decl> inputs_;
  std::vector<std::pair<program, std::vector<state_decl>>> programs_;
};

}  // namespace troupe::families
