#pragma once
// Draft policies (driver.hpp: speculation_options): each proposes, for rows that have exactly their
// last token pending, up to `want` next tokens. The target verifies them in one step (scheduler.cpp:
// run_verify); a policy never commits anything, and learns what was kept from the tokens of its next
// call (a draft model rolls its own KV back to the common prefix). Private to engine/driver.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"

namespace troupe::driver {

struct draft_row {
  seq_id id = 0;
  std::span<const std::int32_t> tokens;  // the sequence so far (prompt and output; the last one pending)
  std::int64_t want = 0;                 // drafts wanted at most
};

class drafter {
 public:
  virtual ~drafter() = default;
  // Drafts for each row, at most its `want` (possibly none).
  virtual result<std::vector<std::vector<std::int32_t>>, driver_error> propose(std::span<const draft_row> rows) = 0;
  // Rows whose prompt the target has just prefilled (`tokens` the prompt, `want` 1): a policy with a
  // prefill of its own (a draft model) runs it now, beside the target's, so that the first decode
  // round's drafts do not wait for it. Nothing is committed; a failure only costs the head start.
  virtual void prime(std::span<const draft_row> /*rows*/) {}
  // The sequence ended: drop what the policy keeps for it.
  virtual void forget(seq_id) {}
  // Steps the policy ran on its own executor (a draft model), for the counters.
  virtual std::int64_t steps() const { return 0; }
  // A policy that reads the target's hidden states (MTP): the target's steps then carry them, and
  // each step hands over the rows of the positions it committed, [first, first + count) of `id`.
  virtual bool wants_hidden() const { return false; }
  virtual void observe(seq_id /*id*/, std::int64_t /*first*/, const float* /*rows*/, std::int64_t /*count*/) {}
};

// Prompt lookup: for n from ngram_max down to ngram_min, the latest earlier occurrence of the last n
// tokens; the drafts are the tokens that followed it.
std::vector<std::int32_t> ngram_draft(std::span<const std::int32_t> tokens, std::int64_t n_min, std::int64_t n_max, std::int64_t want);
std::unique_ptr<drafter> make_ngram_drafter(const speculation_options& o);

// A draft model: a driver of its own over options.speculation.draft_model (greedy, no prefix cache),
// one mirror sequence per target sequence, prepared by prepare(). Refused when its vocabulary differs.
result<std::unique_ptr<drafter>, driver_error> make_model_drafter(const driver_options& target, std::int64_t target_vocab);

struct driver_state;
// The model's multi-token-prediction layer (mtp.cpp): the draft program's entries in the target's
// own executable, its KV in the target's blocks (rolled back with them), greedy drafts from the
// target's hidden states. Refused when the model offers no draft program or the replica has ranks.
result<std::unique_ptr<drafter>, driver_error> make_mtp_drafter(driver_state& d);

}  // namespace troupe::driver
