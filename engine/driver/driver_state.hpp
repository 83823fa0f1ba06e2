#pragma once
// The driver's state, shared by the files that make it up (private to engine/driver):
//   entries.cpp     the entries ledger: options checked, weights loaded, entries traced and added;
//   scheduler.cpp   a round of continuous batching over the serving surface (decode, verify, prefill);
//   speculation.cpp draft policies and the verify window;
//   driver.cpp      the public surface (open, step, commit, release, generate, encode, embed).
#include <algorithm>
#include <deque>
#include <map>
#include <span>
#include <memory>
#include <optional>
#include <vector>

#include "engine/driver/block_pool.hpp"
#include "engine/driver/driver.hpp"
#include "engine/driver/rank_fanout.hpp"
#include "engine/driver/speculation.hpp"
#include "engine/driver/weight_source.hpp"
#include "engine/guide/guide.hpp"
#include "engine/text/detokenizer.hpp"

namespace troupe::driver {

enum class seq_phase : std::uint8_t { waiting, running, finished };

struct sequence {
  seq_id id = 0;
  seq_request req;
  std::vector<std::int32_t> tokens;  // prompt, then output
  std::int64_t prompt_len = 0;
  std::int64_t computed = 0;         // positions whose KV is in the pool
  std::vector<block_id> blocks;      // block table
  std::vector<std::uint64_t> chain;  // chain hash of each full block so far (published or not)
  std::int64_t cached = -1;          // prompt positions its first admission took from the prefix cache (-1: not admitted yet)
  std::int64_t generated = 0;
  seq_phase phase = seq_phase::waiting;
  std::optional<finish_reason> finished;
  bool reported = false;             // its finish was reported by a round
  bool cancel = false;
  bool cacheable = true;             // no request inputs: may use and fill the prefix cache
  std::optional<text::detokenizer> detok;
  std::int64_t admitted = 0;         // admission order (latest is preempted first)
  std::vector<std::int32_t> stop_ids;
  std::int64_t window = 0;           // speculation: drafts asked next (adaptive; 0: options.speculation.tokens)
  // Adaptive speculation's back-off: verify windows in a row whose drafts were all rejected, and the
  // decode steps still to run without drafting (1, 2, 4 ... 32 after the third such window).
  std::int64_t misses = 0, pause = 0;
  std::int64_t limit = -1;           // a draft model's mirror: does not grow past this many tokens (-1: no bound)
  seq_id group = 0;                  // a beam of the beam search of sequence `group` (itself for the first beam)
  std::int32_t state_row = -1;       // a recurrent model: its row of every state pool while it holds blocks
  std::int32_t adapter_slot = -1;    // its LoRA adapter's slot while it runs (-1: none)
  // Its request inputs by name: for each prompt position, the values row that position takes (-1: none;
  // a per-row input: one entry, row 0).
  std::map<std::string, std::vector<std::int32_t>> input_rows;
};

// A LoRA adapter the driver has read (adapters.cpp): per target (role, layer), A zero-padded to
// [max_rank, K] and B scaled and zero-padded to [N, max_rank].
struct loaded_adapter {
  std::string path;
  std::int64_t rank = 0;
  double scale = 0;
  std::map<std::pair<graph::tensor_role, std::int32_t>, std::pair<tensor, tensor>> mats;
  std::int32_t slot = -1;
  std::int64_t users = 0;
  std::uint64_t last_used = 0;
};

// A beam search: its live beams (sequences; the first is the request's own), their summed
// log-probabilities, and the hypotheses finished so far (beam.cpp).
struct beam_group {
  std::vector<seq_id> live;
  std::vector<double> logprob;
  std::vector<beam_result> done;
  std::int64_t reserved = 0;  // rows held for forks not made yet (and, for a recurrent model, one to stage its state rows' reorder)
};

inline std::vector<std::int64_t> buckets(std::int64_t first, std::int64_t last) {
  std::vector<std::int64_t> b;
  for (std::int64_t v = first; v < last; v *= 2) b.push_back(v);
  b.push_back(last);
  return b;
}


// What a step's inputs hold, by slot kind: the driver computes these, and bind() hands every slot
// of an entry (resolved when the entry was added) the value of its kind.
struct step_values {
  tensor_view token_ids, positions, token_mask, kv_read_map, kv_write_map, state_rows, adapter_rows;
  tensor_view hidden_states;  // a draft program's: the target's hidden state at each token
  std::span<const sequence* const> row_seqs;  // the sequence each row serves (null: padding), for request inputs
};

// A step's host-side inputs for `rows` x `tokens` tokens over `capacity` positions: token ids,
// positions and KV write slots (padding: token 0, position 0, no write) and the read map of each row
// (-1: no slot).
struct step_maps {
  step_maps(std::int64_t rows, std::int64_t tokens, std::int64_t capacity)
      : ids(dtype::i32, {rows * tokens}), pos(dtype::i32, {rows * tokens}), write(dtype::i32, {rows * tokens}), read(dtype::i32, {rows, capacity}),
        state(dtype::i32, {rows}), adapter(dtype::i32, {rows}), seqs(static_cast<std::size_t>(rows), nullptr) {
    std::fill_n(state.as<std::int32_t>(), rows, -1);
    std::fill_n(adapter.as<std::int32_t>(), rows, -1);
    std::fill_n(ids.as<std::int32_t>(), rows * tokens, 0);
    std::fill_n(pos.as<std::int32_t>(), rows * tokens, 0);
    std::fill_n(write.as<std::int32_t>(), rows * tokens, -1);
    std::fill_n(read.as<std::int32_t>(), rows * capacity, -1);
  }
  tensor ids, pos, write, read, state, adapter;  // state: each row's recurrent state row; adapter: its LoRA slot (-1: none)
  std::vector<const sequence*> seqs;
  // Row r serves sequence s: its recurrent state row and adapter slot.
  void row_of(std::int64_t r, const sequence& s) {
    seqs[static_cast<std::size_t>(r)] = &s;
    state.as<std::int32_t>()[r] = s.state_row;
    adapter.as<std::int32_t>()[r] = s.adapter_slot;
  }
  step_values values() const {
    return {.token_ids = ids.view(), .positions = pos.view(), .kv_read_map = read.view(), .kv_write_map = write.view(), .state_rows = state.view(),
            .adapter_rows = adapter.view(), .row_seqs = seqs};
  }
};

struct driver_state {
  std::shared_ptr<const families::model_handle> handle;
  exec::executor* ex = nullptr;
  driver_options options;
  std::vector<rank_state> ranks;  // tensor-parallel ranks 1.. (options.other_ranks, prepared)
  std::unique_ptr<rank_workers> workers;  // their threads, once the first step runs
  rank_workers& rank_threads() {
    if (!workers) workers = std::make_unique<rank_workers>(ranks);
    return *workers;
  }

  // prepared
  std::unique_ptr<weight_map_source> weights;
  exec::executable_id exe{};
  std::map<entry_key, exec::entry_id, key_less> entries;
  std::map<entry_key, std::vector<graph::slot>, key_less> slots_of;  // each entry's slots, resolved at add()
  // The step inputs of entry `k`: each of its slots bound to the value of its kind.
  exec::step_inputs bind(const entry_key& k, const step_values& v) const;
  std::vector<entry_key> entry_order;
  std::vector<std::int64_t> row_buckets, chunk_buckets;
  std::int64_t block_size = 0, pool_blocks = 0, vocab = 0;
  std::optional<block_pool> pool;
  std::vector<std::int32_t> eos;
  std::unique_ptr<guide::guide_cache> guides;  // built at the first guided request

  // serving
  std::map<seq_id, sequence> seqs;
  std::deque<seq_id> waiting;
  std::vector<seq_id> running;  // admission order
  seq_id next_id = 1;
  std::int64_t next_admission = 0;
  driver_counters counters;

  // The KV slot of a sequence's position, through its block table.
  std::int32_t slot_of(const sequence& s, std::int64_t position) const {
    return static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(position / block_size)] * block_size + position % block_size);
  }
  families::kv_layout layout() const { return families::kv_layout::paged(block_size, pool_blocks); }
  entry_key step_key(std::int64_t rows, std::int64_t tokens, head_kind head, std::vector<std::string> carried = {}) const {
    entry_key k;
    k.carried = std::move(carried);
    k.program = families::program::step;
    k.shape = families::step_shape(rows, tokens, options.capacity).with_kv(layout()).with_hidden_carry(carry_hidden).with_state_rows(state_pool_rows());
    k.head = head;
    return k;
  }
  bool carry_hidden = false;  // the step entries output `hidden` too (a draft policy reads it: MTP)
  // A recurrent model (a state declared per row): each running sequence owns a row of every state
  // pool, max_rows of them; the prefix cache is off (the table's recurrent_state x prefix_cache).
  bool recurrent = false;
  std::vector<std::int32_t> free_state_rows;
  // With a draft policy, a recurrent model's pools hold a second max_rows rows: row r + max_rows keeps
  // the state of the sequence in row r from before a verify window, so that a rejected draft can be
  // taken back out of it (restore, then run the accepted tokens again). `row_states` names the per-row
  // states (not the KV pools, whose rows are slots).
  bool snapshots = false;
  std::vector<std::string> row_states, kv_states;  // the per-row states; the others (KV pools)
  // Copies rows, in order, of the states `names` names (all of them when empty) on rank 0 and every
  // other rank in this process.
  result<void, driver_error> copy_rows(std::span<const std::pair<std::int64_t, std::int64_t>> pairs, const std::vector<std::string>& names);
  // Copies state rows (pairs of rows of every per-row state) on rank 0 and every other rank.
  result<void, driver_error> copy_row_states(std::span<const std::pair<std::int64_t, std::int64_t>> pairs) { return copy_rows(pairs, row_states); }
  // A row of a verify window (or its replay): position p's token, then `drafts`; padding repeats the
  // last position and writes nothing.
  void window_row(step_maps& m, std::int64_t r, const sequence& s, std::int64_t p, std::span<const std::int32_t> drafts) const;
  // Entry `key` on rank 0 and every other rank, timed as executor work.
  result<exec::step_outputs, exec::exec_error> step_everywhere(const entry_key& key, const exec::step_inputs& in);
  // A verify window again, the pending token at p and the accepted drafts, for rows whose state was
  // restored from its snapshot: their state advances by exactly what was committed.
  struct replay_row {
    sequence* s;
    std::int64_t p;
    std::vector<std::int32_t> accepted;
  };
  result<void, driver_error> replay_accepted(const std::vector<replay_row>& rows, step_report& report);
  // LoRA adapters (adapters.cpp): loaded by name, slot_owner[s] the one resident in slot s.
  std::map<std::string, loaded_adapter> adapters;
  std::vector<std::string> slot_owner;
  std::uint64_t adapter_clock = 0;
  families::lora_spec lora_spec() const;
  result<void, driver_error> make_adapter_pools();
  // Makes s's adapter resident (a free slot, or the least recently used idle one); false: every slot
  // is used by a running sequence (s waits).
  result<bool, driver_error> acquire_adapter(sequence& s);
  void release_adapter(sequence& s);
  std::uint64_t root_of(const sequence& s) const;  // the prefix cache's root hash: per adapter
  std::int64_t state_pool_rows() const { return recurrent ? options.max_rows * (snapshots ? 2 : 1) : 0; }
  // The model's draft program (MTP) over `rows` x `tokens`, its KV in the target's blocks.
  entry_key draft_key(std::int64_t rows, std::int64_t tokens) const {
    entry_key k;
    k.program = families::program::draft;
    k.shape = families::step_shape(rows, tokens, options.capacity).with_kv(layout());
    k.head = head_kind::sample;
    return k;
  }
  // A verify window: rows of the pending token and up to tokens - 1 drafts, with every token's logits.
  // Windows come in a few widths (verify_widths: 2, 3, 5, 9, 17 below K + 1, and K + 1) so that a
  // short draft does not pay for K.
  entry_key verify_key(std::int64_t rows, std::int64_t tokens) const {
    entry_key k = step_key(rows, tokens, head_kind::sample);
    k.shape.with_logits(families::logit_rows::all);
    return k;
  }
  std::vector<std::int64_t> verify_widths;
  std::unique_ptr<drafter> drafts;  // options.speculation's policy (prepared), or null
  exec::sample_scratch verify_scratch;
  bool speculates() const { return drafts != nullptr; }
  entry_key encode_key(std::int64_t rows = 1, std::int64_t tokens = 0) const {
    entry_key k;
    k.program = families::program::encode;
    if (tokens == 0) tokens = options.prefill_chunk;
    k.shape = families::step_shape(rows, tokens, tokens);
    return k;
  }

  // Request inputs (request_inputs.cpp): the inputs a sequence gives over positions [first, first + n)
  // (the step's carried set), a prefill chunk cut so that it never splits positions that attend to
  // each other both ways, and each carried slot's value for a step's rows.
  void index_inputs(sequence& s) const;
  std::vector<std::string> carried_for(const sequence& s, std::int64_t first, std::int64_t n) const;
  std::int64_t whole_spans(const sequence& s, std::int64_t n) const;
  std::shared_ptr<const tensor> carried_value(const std::string& name, std::int64_t rows, std::int64_t tokens, const step_values& v) const;
  // The vision tower's executable and its entry (vision.cpp in the driver), made on first use.
  std::unique_ptr<weight_map_source> vision_weights;
  std::optional<exec::executable_id> vision_exe;
  std::optional<exec::entry_id> vision_entry;

  result<void, driver_error> validate();
  result<void, driver_error> add(const entry_key& k);
  result<void, driver_error> prepare();

  result<void, driver_error> admit(sequence& s);
  void free_blocks(sequence& s);
  bool ensure_blocks(sequence& s, std::int64_t upto, step_report& report);
  void publish_full_blocks(sequence& s);
  void finish(sequence& s, finish_reason r);
  void accept(sequence& s, const exec::sampled_row& row, seq_update& u);
  result<void, driver_error> run_decode(std::vector<sequence*>& rows, step_report& report, std::map<seq_id, seq_update>& updates);
  // Decode rows chained: up to options.chain_steps steps with one wait (false: the rows cannot chain now).
  result<bool, driver_error> run_chain(std::vector<sequence*>& rows, step_report& report, std::map<seq_id, seq_update>& updates);
  bool chainable(const std::vector<sequence*>& rows) const;
  // Decode rows with drafts: one verify step, then each row commits its accepted prefix and one pick.
  result<void, driver_error> run_verify(std::vector<sequence*>& rows, const std::vector<std::vector<std::int32_t>>& drafts,
                                        step_report& report, std::map<seq_id, seq_update>& updates);
  // Drafts for the decode rows that speculate (empty where a row does not), or none at all.
  result<std::vector<std::vector<std::int32_t>>, driver_error> draft_for(const std::vector<sequence*>& rows);
  // Whether a sequence's decode rows take drafts (guided rows need a mask per position, logits rows
  // every row's logits: they decode one token at a time).
  static bool drafts_for(const sequence& s);
  // Sequences whose prompt this round finished prefilling: the draft policy catches up with it now.
  void prime_drafts(const std::vector<sequence*>& prefilled);
  // Cuts a sequence back to its first `length` tokens (a draft model's mirror): KV past them is
  // overwritten by the next step, full blocks past them leave its chain.
  void truncate(sequence& s, std::int64_t length);

  // Beam search (beam.cpp).
  std::map<seq_id, beam_group> groups;
  std::int64_t reserved_rows() const;
  // The picks of a group's live beams (in `live` order) after their step: the next beams, or the end.
  result<void, driver_error> beam_step(seq_id head, const std::vector<exec::sample_pick>& picks, std::map<seq_id, seq_update>& updates);
  void end_beams(sequence& head, std::map<seq_id, seq_update>& updates);
  result<void, driver_error> run_prefill(sequence& s, std::int64_t n, step_report& report, std::map<seq_id, seq_update>& updates);
  result<step_report, driver_error> round();
  exec::mask_hook mask_hook_for(const std::vector<sequence*>& rows) const;
  // Hands a draft policy that reads hidden states (MTP) rows [at, at + count) of a step's `hidden`
  // output: the positions [first, first + count) of `s` that the step committed.
  void hand_hidden(const exec::step_outputs& out, const sequence& s, std::int64_t at, std::int64_t first, std::int64_t count);
};

}  // namespace troupe::driver
