#pragma once
// The driver: a model handle bound to one executor, serving sequences. A new driver is
// driver<unprepared>; `prepare` takes it by value, loads the weights once as one executable, traces and
// adds every entry the options admit (so serving compiles nothing) and returns driver<serving>, or hands
// the unprepared driver back with a typed error. Only a serving driver opens, steps, cancels and
// releases sequences.
//
// Entries are keyed by (program, step shape, head, carried inputs) and never replaced: decode entries
// of 1, 2, 4 .. max_rows rows of one token, prefill entries of one row of 16, 32 .. prefill_chunk
// tokens (a shorter chunk runs in the next bucket up, padded at the front so the row's last token is
// real), each with Head::Sample and, when asked, Head::Logits. The KV cache is one pool of
// pool_blocks blocks of block_size slots shared by all sequences through block tables (the read and
// write maps of each step); contiguous storage is the same pool with one block of `capacity` slots
// per sequence. Full blocks of a sequence are published to the prefix cache under their token chain;
// a new sequence whose prompt starts with a cached chain shares those blocks and skips their prefill.
//
// Each `step` is one round of continuous batching: waiting sequences are admitted while rows are free,
// every decoding sequence advances one token in one batched step, and prefilling sequences advance by
// chunks while the token budget lasts. When the pool runs dry a sequence is preempted by recompute
// (its blocks are freed and it is prefilled again later; cached blocks make that cheap) or, with
// preemption off, finishes with finish_reason::pool_exhausted. Sampling runs in the executor's head
// (engine/exec/sampling.hpp); draws are keyed by (seed, index of the token in its sequence), so a
// sequence samples the same tokens alone or in any batch.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/core/tensor.hpp"
#include "engine/exec/executor.hpp"
#include "engine/guide/spec.hpp"
#include "engine/exec/sampling.hpp"
#include "families/model_handle.hpp"
#include "families/vision/vision.hpp"
#include "families/model_schema.hpp"

namespace troupe::driver {

// ---- features and the one table of what composes ----------------------------------------------------

enum class feature : std::uint8_t {
  paged_pool,       // the driver's KV pool is paged (block_size < capacity)
  prefix_cache,     // the driver shares cached prompt blocks
  placement,        // the model is split across executors
  draft_policy,     // speculative decoding
  recurrent_state,  // the model carries recurrent state rows besides KV
  adapter,          // a LoRA adapter on the request
  beam_search,      // the request asks for beams
  request_inputs,   // the request carries inputs its model declares
  resume,           // the request resumes a saved sequence
};
std::string_view name(feature f);

struct incompatible {
  feature a;
  feature b;
  std::string reason;
};

// The pair of active features the table refuses, if any (the first such pair in table order). Every
// composition check of the driver goes through this one function.
std::optional<incompatible> check_compatible(std::span<const feature> active);
// The features this driver implements; anything else is refused as unsupported at admission.
bool implemented(feature f);

// ---- request inputs ---------------------------------------------------------------------------------

enum class input_error_code : std::uint8_t {
  undeclared,           // the model declares no input of that name
  missing_required,     // a required input is absent
  wrong_type,           // the values' dtype is not the declared one
  wrong_width,          // one position's (or row's) value has the wrong shape
  not_covering_prompt,  // a dense per-position value does not hold one value per prompt token
  position_outside,     // a sparse position lies outside the prompt, or repeats
};
std::string_view name(input_error_code c);

struct input_error {
  input_error_code code;
  std::string input;
  std::string reason;
  std::string message() const;
};

// A request's value for one declared input: `values` is [n, width...]. Positions empty: dense (n is
// the prompt length for a per-position input, 1 for a per-row input); otherwise sparse: values row i
// belongs to prompt position positions[i].
struct request_input_value {
  tensor values;
  std::vector<std::int64_t> positions;
};
using request_inputs = std::map<std::string, request_input_value>;

result<void, input_error> check_inputs(const families::model_schema& schema, std::int64_t prompt_tokens, const request_inputs& inputs);

// ---- errors -----------------------------------------------------------------------------------------

enum class driver_error_code : std::uint8_t {
  bad_options,          // driver options out of range (prepare)
  prepare_failed,       // a trace or the executor refused an entry (prepare)
  entry_limit,          // a new entry would pass max_entries
  byte_limit,           // a new entry would pass max_retained_bytes
  bad_request,          // empty prompt, token id outside the vocabulary, bad sampling parameters, stop strings without a tokenizer
  bad_input,            // a request input refused against the schema (see input)
  incompatible,         // two features the table refuses together (see pair)
  unsupported_feature,  // a feature this driver does not implement
  no_head,              // no prepared head serves the request (logits asked, none prepared)
  too_long,             // prompt + max_tokens exceeds the capacity per sequence
  pool_too_small,       // the request could never fit in the whole KV pool
  unknown_sequence,     // a sequence id this driver never opened (or already released)
  program_not_offered,  // the model offers no such program (encode)
  step_failed,          // the executor refused or failed a step
  unbound_slot,         // a traced entry has a slot no driver input binds (prepare)
  unknown_adapter,      // a request or unload names an adapter the driver has not loaded
  bad_adapter,          // an adapter the driver cannot serve (unreadable, another model's shapes, rank past max_rank)
  adapter_busy,         // unloading an adapter that sequences still use
};
std::string_view name(driver_error_code c);

struct driver_error {
  driver_error_code code;
  std::string reason;
  std::optional<input_error> input;
  std::optional<incompatible> pair;
  std::string message() const;
};

// ---- options, requests, reports ---------------------------------------------------------------------

enum class head_kind : std::uint8_t { sample, logits };

// Another rank of a tensor-parallel replica (docs/tensor-parallel.md): its shard of the model
// (model_handle::shard) and its executor, joined to the driver's own executor (rank 0) by a group
// (e.g. cpu_options::group). The driver prepares every entry on every rank and runs each step on all of
// them at once with the same inputs; rank 0 samples, the others only take part in the collectives.
struct entry_key;

// A rank in another process (a pipeline stage on another node): it holds its own part of the model and
// its executor there, joined to this replica's other ranks by cross-process collectives. The driver
// asks it to load, to compile each entry it compiles, and to run each step with the step's inputs.
class remote_rank {
 public:
  virtual ~remote_rank() = default;
  virtual result<void, std::string> load() = 0;
  virtual result<void, std::string> add(const entry_key& key) = 0;
  virtual result<void, std::string> step(const entry_key& key, const exec::step_inputs& in) = 0;
};

struct tp_rank {
  std::shared_ptr<const families::model_handle> shard;
  exec::executor* ex = nullptr;
  std::shared_ptr<remote_rank> remote;  // set: the rank is elsewhere (shard and ex unused)
};

// Speculative decoding (docs/speculative-decoding.md): a draft policy proposes up to `tokens` next
// tokens of a decoding sequence; one verify step of the target computes the logits of the pending
// token and every draft (an entry of rows x (tokens + 1) tokens with all-token logits), and the
// sampling rules pick each position's token with the draw the sequence would use without drafts
// (same seed, same draw index). A draft is accepted while it equals that pick; the first pick that
// differs (or the pick after the last draft) is committed too. Drafts are point proposals, for which
// this is the rejection rule (a draft d is accepted with probability p(d)), realised with the draw
// of the non-speculative run: output is token for token what it would be without speculation.
enum class draft_kind : std::uint8_t {
  none,
  ngram,  // prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens
  model,  // a smaller checkpoint with the same vocabulary, drafting greedily on its own entries
  mtp,    // the model's own multi-token-prediction layer (its draft program) over the target's hidden states
};
std::string_view name(draft_kind k);

struct speculation_options {
  draft_kind kind = draft_kind::none;
  std::int64_t tokens = 4;        // drafts per verify window at most (K)
  std::int64_t ngram_min = 1;     // ngram: the shortest suffix matched
  std::int64_t ngram_max = 3;     // ngram: the longest suffix matched (tried first)
  bool adaptive = true;           // the window follows each sequence's acceptance (grow on a full accept; after
                                  // three windows in a row with nothing accepted, decode 1, 2, 4 ... 32 steps
                                  // without drafting before trying again)
  std::shared_ptr<const families::model_handle> draft_model;  // model: the draft checkpoint
  std::string draft_path;  // model: where it lies, when a deployment sends it to nodes that load it there
  exec::executor* draft_executor = nullptr;                    // model: its executor (null: the target's)
};

// LoRA adapters (docs/adapters.md): up to `slots` adapters resident at once, of rank at most
// `max_rank`, over the `targets` linears; every step entry adds each token's B_s (A_s x) for its row's
// slot s (the adapter_rows slot, -1 for none), so rows with different adapters and none share a step.
// Loaded adapters past the slots wait in host memory; a request's adapter takes a free slot or the one
// used longest ago by no running sequence. slots = 0: no adapter path is traced and adapters are refused.
// attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down.
std::vector<graph::tensor_role> default_adapter_targets();

struct adapter_options {
  std::int64_t slots = 0;
  std::int64_t max_rank = 16;
  std::vector<graph::tensor_role> targets = default_adapter_targets();
  // (name, PEFT directory) pairs prepare() loads (load_adapter) once the entries are ready; one that
  // does not load fails the preparation.
  std::vector<std::pair<std::string, std::string>> preload;
};

struct adapter_info {
  std::string name;
  std::string path;
  std::int64_t rank = 0;
  double scale = 0;
  std::int32_t slot = -1;   // resident in this slot (-1: in host memory only)
  std::int64_t users = 0;   // running sequences using it
};

struct driver_options {
  std::int64_t max_rows = 16;         // sequences decoding together
  std::int64_t capacity = 1024;       // positions per sequence (prompt and output)
  bool paged = true;                  // false: one block of `capacity` slots per row
  std::int64_t block_size = 16;       // paged: slots per block
  std::int64_t pool_blocks = 0;       // paged: blocks in the pool; 0 = max_rows * capacity / block_size
  std::int64_t prefill_chunk = 256;   // tokens of one prefill step
  std::int64_t smallest_chunk = 16;   // the smallest prefill entry (chunks run in 16, 32, .. prefill_chunk)
  std::int64_t token_budget = 512;    // tokens of one scheduler round (decode rows + prefill chunks)
  bool prefix_cache = true;
  bool preempt = true;                // recompute preemption when the pool runs dry
  bool logits_head = false;           // also prepare Head::Logits entries
  bool encode = false;                // also prepare the encode program (1 row of prefill_chunk tokens)
  std::int64_t max_entries = 64;
  std::size_t max_retained_bytes = 0; // bound on the executor's weights + states + scratch; 0 = none
  graph::trace_limits limits{};
  // Told how far prepare() has come: `done` of `total` steps, the first being the executor's load of
  // the weights and each later one an entry traced and compiled. Called on prepare()'s thread.
  std::function<void(std::int64_t done, std::int64_t total)> on_prepare;
  // Ranks 1.. of a tensor-parallel replica; the driver's handle and executor are rank 0's. Empty: one
  // device.
  std::vector<tp_rank> other_ranks;
  // Called first by prepare(): joins the replica's cross-process groups (remote ranks' pipes); an error
  // fails the preparation.
  std::function<result<void, std::string>()> connect;
  speculation_options speculation;
  // Chained decode: when every running sequence decodes (none waits, none prefills) and none needs
  // the host between tokens (a guide, stop strings, a logits head, beams, drafts), up to this many
  // decode steps run back to back on the executor (executor::step_chain), each pick fed to the next
  // step; 1: off.
  std::int64_t chain_steps = 1;
  adapter_options adapters;
};

enum class finish_reason : std::uint8_t {
  eos,             // the model's end-of-generation id (or a request stop id)
  stop_string,     // a stop string matched (its text is not emitted)
  length,          // max_tokens reached
  capacity,        // the sequence filled its capacity
  cancelled,
  pool_exhausted,  // no KV block and preemption off
  error,           // a step failed
};
std::string_view name(finish_reason r);

// Fills the allowed-token mask of a guided row while the step runs: `output` is the tokens generated
// so far, `mask` holds ceil(vocab / 32) words, zeroed; set bit t % 32 of word t / 32 to allow token t.
using guide_fn = std::function<void(std::span<const std::int32_t> output, std::span<std::uint32_t> mask)>;

struct seq_request {
  std::vector<std::int32_t> prompt;
  // Output already delivered by an earlier run of this request (resuming it elsewhere after a failure):
  // it is computed like prompt, counts as output for max_tokens, penalties and stop strings, and the
  // next draw is number prior_output.size(), so the continuation equals the uninterrupted run's.
  std::vector<std::int32_t> prior_output;
  exec::sample_params sampling;
  std::vector<std::pair<std::int32_t, float>> logit_bias;
  std::int64_t max_tokens = 16;  // 0: what the capacity (and the pool) leave after the prompt
  std::vector<std::int32_t> stop_ids;  // ends the sequence besides the model's eos ids
  bool ignore_eos = false;
  std::vector<std::string> stop;       // stop strings (needs the model's tokenizer)
  head_kind head = head_kind::sample;
  // A constrained output (JSON schema, regex, grammar, choice): open() compiles it (cached per spec)
  // against the model's vocabulary and sets `guide`; refused with bad_request when it does not compile.
  guide::guide_spec guided;
  guide_fn guide;
  request_inputs inputs;
  // Features of the request that this driver checks against the compatibility table.
  // beams > 1: beam search of that width (greedy rules only: temperature 0, no penalties, no guide,
  // no stop strings; at most 10, and at most max_rows). Each step keeps the `beams` best continuations
  // of the live beams by summed log-probability; a beam that draws an end token becomes a hypothesis.
  // The search ends when `beams` hypotheses are in and (early_stopping, or no live beam can still
  // score above the worst of them), or at max_tokens. The finish reports every hypothesis, best first.
  std::int32_t beams = 1;
  float length_penalty = 1.0f;
  bool early_stopping = false;
  std::string adapter;  // a LoRA adapter loaded into the driver (load_adapter), by name; empty: the base model
  bool resume = false;
  bool speculate = true;  // false: this request opts out of the driver's draft policy
};

using seq_id = std::uint64_t;

// One hypothesis of a beam search (seq_request::beams > 1): its output tokens, their summed
// log-probability, and its score = logprob / length^length_penalty (length: output tokens, an end
// token included), by which beams are ranked.
struct beam_result {
  std::vector<std::int32_t> tokens;
  std::string text;  // when the model has a tokenizer
  double logprob = 0;
  double score = 0;
  finish_reason finished = finish_reason::length;
};

struct seq_update {
  seq_id id = 0;
  std::vector<std::int32_t> tokens;        // committed this round (zero, one, or several after a verify window)
  std::vector<exec::sample_pick> picks;    // their logprob records
  std::vector<std::vector<float>> logits;  // Head::Logits rows
  std::string text;                        // new final text (when the model has a tokenizer)
  std::optional<finish_reason> finished;
  std::int64_t cached_tokens = 0;          // with the finish: prompt tokens taken from the prefix cache
  std::vector<beam_result> beams;          // with the finish of a beam search: its hypotheses, best first (tokens: the best's)
};

struct step_report {
  std::vector<seq_update> updates;
  std::int64_t decode_rows = 0;      // sequences advanced by the decode step
  std::int64_t prefill_tokens = 0;   // prompt tokens computed
  std::int64_t executor_steps = 0;
  std::int64_t preempted = 0;
  std::int64_t draft_tokens = 0;     // drafts verified this round
  std::int64_t accepted_tokens = 0;  // of which accepted
};

struct driver_counters {
  std::int64_t rounds = 0;
  std::int64_t executor_steps = 0;
  std::int64_t prefill_tokens = 0;      // computed (cached ones are not)
  std::int64_t prefix_hit_tokens = 0;   // skipped thanks to the prefix cache
  std::int64_t decode_tokens = 0;
  std::int64_t preemptions = 0;
  std::int64_t pool_blocks = 0;
  std::int64_t pool_available = 0;
  std::int64_t waiting = 0;             // sequences opened and not yet admitted
  std::int64_t running = 0;             // sequences holding a row
  std::int64_t verify_steps = 0;        // target steps that verified drafts
  std::int64_t draft_tokens = 0;        // drafts proposed and verified
  std::int64_t accepted_tokens = 0;     // drafts accepted (acceptance rate: accepted / draft)
  std::int64_t draft_steps = 0;         // steps of the draft model
  std::int64_t chained_steps = 0;       // decode steps run inside chains
  double round_seconds = 0;             // time in step() (rounds)
  double executor_seconds = 0;          // of which inside the executor's step calls (the rest is the host's share)
};

struct entry_key {
  families::program program = families::program::step;
  families::step_shape shape{1, 1, 1};
  head_kind head = head_kind::sample;
  std::vector<std::string> carried;
  friend bool operator==(const entry_key&, const entry_key&) = default;
  std::string str() const;
};


struct generation {
  std::vector<std::int32_t> tokens;
  std::vector<exec::sample_pick> picks;
  std::string text;
  finish_reason finished = finish_reason::length;
  std::vector<beam_result> beams;  // a beam search's hypotheses, best first
};

// ---- the driver -------------------------------------------------------------------------------------

struct unprepared {};
struct serving {};
template <typename Phase>
class driver;
struct driver_state;

template <>
class driver<unprepared> {
 public:
  driver(std::shared_ptr<const families::model_handle> handle, exec::executor& ex, driver_options options);
  driver(driver&&) noexcept;
  driver& operator=(driver&&) noexcept;
  ~driver();

  // Validates the options, loads the weights, adds and warms every entry the options admit.
  result<driver<serving>, std::pair<driver<unprepared>, driver_error>> prepare() &&;
  const driver_options& options() const;

 private:
  friend class driver<serving>;
  explicit driver(std::unique_ptr<driver_state> s);
  std::unique_ptr<driver_state> s_;
};

template <>
class driver<serving> {
 public:
  driver(driver&&) noexcept;
  driver& operator=(driver&&) noexcept;
  ~driver();

  // Admission: checks the request whole (features, inputs, ids, parameters, length, head) before it
  // takes a row or a block; the sequence waits until a round admits it.
  result<seq_id, driver_error> open(seq_request request);
  // One round of continuous batching. Fails only when the executor fails a step; the sequences of
  // that step finish with finish_reason::error.
  result<step_report, driver_error> step();
  // Stops a sequence at the next round (reported finished with finish_reason::cancelled).
  result<void, driver_error> cancel(seq_id id);
  // Forgets a sequence (cancelling it when still running) and frees its blocks and history.
  result<void, driver_error> release(seq_id id);
  bool idle() const;  // no sequence waits or runs

  // One sequence driven to its end through the same surface; `sink` sees every round's update.
  result<generation, driver_error> generate(seq_request request, const std::function<void(const seq_update&)>& sink = {});
  // The encode program over rows of tokens (each at most prefill_chunk long): hidden states [n, hidden]
  // per row. Rows of a chunk bucket run several to a step; an entry per shape is added when first
  // needed (options.encode prepares the full-chunk one at prepare time).
  result<std::vector<tensor>, driver_error> encode(std::span<const std::vector<std::int32_t>> rows);
  // One embedding per row: its encode hidden states pooled (mean, first token, last token) and
  // L2-normalized when `how` says so (families/pooling.hpp: what the checkpoint declares).
  result<std::vector<std::vector<float>>, driver_error> embed(std::span<const std::vector<std::int32_t>> rows, const families::pooling& how);

  // Images (docs/vision.md): the model's vision tower over one image, its rows [tokens, hidden]
  // (program_not_offered without a tower); and a request whose prompt marks each image with the
  // tower's begin token, rewritten so each begin is followed by the image's rows (as the request
  // inputs embeds / embed_mask, and attend_until where the image's rows see each other both ways)
  // and the end token. One image per begin token, in order; bad_request when they do not match.
  result<tensor, driver_error> encode_image(const families::image_u8& image);
  result<seq_request, driver_error> with_images(seq_request req, std::span<const families::image_u8> images);

  // LoRA adapters (adapter_options): a PEFT directory read and checked against the model under `name`
  // (replacing nothing: a name already loaded is refused), served to requests that name it; unload is
  // refused while a waiting or running sequence uses it.
  result<void, driver_error> load_adapter(const std::string& name, const std::filesystem::path& dir);
  result<void, driver_error> unload_adapter(const std::string& name);
  std::vector<adapter_info> adapters() const;

  driver_counters counters() const;
  std::vector<entry_key> entries() const;
  const driver_options& options() const;
  const families::model_handle& model() const;

 private:
  friend class driver<unprepared>;
  explicit driver(std::unique_ptr<driver_state> s);
  std::unique_ptr<driver_state> s_;
};

}  // namespace troupe::driver
