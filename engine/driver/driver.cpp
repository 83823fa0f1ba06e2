#include "engine/driver/driver.hpp"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <limits>
#include <deque>
#include <set>
#include <tuple>

#include "engine/driver/block_pool.hpp"
#include "engine/driver/weight_source.hpp"
#include "engine/guide/guide.hpp"
#include "engine/text/detokenizer.hpp"

namespace troupe::driver {

// ---- names and messages -----------------------------------------------------------------------------

std::string_view name(feature f) {
  switch (f) {
    case feature::paged_pool: return "paged_pool";
    case feature::prefix_cache: return "prefix_cache";
    case feature::placement: return "placement";
    case feature::draft_policy: return "draft_policy";
    case feature::recurrent_state: return "recurrent_state";
    case feature::adapter: return "adapter";
    case feature::beam_search: return "beam_search";
    case feature::request_inputs: return "request_inputs";
    case feature::resume: return "resume";
  }
  return "unknown";
}

std::string_view name(input_error_code c) {
  switch (c) {
    case input_error_code::undeclared: return "undeclared";
    case input_error_code::missing_required: return "missing_required";
    case input_error_code::wrong_type: return "wrong_type";
    case input_error_code::wrong_width: return "wrong_width";
    case input_error_code::not_covering_prompt: return "not_covering_prompt";
    case input_error_code::position_outside: return "position_outside";
  }
  return "unknown";
}

std::string input_error::message() const {
  return "request input '" + input + "': " + reason + " (" + std::string(name(code)) + ")";
}

std::string_view name(driver_error_code c) {
  switch (c) {
    case driver_error_code::bad_options: return "bad_options";
    case driver_error_code::prepare_failed: return "prepare_failed";
    case driver_error_code::entry_limit: return "entry_limit";
    case driver_error_code::byte_limit: return "byte_limit";
    case driver_error_code::bad_request: return "bad_request";
    case driver_error_code::bad_input: return "bad_input";
    case driver_error_code::incompatible: return "incompatible";
    case driver_error_code::unsupported_feature: return "unsupported_feature";
    case driver_error_code::no_head: return "no_head";
    case driver_error_code::too_long: return "too_long";
    case driver_error_code::pool_too_small: return "pool_too_small";
    case driver_error_code::unknown_sequence: return "unknown_sequence";
    case driver_error_code::program_not_offered: return "program_not_offered";
    case driver_error_code::step_failed: return "step_failed";
  }
  return "unknown";
}

std::string driver_error::message() const {
  std::string m = reason + " (" + std::string(name(code)) + ")";
  if (input) m += ": " + input->message();
  if (pair) m += ": " + std::string(name(pair->a)) + " with " + std::string(name(pair->b)) + ": " + pair->reason;
  return m;
}

std::string_view name(finish_reason r) {
  switch (r) {
    case finish_reason::eos: return "eos";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::length: return "length";
    case finish_reason::capacity: return "capacity";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::pool_exhausted: return "pool_exhausted";
    case finish_reason::error: return "error";
  }
  return "unknown";
}

std::string entry_key::str() const {
  std::string s = std::string(families::program_name(program)) + " " + shape.str() + (head == head_kind::sample ? " head=sample" : " head=logits");
  for (const auto& c : carried) s += " +" + c;
  return s;
}

// ---- the compatibility table ------------------------------------------------------------------------

namespace {

struct refused_pair {
  feature a;
  feature b;
  const char* reason;
};

// The one table. Order matters only for which refusal is reported first.
constexpr refused_pair compatibility_table[] = {
    {feature::request_inputs, feature::resume, "a resumed sequence does not keep the request inputs its cached state was computed with"},
    {feature::beam_search, feature::draft_policy, "drafts are verified per sequence, not per beam"},
    {feature::beam_search, feature::request_inputs, "beams would have to copy per-row request inputs on every fork"},
    {feature::recurrent_state, feature::prefix_cache, "recurrent state is not a function of a block of tokens, so it cannot be shared by prefix"},
    {feature::recurrent_state, feature::draft_policy, "rejected draft tokens cannot be rolled back out of recurrent state"},
    {feature::adapter, feature::placement, "adapters are loaded per executable, not split across a placement"},
    {feature::resume, feature::placement, "a saved sequence is tied to the executable that computed it"},
};

bool feature_active(std::span<const feature> active, feature f) { return std::find(active.begin(), active.end(), f) != active.end(); }

}  // namespace

std::optional<incompatible> check_compatible(std::span<const feature> active) {
  for (const auto& p : compatibility_table)
    if (feature_active(active, p.a) && feature_active(active, p.b)) return incompatible{p.a, p.b, p.reason};
  return std::nullopt;
}

bool implemented(feature f) {
  switch (f) {
    case feature::paged_pool:
    case feature::prefix_cache:
    case feature::request_inputs:
      return true;
    default:
      return false;
  }
}

// ---- request inputs ---------------------------------------------------------------------------------

result<void, input_error> check_inputs(const families::model_schema& schema, std::int64_t prompt_tokens, const request_inputs& inputs) {
  for (const auto& [name, v] : inputs)
    if (!schema.find_input(name)) return unexpected(input_error{input_error_code::undeclared, name, "the model declares no such input"});
  for (const auto& d : schema.request_inputs()) {
    auto it = inputs.find(d.name);
    if (it == inputs.end()) {
      if (d.presence == families::input_presence::required)
        return unexpected(input_error{input_error_code::missing_required, d.name, "required by the model and not given"});
      continue;
    }
    const auto& v = it->second;
    if (v.values.type() != d.element)
      return unexpected(input_error{input_error_code::wrong_type, d.name,
                                    "values are " + std::string(name(v.values.type())) + ", the model declares " +
                                        std::string(name(d.element))});
    const auto dims = v.values.shape().dims();
    const bool width_ok = dims.size() == d.width.size() + 1 && std::equal(d.width.begin(), d.width.end(), dims.begin() + 1);
    if (!width_ok) return unexpected(input_error{input_error_code::wrong_width, d.name, "values are " + v.values.shape().str() + ", not [n, width...]"});
    const std::int64_t n = dims[0];
    if (v.positions.empty()) {
      const std::int64_t want = d.extent == families::input_extent::per_position ? prompt_tokens : 1;
      if (n != want)
        return unexpected(input_error{input_error_code::not_covering_prompt, d.name,
                                      "a dense value needs " + std::to_string(want) + " rows, got " + std::to_string(n)});
      continue;
    }
    if (d.extent == families::input_extent::per_row)
      return unexpected(input_error{input_error_code::position_outside, d.name, "a per-row input takes no positions"});
    if (static_cast<std::int64_t>(v.positions.size()) != n)
      return unexpected(input_error{input_error_code::not_covering_prompt, d.name, "one position per values row is needed"});
    std::set<std::int64_t> seen;
    for (auto p : v.positions) {
      if (p < 0 || p >= prompt_tokens)
        return unexpected(input_error{input_error_code::position_outside, d.name,
                                      "position " + std::to_string(p) + " is outside the prompt of " + std::to_string(prompt_tokens) + " tokens"});
      if (!seen.insert(p).second)
        return unexpected(input_error{input_error_code::position_outside, d.name, "position " + std::to_string(p) + " repeats"});
    }
  }
  return {};
}

// ---- state ------------------------------------------------------------------------------------------

namespace {

auto key_tuple(const entry_key& k) {
  const auto& s = k.shape;
  return std::make_tuple(k.program, s.rows(), s.tokens(), s.capacity(), s.kv().kind, s.kv().block_size, s.kv().pool_blocks,
                         s.logits(), s.hidden_carry(), k.head, k.carried);
}
struct key_less {
  bool operator()(const entry_key& a, const entry_key& b) const { return key_tuple(a) < key_tuple(b); }
};

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
};

std::vector<std::int64_t> buckets(std::int64_t first, std::int64_t last) {
  std::vector<std::int64_t> b;
  for (std::int64_t v = first; v < last; v *= 2) b.push_back(v);
  b.push_back(last);
  return b;
}

}  // namespace

// A tensor-parallel rank beyond rank 0: its shard, executor and entries (keyed like rank 0's).
struct rank_state {
  std::shared_ptr<const families::model_handle> handle;
  exec::executor* ex = nullptr;
  std::shared_ptr<remote_rank> remote;  // a rank in another process: handle and ex unused
  std::unique_ptr<weight_map_source> weights;
  exec::executable_id exe{};
  std::map<entry_key, exec::entry_id, key_less> entries;
};

// The other ranks' threads: one per rank, started with the first step and kept for the driver's life,
// so a step costs a wake-up per rank rather than a thread start. `start` hands every rank the step;
// `wait` blocks until each has run it and returns the first refusal.
class rank_workers {
 public:
  explicit rank_workers(std::vector<rank_state>& ranks) : ranks_(ranks), errors_(ranks.size()) {
    for (std::size_t r = 0; r < ranks.size(); ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  rank_workers(const rank_workers&) = delete;
  ~rank_workers() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    go_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void start(const entry_key& k, const exec::step_inputs& in) {
    std::lock_guard lock(m_);
    key_ = k;  // a copy: the caller's key may be a temporary
    in_ = &in;
    pending_ = ranks_.size();
    for (auto& e : errors_) e.reset();
    ++round_;
    go_.notify_all();
  }
  std::optional<exec::exec_error> wait() {
    std::unique_lock lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
    for (auto& e : errors_)
      if (e) return e;
    return std::nullopt;
  }

 private:
  void loop(std::size_t r) {
    std::uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(m_);
      go_.wait(lock, [&] { return stopping_ || round_ != seen; });
      if (stopping_) return;
      seen = round_;
      const entry_key& k = key_;  // unchanged until every rank is done
      const exec::step_inputs& in = *in_;
      lock.unlock();
      std::optional<exec::exec_error> err;
      if (auto& rk = ranks_[r]; rk.remote) {
        if (auto done = rk.remote->step(k, in); !done) err = exec::exec_error{exec::exec_error_code::device_error, "remote rank " + std::to_string(r + 1), done.error()};
      } else if (auto out = rk.ex->step(rk.entries.at(k), in); !out) {
        err = out.error();
      }
      lock.lock();
      if (err) errors_[r] = std::move(err);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<rank_state>& ranks_;
  std::vector<std::optional<exec::exec_error>> errors_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable go_, done_;
  entry_key key_;
  const exec::step_inputs* in_ = nullptr;
  std::size_t pending_ = 0;
  std::uint64_t round_ = 0;
  bool stopping_ = false;
};

// The other ranks' run of one step while the sampling rank runs on the caller's thread; `wait` (or the
// destructor) waits for them.
class others_run {
 public:
  others_run(rank_workers& w, const entry_key& k, const exec::step_inputs& in) : w_(w) { w_.start(k, in); }
  others_run(const others_run&) = delete;
  ~others_run() {
    if (!waited_) (void)w_.wait();
  }
  std::optional<exec::exec_error> wait() {
    waited_ = true;
    return w_.wait();
  }

 private:
  rank_workers& w_;
  bool waited_ = false;
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

  families::kv_layout layout() const { return families::kv_layout::paged(block_size, pool_blocks); }
  entry_key step_key(std::int64_t rows, std::int64_t tokens, head_kind head) const {
    entry_key k;
    k.program = families::program::step;
    k.shape = families::step_shape(rows, tokens, options.capacity).with_kv(layout());
    k.head = head;
    return k;
  }
  entry_key encode_key(std::int64_t rows = 1, std::int64_t tokens = 0) const {
    entry_key k;
    k.program = families::program::encode;
    if (tokens == 0) tokens = options.prefill_chunk;
    k.shape = families::step_shape(rows, tokens, tokens);
    return k;
  }

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
  result<void, driver_error> run_prefill(sequence& s, std::int64_t n, step_report& report, std::map<seq_id, seq_update>& updates);
  result<step_report, driver_error> round();
  exec::mask_hook mask_hook_for(const std::vector<sequence*>& rows) const;
};

result<void, driver_error> driver_state::validate() {
  auto bad = [](std::string why) { return unexpected(driver_error{driver_error_code::bad_options, std::move(why)}); };
  const auto& o = options;
  if (o.max_rows < 1) return bad("max_rows must be at least 1");
  if (o.capacity < 1) return bad("capacity must be at least 1");
  const auto max_pos = handle->model().config().max_positions;
  if (max_pos > 0 && o.capacity > max_pos)
    return bad("capacity " + std::to_string(o.capacity) + " exceeds the model's " + std::to_string(max_pos) + " positions");
  if (o.prefill_chunk < 1 || o.prefill_chunk > o.capacity) return bad("prefill_chunk must lie in [1, capacity]");
  if (o.token_budget < o.max_rows) return bad("token_budget must cover a decode row per sequence (at least max_rows)");
  if (o.max_entries < 1) return bad("max_entries must be at least 1");
  if (o.paged) {
    if (o.block_size < 1 || o.block_size > o.capacity) return bad("block_size must lie in [1, capacity]");
    block_size = o.block_size;
    pool_blocks = o.pool_blocks > 0 ? o.pool_blocks : (o.max_rows * o.capacity + o.block_size - 1) / o.block_size;
  } else {
    if (o.pool_blocks != 0) return bad("pool_blocks applies to a paged pool only");
    block_size = o.capacity;
    pool_blocks = o.max_rows;
  }
  if (pool_blocks > std::numeric_limits<std::int32_t>::max() / std::max<std::int64_t>(block_size, 1))
    return bad("the pool holds more slots than a 32-bit KV map can address");
  std::vector<feature> active;
  if (o.paged) active.push_back(feature::paged_pool);
  if (o.prefix_cache) active.push_back(feature::prefix_cache);
  if (auto c = check_compatible(active))
    return unexpected(driver_error{driver_error_code::incompatible, "the driver's options do not compose", std::nullopt, *c});
  return {};
}

result<void, driver_error> driver_state::add(const entry_key& k) {
  if (entries.contains(k)) return {};
  // The head is an executor stage over the step's logits, not part of the traced graph: a key that
  // differs from a compiled one only in its head shares that entry instead of compiling a copy.
  entry_key twin = k;
  twin.head = k.head == head_kind::logits ? head_kind::sample : head_kind::logits;
  if (const auto it = entries.find(twin); it != entries.end()) {
    entries.emplace(k, it->second);
    for (auto& r : ranks)
      if (!r.remote) r.entries.emplace(k, r.entries.at(twin));  // a remote rank keys entries without the head
    entry_order.push_back(k);
    return {};
  }
  if (static_cast<std::int64_t>(entries.size()) >= options.max_entries)
    return unexpected(driver_error{driver_error_code::entry_limit,
                                   "entry " + k.str() + " would pass the limit of " + std::to_string(options.max_entries) + " entries"});
  families::step_spec spec;
  spec.program = k.program;
  spec.shape = k.shape;
  spec.carried_inputs = k.carried;
  auto g = handle->model().trace(spec, options.limits);
  if (!g) return unexpected(driver_error{driver_error_code::prepare_failed, "trace of " + k.str() + ": " + g.error().message()});
  auto e = ex->add_entry(exe, *g);
  if (!e) return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + ": " + e.error().message()});
  if (options.max_retained_bytes > 0) {
    const auto m = ex->memory();
    const auto total = m.weight_bytes + m.state_bytes + m.scratch_bytes;
    if (total > options.max_retained_bytes) {
      // Not published: the driver never steps it. The executor keeps its compiled form until the
      // executable goes (the contract has no removal).
      return unexpected(driver_error{driver_error_code::byte_limit, "entry " + k.str() + " would retain " + std::to_string(total) +
                                                                        " bytes, past the bound of " + std::to_string(options.max_retained_bytes)});
    }
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    auto& r = ranks[i];
    if (r.remote) {
      if (auto a = r.remote->add(k); !a)
        return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + " on remote rank " + std::to_string(i + 1) + ": " + a.error()});
      continue;
    }
    auto rg = r.handle->model().trace(spec, options.limits);
    if (!rg) return unexpected(driver_error{driver_error_code::prepare_failed, "trace of " + k.str() + " on rank " + std::to_string(i + 1) + ": " + rg.error().message()});
    auto re = r.ex->add_entry(r.exe, *rg);
    if (!re) return unexpected(driver_error{driver_error_code::prepare_failed, "entry " + k.str() + " on rank " + std::to_string(i + 1) + ": " + re.error().message()});
    r.entries.emplace(k, *re);
  }
  entries.emplace(k, *e);
  entry_order.push_back(k);
  return {};
}

result<void, driver_error> driver_state::prepare() {
  if (auto v = validate(); !v) return v;
  const auto& cfg = handle->model().config();
  vocab = cfg.vocab;
  eos.assign(cfg.eos_ids.begin(), cfg.eos_ids.end());
  if (const auto* t = handle->text())
    for (auto id : t->specials().end_ids) eos.push_back(static_cast<std::int32_t>(id));
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());

  row_buckets = buckets(1, options.max_rows);
  chunk_buckets = buckets(std::min<std::int64_t>(16, options.prefill_chunk), options.prefill_chunk);
  std::vector<head_kind> heads{head_kind::sample};
  if (options.logits_head) heads.push_back(head_kind::logits);
  // An encoder (BERT) offers the encode program only: the driver serves embeddings and refuses generation.
  const auto& schema = handle->model().schema();
  const bool generates = schema.offers(families::program::step);
  if (!generates) heads.clear();
  std::vector<entry_key> keys;
  for (auto h : heads) {
    for (auto r : row_buckets) keys.push_back(step_key(r, 1, h));
    for (auto t : chunk_buckets)
      if (t > 1) keys.push_back(step_key(1, t, h));
  }
  if (options.encode || !generates) {
    if (!schema.offers(families::program::encode))
      return unexpected(driver_error{driver_error_code::program_not_offered, "the model offers no encode program"});
    keys.push_back(encode_key());
  }
  const auto total = static_cast<std::int64_t>(keys.size()) + 1;
  std::int64_t done = 0;
  auto progress = [&] {
    if (options.on_prepare) options.on_prepare(done, total);
  };
  progress();

  if (options.connect)
    if (auto c = options.connect(); !c) return unexpected(driver_error{driver_error_code::prepare_failed, "joining the replica's ranks: " + c.error()});
  weights = std::make_unique<weight_map_source>(handle->model().weights());
  auto exe_or = ex->load(*weights);
  if (!exe_or) return unexpected(driver_error{driver_error_code::prepare_failed, "load: " + exe_or.error().message()});
  exe = *exe_or;
  for (std::size_t i = 0; i < options.other_ranks.size(); ++i) {
    const auto& o = options.other_ranks[i];
    if (!o.remote && (!o.shard || o.ex == nullptr))
      return unexpected(driver_error{driver_error_code::bad_options, "tensor-parallel rank " + std::to_string(i + 1) + " has no shard or executor"});
    rank_state r;
    if (o.remote) {
      r.remote = o.remote;
      if (auto l = r.remote->load(); !l)
        return unexpected(driver_error{driver_error_code::prepare_failed, "load on remote rank " + std::to_string(i + 1) + ": " + l.error()});
      ranks.push_back(std::move(r));
      continue;
    }
    r.handle = o.shard;
    r.ex = o.ex;
    r.weights = std::make_unique<weight_map_source>(r.handle->model().weights());
    auto re = r.ex->load(*r.weights);
    if (!re) return unexpected(driver_error{driver_error_code::prepare_failed, "load on rank " + std::to_string(i + 1) + ": " + re.error().message()});
    r.exe = *re;
    ranks.push_back(std::move(r));
  }
  ++done;
  progress();
  for (const auto& k : keys) {
    if (auto a = add(k); !a) return a;
    ++done;
    progress();
  }
  pool.emplace(static_cast<std::int32_t>(pool_blocks), static_cast<std::int32_t>(block_size));
  counters.pool_blocks = pool_blocks;
  return {};
}

// ---- sequences --------------------------------------------------------------------------------------

void driver_state::free_blocks(sequence& s) {
  for (auto b : s.blocks) pool->release(b);
  s.blocks.clear();
  s.chain.clear();
  s.computed = 0;
}

void driver_state::finish(sequence& s, finish_reason r) {
  if (s.phase == seq_phase::finished) return;
  s.finished = r;
  s.phase = seq_phase::finished;
  free_blocks(s);
  running.erase(std::remove(running.begin(), running.end(), s.id), running.end());
  waiting.erase(std::remove(waiting.begin(), waiting.end(), s.id), waiting.end());
  ex->close_history(s.id);
}

result<void, driver_error> driver_state::admit(sequence& s) {
  s.phase = seq_phase::running;
  s.admitted = next_admission++;
  running.push_back(s.id);
  const bool first = s.cached < 0;  // a preempted sequence admitted again finds its own blocks: not counted
  if (first) s.cached = 0;
  if (!options.prefix_cache || !s.cacheable) return {};
  // Share cached blocks for the longest cached chain of full blocks, leaving at least the last token
  // to compute (its logits give the next pick).
  const std::int64_t bs = block_size;
  const std::int64_t full = (static_cast<std::int64_t>(s.tokens.size()) - 1) / bs;
  std::uint64_t parent = root_hash;
  for (std::int64_t b = 0; b < full; ++b) {
    const std::span<const std::int32_t> toks(s.tokens.data() + b * bs, static_cast<std::size_t>(bs));
    const auto h = chain_hash(parent, toks);
    auto hit = pool->lookup(h, parent, toks);
    if (!hit) break;
    s.blocks.push_back(*hit);
    s.chain.push_back(h);
    s.computed += bs;
    counters.prefix_hit_tokens += bs;
    if (first) s.cached = std::min(s.computed, s.prompt_len);
    parent = h;
  }
  return {};
}

// Blocks for positions [0, upto). Preempts the latest admitted other sequence when the pool is dry
// (preemption on); false when the blocks cannot be had.
bool driver_state::ensure_blocks(sequence& s, std::int64_t upto, step_report& report) {
  const std::int64_t need = (upto + block_size - 1) / block_size;
  while (static_cast<std::int64_t>(s.blocks.size()) < need) {
    if (auto b = pool->allocate()) {
      s.blocks.push_back(*b);
      continue;
    }
    if (!options.preempt) return false;
    sequence* victim = nullptr;
    for (auto id : running) {
      auto& o = seqs.at(id);
      if (o.id != s.id && !o.blocks.empty() && (!victim || o.admitted > victim->admitted)) victim = &o;
    }
    if (!victim) return false;
    free_blocks(*victim);
    victim->phase = seq_phase::waiting;
    running.erase(std::remove(running.begin(), running.end(), victim->id), running.end());
    waiting.push_front(victim->id);
    ++report.preempted;
    ++counters.preemptions;
  }
  return true;
}

void driver_state::publish_full_blocks(sequence& s) {
  if (!options.prefix_cache || !s.cacheable) return;
  const std::int64_t bs = block_size;
  while (static_cast<std::int64_t>(s.chain.size()) < s.computed / bs) {
    const auto b = static_cast<std::int64_t>(s.chain.size());
    const std::span<const std::int32_t> toks(s.tokens.data() + b * bs, static_cast<std::size_t>(bs));
    const auto parent = b == 0 ? root_hash : s.chain.back();
    const auto h = chain_hash(parent, toks);
    const auto blk = s.blocks[static_cast<std::size_t>(b)];
    if (!pool->published(blk)) (void)pool->publish(blk, h, parent, toks);
    s.chain.push_back(h);
  }
}

void driver_state::accept(sequence& s, const exec::sampled_row& row, seq_update& u) {
  const auto tok = row.pick.token;
  s.tokens.push_back(tok);
  ++s.generated;
  u.tokens.push_back(tok);
  u.picks.push_back(row.pick);
  if (!row.logits.empty()) u.logits.push_back(row.logits);
  if (s.detok) {
    auto out = s.detok->push(tok);
    u.text += out.text;
    if (out.stop) {
      finish(s, finish_reason::stop_string);
      return;
    }
  }
  const bool is_eos = !s.req.ignore_eos && std::binary_search(eos.begin(), eos.end(), tok);
  if (is_eos || std::find(s.stop_ids.begin(), s.stop_ids.end(), tok) != s.stop_ids.end()) {
    finish(s, finish_reason::eos);
  } else if (s.generated >= s.req.max_tokens) {
    finish(s, finish_reason::length);
  } else if (static_cast<std::int64_t>(s.tokens.size()) > options.capacity) {
    finish(s, finish_reason::capacity);
  }
  if (s.finished && s.detok && *s.finished != finish_reason::stop_string) u.text += s.detok->finish().text;
}

exec::mask_hook driver_state::mask_hook_for(const std::vector<sequence*>& rows) const {
  bool any = false;
  for (auto* s : rows) any = any || static_cast<bool>(s->req.guide);
  if (!any) return {};
  const auto words = static_cast<std::size_t>((vocab + 31) / 32);
  return [rows, words](std::vector<std::vector<std::uint32_t>>& masks) {
    for (std::size_t r = 0; r < rows.size() && r < masks.size(); ++r) {
      const auto* s = rows[r];
      if (!s->req.guide) continue;
      masks[r].assign(words, 0u);
      const std::span<const std::int32_t> out(s->tokens.data() + s->prompt_len, s->tokens.size() - static_cast<std::size_t>(s->prompt_len));
      s->req.guide(out, masks[r]);
    }
  };
}

result<void, driver_error> driver_state::run_decode(std::vector<sequence*>& rows, step_report& report,
                                                    std::map<seq_id, seq_update>& updates) {
  const auto D = static_cast<std::int64_t>(rows.size());
  const auto R = *std::lower_bound(row_buckets.begin(), row_buckets.end(), D);
  const auto C = options.capacity;
  bool want_logits = false;
  for (auto* s : rows) want_logits = want_logits || s->req.head == head_kind::logits;
  const auto key = step_key(R, 1, want_logits ? head_kind::logits : head_kind::sample);
  const auto entry = entries.at(key);

  tensor ids(dtype::i32, {R}), pos(dtype::i32, {R}), write(dtype::i32, {R}), read(dtype::i32, {R, C});
  auto* idp = ids.as<std::int32_t>();
  auto* pp = pos.as<std::int32_t>();
  auto* wp = write.as<std::int32_t>();
  auto* rp = read.as<std::int32_t>();
  std::fill(idp, idp + R, 0);
  std::fill(pp, pp + R, 0);
  std::fill(wp, wp + R, -1);
  std::fill(rp, rp + R * C, -1);
  std::vector<exec::sample_row_request> heads;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    const std::int64_t p = s.computed;
    idp[r] = s.tokens[static_cast<std::size_t>(p)];
    pp[r] = static_cast<std::int32_t>(p);
    wp[r] = static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(p / block_size)] * block_size + p % block_size);
    for (std::int64_t j = 0; j <= p; ++j)
      rp[r * C + j] = static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(j / block_size)] * block_size + j % block_size);
    heads.push_back({s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), s.req.head == head_kind::logits});
  }
  exec::step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", write.view()}, {"kv_read_map", read.view()}};
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  auto picks = ex->step_sample(entry, in, heads, mask_hook_for(rows));
  if (others)
    if (auto e = others->wait(); e && picks) picks = unexpected(*e);
  ++report.executor_steps;
  if (!picks) {
    for (auto* s : rows) {
      finish(*s, finish_reason::error);
      updates[s->id].finished = finish_reason::error;
    }
    return unexpected(driver_error{driver_error_code::step_failed, "decode step " + key.str() + ": " + picks.error().message()});
  }
  report.decode_rows += D;
  counters.decode_tokens += D;
  for (std::int64_t r = 0; r < D; ++r) {
    auto& s = *rows[static_cast<std::size_t>(r)];
    ++s.computed;
    publish_full_blocks(s);
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, (*picks)[static_cast<std::size_t>(r)], u);
  }
  return {};
}

result<void, driver_error> driver_state::run_prefill(sequence& s, std::int64_t n, step_report& report, std::map<seq_id, seq_update>& updates) {
  const auto T = *std::lower_bound(chunk_buckets.begin(), chunk_buckets.end(), n);
  const auto C = options.capacity;
  const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
  const bool last = n == pending;
  const bool want_logits = last && s.req.head == head_kind::logits;
  const auto key = step_key(1, T, want_logits ? head_kind::logits : head_kind::sample);
  const auto entry = entries.at(key);
  tensor ids(dtype::i32, {T}), pos(dtype::i32, {T}), write(dtype::i32, {T}), read(dtype::i32, {1, C});
  auto* idp = ids.as<std::int32_t>();
  auto* pp = pos.as<std::int32_t>();
  auto* wp = write.as<std::int32_t>();
  auto* rp = read.as<std::int32_t>();
  const std::int64_t pad = T - n;  // at the front, so the row's last token is real
  auto slot = [&](std::int64_t p) { return static_cast<std::int32_t>(s.blocks[static_cast<std::size_t>(p / block_size)] * block_size + p % block_size); };
  for (std::int64_t t = 0; t < T; ++t) {
    if (t < pad) {
      idp[t] = 0;
      pp[t] = 0;
      wp[t] = -1;
      continue;
    }
    const std::int64_t p = s.computed + t - pad;
    idp[t] = s.tokens[static_cast<std::size_t>(p)];
    pp[t] = static_cast<std::int32_t>(p);
    wp[t] = slot(p);
  }
  const std::int64_t end = s.computed + n;
  for (std::int64_t j = 0; j < C; ++j) rp[j] = j < end ? slot(j) : -1;
  exec::step_inputs in;
  in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"kv_write_map", write.view()}, {"kv_read_map", read.view()}};
  ++report.executor_steps;
  result<std::vector<exec::sampled_row>, exec::exec_error> picks = std::vector<exec::sampled_row>{};
  std::optional<others_run> others;
  if (!ranks.empty()) others.emplace(rank_threads(), key, in);
  if (last) {
    const exec::sample_row_request head{s.id, s.req.sampling, static_cast<std::uint64_t>(s.generated), want_logits};
    std::vector<sequence*> one{&s};
    picks = ex->step_sample(entry, in, std::span(&head, 1), mask_hook_for(one));
  } else {
    auto out = ex->step(entry, in);
    if (!out) picks = unexpected(out.error());
  }
  if (others)
    if (auto e = others->wait(); e && picks) picks = unexpected(*e);
  if (!picks) {
    finish(s, finish_reason::error);
    updates[s.id].id = s.id;
    updates[s.id].finished = finish_reason::error;
    return unexpected(driver_error{driver_error_code::step_failed, "prefill step " + key.str() + ": " + picks.error().message()});
  }
  s.computed = end;
  report.prefill_tokens += n;
  counters.prefill_tokens += n;
  publish_full_blocks(s);
  if (last) {
    auto& u = updates[s.id];
    u.id = s.id;
    accept(s, picks->front(), u);
  }
  return {};
}

result<step_report, driver_error> driver_state::round() {
  step_report report;
  std::map<seq_id, seq_update> updates;
  ++counters.rounds;

  // Cancellations take effect first.
  for (auto& [id, s] : seqs)
    if (s.cancel && s.phase != seq_phase::finished) finish(s, finish_reason::cancelled);

  // Admission, first come first served (preempted sequences were put back at the front).
  // A sequence is admitted only while the pool can hold all its tokens so far and the next one, so
  // a preempted sequence does not come straight back to take blocks from the rows that preempted it.
  while (!waiting.empty() && static_cast<std::int64_t>(running.size()) < options.max_rows) {
    auto& s = seqs.at(waiting.front());
    const auto need = (static_cast<std::int64_t>(s.tokens.size()) + block_size) / block_size;
    if (!running.empty() && pool->available() < need) break;
    waiting.pop_front();
    if (auto a = admit(s); !a) return unexpected(a.error());
  }

  // Decode rows: running sequences with exactly their last pick pending.
  std::vector<sequence*> decode;
  for (auto id : std::vector<seq_id>(running)) {
    auto& s = seqs.at(id);
    if (s.phase != seq_phase::running) continue;
    if (static_cast<std::int64_t>(s.tokens.size()) - s.computed != 1) continue;
    if (!ensure_blocks(s, s.computed + 1, report)) {
      finish(s, finish_reason::pool_exhausted);
      continue;
    }
    decode.push_back(&s);
  }
  // A preemption may have taken rows already chosen.
  std::erase_if(decode, [](sequence* s) { return s->phase != seq_phase::running || s->blocks.empty(); });
  result<void, driver_error> failure{};
  if (!decode.empty()) failure = run_decode(decode, report, updates);

  // Prefill chunks while the budget lasts.
  std::int64_t budget = options.token_budget - static_cast<std::int64_t>(decode.size());
  if (failure) {
    for (auto id : std::vector<seq_id>(running)) {
      if (budget <= 0) break;
      auto it = seqs.find(id);
      if (it == seqs.end() || it->second.phase != seq_phase::running) continue;
      auto& s = it->second;
      const std::int64_t pending = static_cast<std::int64_t>(s.tokens.size()) - s.computed;
      if (pending <= 1) continue;  // a decode row (or done)
      const std::int64_t n = std::min({pending, options.prefill_chunk, budget});
      if (!ensure_blocks(s, s.computed + n, report)) {
        finish(s, finish_reason::pool_exhausted);
        updates[s.id].id = s.id;
        continue;
      }
      if (s.phase != seq_phase::running) continue;
      if (auto r = run_prefill(s, n, report, updates); !r) {
        failure = r;
        break;
      }
      budget -= n;
    }
  }

  // Finishes of this round (and of earlier cancellations) are reported once.
  for (auto& [id, s] : seqs) {
    if (s.phase == seq_phase::finished && !s.reported) {
      auto& u = updates[id];
      u.id = id;
      u.finished = s.finished;
      u.cached_tokens = std::max<std::int64_t>(s.cached, 0);
      s.reported = true;
    }
  }
  counters.executor_steps += report.executor_steps;
  counters.pool_available = pool->available();
  for (auto& [id, u] : updates) report.updates.push_back(std::move(u));
  if (!failure) return unexpected(failure.error());
  return report;
}

// ---- driver<unprepared> -----------------------------------------------------------------------------

driver<unprepared>::driver(std::shared_ptr<const families::model_handle> handle, exec::executor& ex, driver_options options)
    : s_(std::make_unique<driver_state>()) {
  s_->handle = std::move(handle);
  s_->ex = &ex;
  s_->options = options;
}
driver<unprepared>::driver(std::unique_ptr<driver_state> s) : s_(std::move(s)) {}
driver<unprepared>::driver(driver&&) noexcept = default;
driver<unprepared>& driver<unprepared>::operator=(driver&&) noexcept = default;
driver<unprepared>::~driver() = default;
const driver_options& driver<unprepared>::options() const { return s_->options; }

result<driver<serving>, std::pair<driver<unprepared>, driver_error>> driver<unprepared>::prepare() && {
  auto r = s_->prepare();
  if (!r) {
    auto err = r.error();
    return unexpected(std::pair<driver<unprepared>, driver_error>(driver<unprepared>(std::move(s_)), std::move(err)));
  }
  return driver<serving>(std::move(s_));
}

// ---- driver<serving> --------------------------------------------------------------------------------

driver<serving>::driver(std::unique_ptr<driver_state> s) : s_(std::move(s)) {}
driver<serving>::driver(driver&&) noexcept = default;
driver<serving>& driver<serving>::operator=(driver&&) noexcept = default;
driver<serving>::~driver() {
  if (!s_) return;
  for (auto& [id, s] : s_->seqs) s_->ex->close_history(id);
}
const driver_options& driver<serving>::options() const { return s_->options; }
const families::model_handle& driver<serving>::model() const { return *s_->handle; }
std::vector<entry_key> driver<serving>::entries() const { return s_->entry_order; }
bool driver<serving>::idle() const { return s_->waiting.empty() && s_->running.empty(); }

driver_counters driver<serving>::counters() const {
  auto c = s_->counters;
  c.pool_available = s_->pool->available();
  c.waiting = static_cast<std::int64_t>(s_->waiting.size());
  c.running = static_cast<std::int64_t>(s_->running.size());
  return c;
}

result<seq_id, driver_error> driver<serving>::open(seq_request req) {
  auto& st = *s_;
  auto refuse = [](driver_error_code c, std::string why) { return unexpected(driver_error{c, std::move(why)}); };
  if (!st.handle->model().schema().offers(families::program::step))
    return refuse(driver_error_code::program_not_offered,
                  "the model (" + st.handle->model().config().family + ") is an encoder: it embeds and does not generate");
  // Features first: the request's against the driver's, through the one table.
  std::vector<feature> active;
  if (st.options.paged) active.push_back(feature::paged_pool);
  if (st.options.prefix_cache) active.push_back(feature::prefix_cache);
  if (!req.inputs.empty()) active.push_back(feature::request_inputs);
  if (req.beams > 1) active.push_back(feature::beam_search);
  if (!req.adapter.empty()) active.push_back(feature::adapter);
  if (req.resume) active.push_back(feature::resume);
  if (auto c = check_compatible(active))
    return unexpected(driver_error{driver_error_code::incompatible, "the request's features do not compose", std::nullopt, *c});
  for (auto f : active)
    if (!implemented(f)) return refuse(driver_error_code::unsupported_feature, std::string(name(f)) + " is not offered by this driver");
  if (req.beams < 1) return refuse(driver_error_code::bad_request, "beams must be at least 1");

  const auto n = static_cast<std::int64_t>(req.prompt.size());
  if (n == 0) return refuse(driver_error_code::bad_request, "the prompt is empty");
  for (std::size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= st.vocab)
      return refuse(driver_error_code::bad_request,
                    "prompt token " + std::to_string(i) + " is id " + std::to_string(req.prompt[i]) + ", outside the vocabulary of " + std::to_string(st.vocab));
  if (auto c = check_inputs(st.handle->model().schema(), n, req.inputs); !c)
    return unexpected(driver_error{driver_error_code::bad_input, "request inputs refused", c.error()});
  if (auto c = exec::check(req.sampling); !c) return refuse(driver_error_code::bad_request, c.error().message());
  for (const auto& [id, b] : req.logit_bias)
    if (id < 0 || id >= st.vocab || !std::isfinite(b)) return refuse(driver_error_code::bad_request, "logit bias on id " + std::to_string(id) + " is out of range or not finite");
  std::shared_ptr<guide::guide> guided;  // hooked once max_tokens is known (the guide completes within it)
  if (req.guided.kind != guide::guide_kind::none) {
    if (req.guide) return refuse(driver_error_code::bad_request, "a request has a guide spec or a guide function, not both");
    const auto* codec = st.handle->text();
    if (!codec) return refuse(driver_error_code::bad_request, "guided decoding needs the model's tokenizer: " + st.handle->text_problem());
    if (!st.guides)
      st.guides = std::make_unique<guide::guide_cache>(
          std::make_shared<const guide::vocabulary>(guide::vocabulary::of(codec->tokens(), static_cast<std::size_t>(st.vocab), st.eos)));
    auto g = st.guides->get(req.guided);
    if (!g) return refuse(driver_error_code::bad_request, std::string(guide::name(req.guided.kind)) + ": " + g.error().message());
    guided = std::move(*g);
  }
  // 0: as many tokens as the capacity (and the pool) leave after the prompt, for a client that named
  // no bound (the gateway's chat default).
  if (req.max_tokens == 0) {
    req.max_tokens = std::min(st.options.capacity, st.pool_blocks * st.block_size) - n;
    if (req.max_tokens < 1)
      return refuse(driver_error_code::too_long, "the prompt (" + std::to_string(n) + ") leaves no room in the capacity of " +
                                                     std::to_string(st.options.capacity) + " positions");
  }
  if (req.max_tokens < 1) return refuse(driver_error_code::bad_request, "max_tokens must be at least 1");
  if (static_cast<std::int64_t>(req.prior_output.size()) >= req.max_tokens)
    return refuse(driver_error_code::bad_request, "the prior output already holds max_tokens tokens");
  for (auto t : req.prior_output)
    if (t < 0 || t >= st.vocab) return refuse(driver_error_code::bad_request, "a prior output id is outside the vocabulary");
  if (n + req.max_tokens > st.options.capacity)
    return refuse(driver_error_code::too_long, "prompt (" + std::to_string(n) + ") + max_tokens (" + std::to_string(req.max_tokens) +
                                                   ") exceeds the capacity of " + std::to_string(st.options.capacity) + " positions");
  const std::int64_t blocks_needed = (n + req.max_tokens + st.block_size - 1) / st.block_size;
  if (blocks_needed > st.pool_blocks)
    return refuse(driver_error_code::pool_too_small,
                  "the request needs " + std::to_string(blocks_needed) + " KV blocks; the pool holds " + std::to_string(st.pool_blocks));
  if (req.head == head_kind::logits && !st.options.logits_head)
    return refuse(driver_error_code::no_head, "the request asks for logits and no Head::Logits entry is prepared");
  const auto* codec = st.handle->text();
  if (!req.stop.empty() && !codec) return refuse(driver_error_code::bad_request, "stop strings need the model's tokenizer: " + st.handle->text_problem());
  if (guided) req.guide = guide::hook(std::move(guided), req.max_tokens);

  sequence s;
  s.id = st.next_id++;
  s.tokens = req.prompt;
  s.prompt_len = n;
  s.cacheable = req.inputs.empty();
  s.stop_ids = req.stop_ids;
  if (codec) {
    text::detokenizer_options o;
    o.stop = req.stop;
    s.detok.emplace(*codec, o);
  }
  if (auto h = st.ex->open_history(s.id, st.vocab, req.prompt, req.logit_bias); !h)
    return refuse(driver_error_code::bad_request, h.error().message());
  if (!req.prior_output.empty()) {
    st.ex->record_history(s.id, req.prior_output);
    s.tokens.insert(s.tokens.end(), req.prior_output.begin(), req.prior_output.end());
    s.generated = static_cast<std::int64_t>(req.prior_output.size());
    if (s.detok)
      for (auto t : req.prior_output) (void)s.detok->push(t);  // already delivered: only the stop matcher's state matters
  }
  s.req = std::move(req);
  const auto id = s.id;
  st.seqs.emplace(id, std::move(s));
  st.waiting.push_back(id);
  return id;
}

result<step_report, driver_error> driver<serving>::step() { return s_->round(); }

result<void, driver_error> driver<serving>::cancel(seq_id id) {
  auto it = s_->seqs.find(id);
  if (it == s_->seqs.end()) return unexpected(driver_error{driver_error_code::unknown_sequence, "no sequence " + std::to_string(id)});
  it->second.cancel = true;
  return {};
}

result<void, driver_error> driver<serving>::release(seq_id id) {
  auto it = s_->seqs.find(id);
  if (it == s_->seqs.end()) return unexpected(driver_error{driver_error_code::unknown_sequence, "no sequence " + std::to_string(id)});
  s_->finish(it->second, finish_reason::cancelled);
  s_->seqs.erase(it);
  return {};
}

result<generation, driver_error> driver<serving>::generate(seq_request request, const std::function<void(const seq_update&)>& sink) {
  auto id = open(std::move(request));
  if (!id) return unexpected(id.error());
  generation g;
  for (;;) {
    auto r = step();
    if (!r) {
      (void)release(*id);
      return unexpected(r.error());
    }
    for (const auto& u : r->updates) {
      if (u.id != *id) continue;
      g.tokens.insert(g.tokens.end(), u.tokens.begin(), u.tokens.end());
      g.picks.insert(g.picks.end(), u.picks.begin(), u.picks.end());
      g.text += u.text;
      if (sink) sink(u);
      if (u.finished) {
        g.finished = *u.finished;
        (void)release(*id);
        return g;
      }
    }
  }
}

// Rows are grouped by the chunk bucket that holds them and run up to encode_batch rows per step (an
// entry per (rows, tokens) shape, added when first needed unless options.encode prepared the full-chunk
// one); padded rows hold one token so that no query attends to nothing.
result<std::vector<tensor>, driver_error> driver<serving>::encode(std::span<const std::vector<std::int32_t>> rows) {
  auto& st = *s_;
  if (!st.handle->model().schema().offers(families::program::encode))
    return unexpected(driver_error{driver_error_code::program_not_offered, "the model offers no encode program"});
  const auto T_max = st.options.prefill_chunk;
  for (const auto& row : rows) {
    const auto n = static_cast<std::int64_t>(row.size());
    if (n == 0 || n > T_max)
      return unexpected(driver_error{driver_error_code::bad_request, "an encode row holds 1 to " + std::to_string(T_max) + " tokens"});
    for (std::size_t t = 0; t < row.size(); ++t)
      if (row[t] < 0 || row[t] >= st.vocab)
        return unexpected(driver_error{driver_error_code::bad_request, "encode token " + std::to_string(t) + " is outside the vocabulary"});
  }
  constexpr std::int64_t encode_batch = 4;
  std::vector<tensor> out(rows.size());
  std::map<std::int64_t, std::vector<std::size_t>> by_bucket;
  for (std::size_t i = 0; i < rows.size(); ++i)
    by_bucket[*std::lower_bound(st.chunk_buckets.begin(), st.chunk_buckets.end(), static_cast<std::int64_t>(rows[i].size()))].push_back(i);
  for (const auto& [T, members] : by_bucket)
    for (std::size_t first = 0; first < members.size(); first += encode_batch) {
      const auto take = std::min<std::size_t>(encode_batch, members.size() - first);
      const std::int64_t R = take == 1 ? 1 : encode_batch;
      const auto key = st.encode_key(R, T);
      if (!st.entries.contains(key))
        if (auto a = st.add(key); !a) return unexpected(a.error());
      tensor ids(dtype::i32, {R * T}), pos(dtype::i32, {R * T}), mask(dtype::i32, {R * T});
      for (std::int64_t r = 0; r < R; ++r) {
        const std::vector<std::int32_t>* row = static_cast<std::size_t>(r) < take ? &rows[members[first + static_cast<std::size_t>(r)]] : nullptr;
        const auto n = row ? static_cast<std::int64_t>(row->size()) : 1;
        for (std::int64_t t = 0; t < T; ++t) {
          const bool real = t < n;
          ids.as<std::int32_t>()[r * T + t] = real && row ? (*row)[static_cast<std::size_t>(t)] : 0;
          pos.as<std::int32_t>()[r * T + t] = real ? static_cast<std::int32_t>(t) : 0;
          mask.as<std::int32_t>()[r * T + t] = real ? 1 : 0;
        }
      }
      exec::step_inputs in;
      in.slots = {{"token_ids", ids.view()}, {"positions", pos.view()}, {"token_mask", mask.view()}};
      std::optional<others_run> others;
      if (!st.ranks.empty()) others.emplace(st.rank_threads(), key, in);
      auto r = st.ex->step(st.entries.at(key), in);
      if (others)
        if (auto e = others->wait(); e && r) r = unexpected(*e);
      if (!r) return unexpected(driver_error{driver_error_code::step_failed, "encode: " + r.error().message()});
      auto it = r->outputs.find("hidden");
      if (it == r->outputs.end()) return unexpected(driver_error{driver_error_code::step_failed, "encode returned no hidden states"});
      const auto H = it->second.shape().back();
      for (std::size_t k = 0; k < take; ++k) {
        const auto i = members[first + k];
        const auto n = static_cast<std::int64_t>(rows[i].size());
        tensor h(dtype::f32, {n, H});
        const float* src = it->second.as<float>() + static_cast<std::int64_t>(k) * T * H;
        std::copy(src, src + n * H, h.as<float>());
        out[i] = std::move(h);
      }
      ++st.counters.executor_steps;
    }
  return out;
}

result<std::vector<std::vector<float>>, driver_error> driver<serving>::embed(std::span<const std::vector<std::int32_t>> rows,
                                                                           const families::pooling& how) {
  auto hidden = encode(rows);
  if (!hidden) return unexpected(hidden.error());
  std::vector<std::vector<float>> out;
  out.reserve(hidden->size());
  for (const auto& h : *hidden) {
    const auto n = h.shape().dims()[0], H = h.shape().dims()[1];
    const float* x = h.as<float>();
    std::vector<double> acc(static_cast<std::size_t>(H), 0.0);
    if (how.mode == families::pooling_mode::mean) {
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t c = 0; c < H; ++c) acc[static_cast<std::size_t>(c)] += x[t * H + c];
      for (auto& v : acc) v /= static_cast<double>(n);
    } else {
      const std::int64_t t = how.mode == families::pooling_mode::cls ? 0 : n - 1;
      for (std::int64_t c = 0; c < H; ++c) acc[static_cast<std::size_t>(c)] = x[t * H + c];
    }
    double norm = 0;
    for (auto v : acc) norm += v * v;
    norm = std::sqrt(norm);
    std::vector<float> v(acc.size());
    for (std::size_t c = 0; c < acc.size(); ++c) v[c] = static_cast<float>(how.normalize && norm > 0 ? acc[c] / norm : acc[c]);
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace troupe::driver
