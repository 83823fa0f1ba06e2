#pragma once
// Which checkpoint tensor feeds which typed weight role. A family names its roles and, per checkpoint
// format, the key that stores each one (`name_rule`); `weight_map::build` resolves every role against a
// weight store once, before any trace, checking presence and shape, so a missing or misshapen tensor is
// named (role, key, expected shape) before anything runs. Code asks for weights by role only.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/graph/graph.hpp"
#include "engine/load/weight_store.hpp"

namespace troupe::families {

enum class presence : std::uint8_t {
  required,
  optional,  // absent is fine (a bias some checkpoints omit)
  tied,      // absent means: use the tensor of `tied_to` (an output head tied to the embedding)
};

// How a checkpoint's bytes differ from the role's meaning, which the family undoes in the graph.
enum class stored_as : std::uint8_t {
  as_is,
  minus_one,         // Gemma's HF norms store w - 1 (the model multiplies by 1 + w)
  rope_interleaved,  // llama.cpp's converter permuted Q/K rows so RoPE rotates adjacent pairs
  qkv_per_head,      // a fused QKV projection whose rows are [q | k | v] per head (HF BLOOM), not [q... | k... | v...]
};

// Roles by value (engine/graph/weight_roles.hpp): role::attn_q.
using role = graph::tensor_role;
using graph::bias_of;
using graph::role_name;

struct name_rule {
  families::role role = families::role::none;  // attn_q
  bool per_layer = true;
  std::string key;       // "model.layers.{L}.self_attn.q_proj.weight"; {L} is the layer
  families::presence presence = families::presence::required;
  families::role tied_to = families::role::none;  // for presence::tied: the role whose tensor stands in
  stored_as stored = stored_as::as_is;
  // A role stacked from one tensor per expert (HF's ...experts.{E}.gate_proj.weight): `experts` tensors
  // of one type and shape become the role's [experts, ...] view, without a copy when they lie in order
  // in the file, else as one owned copy. 0: a single tensor.
  std::int64_t experts = 0;
  // A per-layer rule for this layer alone, in place of the rules of the same role for every layer (a
  // layer stored elsewhere: Qwen3-Next's MTP layer at mtp.layers.0.* rather than model.layers.{L}.*).
  // -1: every layer.
  std::int32_t layer_only = -1;
};

// The shape a role must have (outermost first), or nullopt when the family does not know it ahead.
using expected_shape_fn = std::function<std::optional<troupe::shape>(role r, std::int32_t layer)>;

struct weight_entry {
  graph::weight_role role;
  std::string key;  // the checkpoint tensor that feeds it
  tensor_view view;
  stored_as stored = stored_as::as_is;
  // An act-order weight's column order (i32 [K], "<prefix>.input_perm" beside "<prefix>.weight"): the
  // linear reads x[perm[j]] as its column j.
  std::optional<tensor_view> input_perm;
};

enum class weight_error_code : std::uint8_t { missing, shape_mismatch, unsupported_dtype };

struct weight_error {
  weight_error_code code;
  graph::weight_role role;
  std::string key;
  std::string expected;  // the expected shape, or the accepted dtypes
  std::string got;
  std::string message() const;
};

class weight_map {
 public:
  static result<weight_map, weight_error> build(const load::weight_store& store, std::span<const name_rule> rules,
                                                std::int32_t layers, const expected_shape_fn& expected);
  // A map of entries the caller made from this one (a tensor-parallel shard's slices): the views point
  // into this map's store or into `owned`, which the new map keeps alive.
  weight_map derive(std::vector<weight_entry> entries, std::vector<std::shared_ptr<const tensor>> owned) const;

  const weight_entry* find(const graph::weight_role& role) const;
  std::optional<tensor_view> view(const graph::weight_role& role) const;
  bool has(const graph::weight_role& role) const { return find(role) != nullptr; }
  const std::vector<weight_entry>& entries() const { return entries_; }
  const load::weight_store& store() const { return store_; }

 private:
  explicit weight_map(load::weight_store s) : store_(std::move(s)) {}
  load::weight_store store_;  // keeps every view alive
  std::vector<std::shared_ptr<const tensor>> owned_;  // bytes a derived map's views point into
  std::vector<weight_entry> entries_;
};

}  // namespace troupe::families
