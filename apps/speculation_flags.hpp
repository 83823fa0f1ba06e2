#pragma once
// The speculation flags every command takes (generate, bench, serve): `--speculative ngram[:K] | mtp[:K]` or
// `--draft-model PATH [--draft-tokens K]`, turned into the driver's speculation_options (the draft
// checkpoint loaded here; its executor is the target's unless the caller sets one).
#include <cstdint>
#include <string>

#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"

namespace troupe::app {

struct speculation_flags {
  std::string speculative;  // "ngram", "mtp", with ":K" or not; empty: none (unless draft_model)
  std::string draft_model;  // a GGUF file or HF directory with the target's vocabulary
  std::int64_t draft_tokens = 4;
  bool any() const { return !speculative.empty() || !draft_model.empty(); }
};

// `load_draft` false (a deployment): the draft checkpoint is not loaded here, only named (draft_path)
// for the nodes that load it.
result<driver::speculation_options, std::string> speculation_of(const speculation_flags& f, bool load_draft = true);

}  // namespace troupe::app
