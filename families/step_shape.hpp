#pragma once
// The semantic shape of one step: `rows` sequences of `tokens` new tokens each, against KV storage of
// `capacity` positions per row, laid out contiguously (a private block of slots per row) or paged (a
// shared pool of fixed-size blocks addressed through the read and write maps). Positions are absolute
// slots, so a prefill is a step that continues from any position. Built with setters, so a new field
// never breaks a caller. Token values, positions and sampler parameters are bound at step time and
// never part of a shape.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/graph/weight_roles.hpp"

namespace troupe::families {

enum class kv_layout_kind : std::uint8_t { contiguous, paged };

struct kv_layout {
  kv_layout_kind kind = kv_layout_kind::contiguous;
  std::int64_t block_size = 0;   // paged: positions per block
  std::int64_t pool_blocks = 0;  // paged: blocks in the shared pool
  static kv_layout contiguous() { return {}; }
  static kv_layout paged(std::int64_t block_size, std::int64_t pool_blocks) {
    return {kv_layout_kind::paged, block_size, pool_blocks};
  }
  friend bool operator==(const kv_layout&, const kv_layout&) = default;
};

enum class logit_rows : std::uint8_t { last, all };

class step_shape {
 public:
  step_shape(std::int64_t rows, std::int64_t tokens, std::int64_t capacity)
      : rows_(rows), tokens_(tokens), capacity_(capacity) {}

  step_shape& with_kv(kv_layout kv) { kv_ = kv; return *this; }
  step_shape& with_logits(logit_rows l) { logits_ = l; return *this; }
  step_shape& with_hidden_carry(bool carry) { hidden_carry_ = carry; return *this; }
  // Rows of each recurrent state pool (a sequence owns one row; 0: the shape's rows).
  step_shape& with_state_rows(std::int64_t n) { state_rows_ = n; return *this; }

  std::int64_t rows() const { return rows_; }
  std::int64_t tokens() const { return tokens_; }
  std::int64_t capacity() const { return capacity_; }
  const kv_layout& kv() const { return kv_; }
  logit_rows logits() const { return logits_; }
  bool hidden_carry() const { return hidden_carry_; }
  std::int64_t state_rows() const { return state_rows_ > 0 ? state_rows_ : rows_; }
  std::int64_t declared_state_rows() const { return state_rows_; }  // 0: the rows

  std::int64_t total_tokens() const { return rows_ * tokens_; }
  // KV slots the state holds: rows x capacity when contiguous, the whole pool when paged.
  std::int64_t kv_slots() const {
    return kv_.kind == kv_layout_kind::paged ? kv_.block_size * kv_.pool_blocks : rows_ * capacity_;
  }
  std::string str() const;

  friend bool operator==(const step_shape&, const step_shape&) = default;

 private:
  std::int64_t rows_;
  std::int64_t tokens_;
  std::int64_t capacity_;
  kv_layout kv_;
  logit_rows logits_ = logit_rows::last;
  bool hidden_carry_ = false;
  std::int64_t state_rows_ = 0;
};

// The programs a model may offer: `step` continues each row's carried state and returns logits
// (prefill and decode are one program); `encode` is one stateless pass over whole rows returning
// hidden states; `draft` is a model's own multi-token-prediction layer (DeepSeek-V3's nextn layer):
// a step over the target's hidden states (slot hidden_states) and the tokens that followed them,
// with a KV state of its own, returning the next token's logits and its own hidden states.
enum class program : std::uint8_t { step, encode, draft };
std::string_view program_name(program p);

// LoRA adapters served beside the base weights (docs/adapters.md): `slots` resident adapters of rank at
// most `rank`, over the target linears. Zero slots: no adapter path is traced.
struct lora_spec {
  std::int64_t slots = 0;
  std::int64_t rank = 0;
  std::vector<graph::tensor_role> targets;
  friend bool operator==(const lora_spec&, const lora_spec&) = default;
};

struct step_spec {
  families::program program = families::program::step;
  step_shape shape{1, 1, 1};
  std::vector<std::string> carried_inputs;  // request inputs this step binds (names from the schema)
  lora_spec lora;                           // traced into the step program only
};

}  // namespace troupe::families
