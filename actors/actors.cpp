// The actors (CAF 0.17): coordinator, registry, node, executor, driver and client, and the local
// cluster and client facade of actors/cluster.hpp (the processes of a cluster: remote.cpp). Every payload that could cross a process is a
// transport envelope (bytes); actor handles and atoms travel beside it as CAF values. No handler
// blocks: the driver actors, which compute, run detached on their own threads.
#include "actors/cluster.hpp"
#include "actors/actor_internals.hpp"
#include "engine/core/collective.hpp"
#include "engine/driver/cpu_replica.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/cuda/cuda_executor.hpp"
#include "engine/text/chat_template.hpp"
#include "families/model_handle.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {


namespace {

// Positions per sequence when a deployment leaves the capacity to the node (and the model has more).
constexpr std::int64_t default_capacity = 2048;

std::string error_bytes(std::uint64_t job, std::string code, std::string message, transport::retry r) {
  return transport::encode(transport::error{job, std::move(code), std::move(message), r});
}

// ---- job streams (shared by a client actor and its facade) -------------------------------------------

}  // namespace

struct job_stream {
  std::mutex m;
  std::condition_variable cv;
  std::deque<transport::token_chunk> pending;
  job_result acc;
  bool ended = false;
  // For resuming elsewhere when the serving replica is lost (touched by the client actor only).
  std::optional<transport::job_submit> request;
  int resumes = 0;
  std::atomic<std::uint64_t> current{0};  // the id the job runs under now (it changes when resumed)

  std::vector<std::int32_t> delivered() {
    std::lock_guard lock(m);
    return acc.tokens;
  }
  bool is_ended() {
    std::lock_guard lock(m);
    return ended;
  }

  std::optional<std::chrono::steady_clock::time_point> last_chunk;

  void push(transport::token_chunk c) {
    std::lock_guard lock(m);
    if (ended) return;
    const auto now = std::chrono::steady_clock::now();
    if (last_chunk) acc.longest_gap_s = std::max(acc.longest_gap_s, std::chrono::duration<double>(now - *last_chunk).count());
    last_chunk = now;
    acc.tokens.insert(acc.tokens.end(), c.ids.begin(), c.ids.end());
    acc.text += c.text;
    acc.logprobs.insert(acc.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
    acc.usage = c.usage;
    ++acc.chunks;
    if (!c.finish_reason.empty()) {
      acc.finish_reason = c.finish_reason;
      ended = true;
    }
    pending.push_back(std::move(c));
    cv.notify_all();
  }
  void fail(transport::error e) {
    std::lock_guard lock(m);
    if (ended) return;
    acc.finish_reason = "error";
    acc.error = std::move(e);
    ended = true;
    cv.notify_all();
  }
};

namespace {

// Job id -> stream. A stream is created when the coordinator admits the job; a resumed job's new id
// is an alias of the same stream, and the id it replaced is dropped (its late chunks are ignored), so
// the client sees each token once.
struct stream_table {
  std::mutex m;
  std::unordered_map<std::uint64_t, std::shared_ptr<job_stream>> streams;
  std::unordered_set<std::uint64_t> dropped;
  std::shared_ptr<job_stream> create(std::uint64_t id) {
    std::lock_guard lock(m);
    auto& s = streams[id];
    if (!s) {
      s = std::make_shared<job_stream>();
      s->acc.job_id = id;
      s->current = id;
    }
    return s;
  }
  std::shared_ptr<job_stream> find(std::uint64_t id) {
    std::lock_guard lock(m);
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second;
  }
  bool is_dropped(std::uint64_t id) {
    std::lock_guard lock(m);
    return dropped.contains(id);
  }
  void alias(std::uint64_t old_id, std::uint64_t new_id) {
    std::lock_guard lock(m);
    auto it = streams.find(old_id);
    if (it == streams.end()) return;
    streams[new_id] = it->second;
    it->second->current = new_id;
    streams.erase(old_id);
    dropped.insert(old_id);
  }
  // A stream is listed under the id it runs under now (alias moves it).
  void erase(const std::shared_ptr<job_stream>& s) {
    std::lock_guard lock(m);
    if (auto it = streams.find(s->current); it != streams.end() && it->second == s) streams.erase(it);
  }
};

// ---- registry -------------------------------------------------------------------------------------------

std::uintmax_t checkpoint_bytes(const std::filesystem::path& p) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(p, ec)) return std::filesystem::file_size(p, ec);
  std::uintmax_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

// `name` only labels the actor: CAF 0.17 dereferences a null argument tuple when an actor function takes
// no arguments besides self (UBSan reports it), so every actor here takes at least one.
caf::behavior registry_actor(caf::event_based_actor*, std::string /*name*/) {
  return {
      // A checkpoint to (family, bytes), or why not; reads the configuration only.
      [](resolve_atom, const std::string& path) -> caf::message {
        auto cfg = families::read_config(path);
        if (!cfg) return caf::make_message(std::string(), std::string(families::message(cfg.error())));
        auto e = families::registry::builtin().resolve(*cfg);
        if (!e) return caf::make_message(std::string(), e.error().message());
        return caf::make_message(std::string((*e)->family) + " " + std::to_string(checkpoint_bytes(path)) + " bytes", std::string());
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- executor -------------------------------------------------------------------------------------------

// One per device: owns the device's Executor. Drivers in the same process step it directly from
// their own threads; its actor answers for the device (memory, identity).
caf::behavior executor_actor(caf::event_based_actor*, std::shared_ptr<exec::executor> ex, std::string device) {
  return {
      [ex, device](stats_atom) {
        const auto m = ex->memory();
        return caf::make_message(device, static_cast<std::int64_t>(m.weight_bytes + m.state_bytes + m.scratch_bytes));
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- driver ---------------------------------------------------------------------------------------------

struct driver_job {
  std::uint64_t job = 0;
  caf::actor client;
  std::int64_t prompt_tokens = 0;
  std::int64_t generated = 0;
  bool logprobs = false;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  bool expired = false;
};

struct driver_actor_state {
  std::shared_ptr<const families::model_handle> handle;
  std::shared_ptr<exec::executor> ex;
  std::shared_ptr<void> ranks;  // a tensor-parallel replica's group and other ranks' executors
  std::optional<driver::driver<driver::serving>> drv;
  std::optional<text::chat_template> chat;
  std::map<driver::seq_id, driver_job> jobs;
  std::unordered_map<std::uint64_t, driver::seq_id> by_job;
  caf::actor coordinator;
  bool ticking = false;
  std::int64_t max_jobs = 0;
  std::int64_t done = 0, refused = 0;
  double tokens_per_second = 0;
  static inline const char* name = "driver";
};

// The request's prompt as token ids, by its form.
result<std::vector<std::int32_t>, std::string> prompt_ids(driver_actor_state& st, const transport::job_submit& j) {
  if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&j.prompt)) return *ids;
  const auto* codec = st.handle->text();
  if (!codec) return unexpected("a text prompt needs the model's tokenizer: " + st.handle->text_problem());
  std::string text;
  bool add_special = true;
  if (const auto* t = std::get_if<std::string>(&j.prompt)) {
    text = *t;
  } else {
    if (!st.chat) {
      if (codec->chat_template().empty()) return unexpected(std::string("the model ships no chat template"));
      auto t = text::chat_template::parse(codec->chat_template());
      if (!t) return unexpected("chat template: " + t.error().message);
      st.chat.emplace(std::move(*t));
    }
    nlohmann::json msgs = nlohmann::json::array();
    for (const auto& m : std::get<std::vector<transport::chat_message>>(j.prompt)) msgs.push_back({{"role", m.role}, {"content", m.content}});
    text::chat_render_options o;
    o.add_generation_prompt = true;
    o.tools_json = j.tools_json;
    const auto& sp = codec->specials();
    if (sp.bos) o.bos_token = std::string(codec->token_string(*sp.bos).value_or(""));
    if (sp.eos) o.eos_token = std::string(codec->token_string(*sp.eos).value_or(""));
    auto r = st.chat->render(msgs.dump(), o);
    if (!r) return unexpected("chat template: " + r.error().message);
    text = std::move(*r);
    add_special = false;  // the template wrote the special tokens it wants
  }
  auto ids = codec->encode(text, add_special);
  if (!ids) return unexpected(ids.error().message());
  return std::vector<std::int32_t>(ids->begin(), ids->end());
}

result<driver::request_inputs, std::string> request_inputs_of(const transport::job_submit& j) {
  driver::request_inputs out;
  for (const auto& in : j.inputs) {
    const auto t = dtype_from_name(in.dtype);
    if (!t || is_quantized(*t)) return unexpected("input '" + in.name + "': unknown element type '" + in.dtype + "'");
    std::int64_t n = 1;
    for (auto d : in.shape) {
      if (d < 0 || d > (std::int64_t{1} << 31)) return unexpected("input '" + in.name + "': a dimension out of range");
      n *= d;
    }
    if (in.shape.empty() || in.shape.size() > 7) return unexpected("input '" + in.name + "': a shape of 1 to 7 dimensions is needed");
    const auto want = static_cast<std::size_t>(n) * static_cast<std::size_t>(info(*t).block_bytes);
    if (want != in.data.size()) return unexpected("input '" + in.name + "': " + std::to_string(in.data.size()) + " bytes for a shape of " + std::to_string(want));
    tensor v(*t, shape(std::span<const std::int64_t>(in.shape)));
    std::memcpy(v.data(), in.data.data(), in.data.size());
    out[in.name] = driver::request_input_value{std::move(v), in.positions};
  }
  return out;
}

transport::stats driver_stats(const driver_actor_state& st) {
  transport::stats s;
  if (!st.drv) return s;
  const auto c = st.drv->counters();
  s.queued = c.waiting;
  s.running = c.running;
  s.kv_blocks_total = c.pool_blocks;
  s.kv_blocks_used = c.pool_blocks - c.pool_available;
  s.tokens_per_second = st.tokens_per_second;
  s.jobs_done = st.done;
  s.jobs_refused = st.refused;
  s.prompt_tokens = c.prefill_tokens + c.prefix_hit_tokens;
  s.prefix_hit_tokens = c.prefix_hit_tokens;
  return s;
}

caf::behavior driver_actor(caf::stateful_actor<driver_actor_state>* self, std::shared_ptr<const families::model_handle> handle,
                           std::shared_ptr<exec::executor> ex, driver::driver_options options, std::int64_t max_jobs,
                           caf::actor coordinator, std::string model, std::shared_ptr<void> ranks) {
  auto& st = self->state;
  st.handle = handle;
  st.ex = ex;
  st.ranks = std::move(ranks);
  st.coordinator = coordinator;
  st.max_jobs = max_jobs;
  // Prepared here, on the driver's own thread: the entries compile before it serves. The coordinator
  // hears how far it has come (what `troupe status` and `troupe deploy --progress` show).
  options.on_prepare = [self, coordinator, model](std::int64_t done, std::int64_t total) {
    self->send(coordinator, progress_atom::value, model, caf::actor_cast<caf::actor>(self), done, total);
  };
  auto prepared = driver::driver<driver::unprepared>(handle, *ex, options).prepare();
  if (!prepared) {
    self->send(coordinator, register_atom::value, model, caf::actor_cast<caf::actor>(self), prepared.error().second.message());
    self->quit(caf::sec::runtime_error);
    return {};
  }
  st.drv.emplace(std::move(*prepared));
  self->send(coordinator, register_atom::value, model, caf::actor_cast<caf::actor>(self), std::string());

  auto finish_job = [self](std::uint64_t job) { self->send(self->state.coordinator, done_atom::value, job); };
  auto refuse = [self, finish_job](std::uint64_t job, const caf::actor& client, std::string code, std::string why, transport::retry r) {
    ++self->state.refused;
    if (client) self->send(client, chunk_atom::value, error_bytes(job, std::move(code), std::move(why), r));
    finish_job(job);
  };
  auto start_ticking = [self] {
    if (self->state.ticking) return;
    self->state.ticking = true;
    self->send(self, tick_atom::value);
  };

  return {
      [=](submit_atom, const std::string& bytes, const caf::actor& client) {
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m) return refuse(0, client, "bad_message", m.error().message(), m.error().retry());
        auto* j = std::get_if<transport::job_submit>(&*m);
        if (!j) return refuse(0, client, "bad_message", "a driver takes job submissions, not " + std::string(transport::kind(*m)), transport::retry::failed);
        if (static_cast<std::int64_t>(st.jobs.size()) >= st.max_jobs)
          return refuse(j->job_id, client, "overloaded", "the replica holds " + std::to_string(st.jobs.size()) + " jobs", transport::retry::overloaded);
        if (st.by_job.contains(j->job_id)) return refuse(j->job_id, client, "invalid_request", "job id already running", transport::retry::failed);
        auto ids = prompt_ids(st, *j);
        if (!ids) return refuse(j->job_id, client, "invalid_request", ids.error(), transport::retry::failed);
        auto inputs = request_inputs_of(*j);
        if (!inputs) return refuse(j->job_id, client, "invalid_request", inputs.error(), transport::retry::failed);
        driver::seq_request r;
        r.prompt = std::move(*ids);
        const auto& s = j->sampling;
        r.sampling = {s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.top_logprobs, s.seed};
        r.logit_bias = s.logit_bias;
        r.max_tokens = j->max_tokens;
        r.stop_ids = j->stop_ids;
        r.ignore_eos = j->ignore_eos;
        r.stop = j->stop;
        r.inputs = std::move(*inputs);
        r.prior_output = j->prior_output;
        const auto prompt_len = static_cast<std::int64_t>(r.prompt.size());
        auto id = st.drv->open(std::move(r));
        if (!id) return refuse(j->job_id, client, std::string(driver::name(id.error().code)), id.error().message(), transport::retry::failed);
        driver_job dj{j->job_id, client, prompt_len, static_cast<std::int64_t>(j->prior_output.size()), s.top_logprobs > 0, std::nullopt, false};
        if (j->deadline_ms > 0) dj.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(j->deadline_ms);
        spdlog::debug("event=job_admitted job={} seq={} prompt_tokens={} prior_output={}", j->job_id, *id, prompt_len, j->prior_output.size());
        st.jobs.emplace(*id, std::move(dj));
        st.by_job[j->job_id] = *id;
        start_ticking();
      },
      [=](cancel_atom, std::uint64_t job) {
        auto& st = self->state;
        if (auto it = st.by_job.find(job); it != st.by_job.end()) (void)st.drv->cancel(it->second);
      },
      [=](tick_atom) {
        auto& st = self->state;
        const auto now = std::chrono::steady_clock::now();
        for (auto& [seq, j] : st.jobs)
          if (j.deadline && now > *j.deadline && !j.expired) {
            j.expired = true;
            (void)st.drv->cancel(seq);
          }
        auto r = st.drv->step();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
        std::int64_t produced = 0;
        if (r) {
          for (const auto& u : r->updates) {
            auto it = st.jobs.find(u.id);
            if (it == st.jobs.end()) continue;
            auto& j = it->second;
            transport::token_chunk c;
            c.job_id = j.job;
            c.ids = u.tokens;
            c.text = u.text;
            if (j.logprobs)
              for (const auto& p : u.picks) {
                transport::token_logprob lp{p.token, p.logprob, {}};
                for (const auto& t : p.top) lp.top.push_back({t.token, t.logprob});
                c.logprobs.push_back(std::move(lp));
              }
            j.generated += static_cast<std::int64_t>(u.tokens.size());
            produced += static_cast<std::int64_t>(u.tokens.size());
            c.usage = {j.prompt_tokens, j.generated, 0};
            if (u.finished) c.finish_reason = j.expired && *u.finished == driver::finish_reason::cancelled ? "deadline" : std::string(driver::name(*u.finished));
            if (j.client) self->send(j.client, chunk_atom::value, transport::encode(c));
            if (u.finished) {
              spdlog::debug("event=job_finished job={} tokens={} reason={}", j.job, j.generated, c.finish_reason);
              ++st.done;
              finish_job(j.job);
              st.by_job.erase(j.job);
              (void)st.drv->release(u.id);
              st.jobs.erase(it);
            }
          }
        } else {
          for (auto& [seq, j] : st.jobs) {
            if (j.client) self->send(j.client, chunk_atom::value, error_bytes(j.job, "internal", r.error().message(), transport::retry::failed));
            finish_job(j.job);
            (void)st.drv->release(seq);
          }
          st.jobs.clear();
          st.by_job.clear();
        }
        // Recent throughput: smoothed over steps while busy, started afresh by a new burst, 0 when idle.
        if (secs > 0 && produced > 0) {
          const double rate = static_cast<double>(produced) / secs;
          st.tokens_per_second = st.tokens_per_second == 0 ? rate : 0.8 * st.tokens_per_second + 0.2 * rate;
        }
        if (st.drv->idle()) {
          st.ticking = false;
          st.tokens_per_second = 0;
        } else {
          self->send(self, tick_atom::value);
        }
      },
      [=](stats_atom) { return transport::encode(driver_stats(self->state)); },
      // Drained: quits with the normal reason, so the node it is linked to keeps running.
      [=](stop_atom) { self->quit(); },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- node -----------------------------------------------------------------------------------------------

struct node_state {
  std::string node_id = "node-0";
  int executor_threads = 1;
  std::int64_t max_per_replica = 256;
  std::uint64_t device_memory = 0;  // bytes the device offers its executors; 0: no bound
  std::string collective_host = "127.0.0.1";  // where its cross-node collectives listen
  int cuda_device = -1;  // >= 0: its replicas run on this GPU (the CUDA executor); else on the CPU
  std::map<std::string, std::shared_ptr<const families::model_handle>> handles;
  std::vector<caf::actor> spawned;
  std::vector<std::weak_ptr<exec::executor>> executors;
  static inline const char* name = "node";
};

// What one replica of `h` with options `o` will hold: its packed weights (at least the checkpoint's
// tensor bytes) and its KV pool (every slot, every layer, keys and values in f32).
std::uint64_t replica_bytes(const families::model_handle& h, const driver::driver_options& o) {
  const std::uint64_t weights = h.store().total_bytes();
  const auto& cfg = h.model().config();
  const std::uint64_t slots = o.pool_blocks > 0 ? static_cast<std::uint64_t>(o.pool_blocks * o.block_size)
                                                : static_cast<std::uint64_t>(o.max_rows * o.capacity);
  return weights + slots * static_cast<std::uint64_t>(std::max<std::int64_t>(cfg.kv_elems_per_token_per_layer, 0)) *
                       static_cast<std::uint64_t>(cfg.layers) * 4;
}

// A replica's driver options from its deployment: what the deployment leaves 0 follows from the model's
// positions (the capacity, at most default_capacity, in whole KV blocks) and from the capacity (the
// prefill chunk and the token budget).
driver::driver_options replica_options(const transport::load_request& l, const families::model_handle& h) {
  driver::driver_options o;
  if (l.max_rows > 0) o.max_rows = l.max_rows;
  if (l.block_size > 0) o.block_size = l.block_size;
  // Capacity 0: the model's positions, at most default_capacity, in whole KV blocks. The chunk
  // and the budget left 0 follow from it.
  if (l.capacity > 0) {
    o.capacity = l.capacity;
  } else {
    const auto positions = h.model().config().max_positions;
    o.capacity = positions > 0 ? std::min(default_capacity, positions) : default_capacity;
    o.capacity = std::max(o.block_size, o.capacity / o.block_size * o.block_size);
  }
  o.pool_blocks = l.pool_blocks;
  o.prefill_chunk = l.prefill_chunk > 0 ? l.prefill_chunk : std::min<std::int64_t>(256, o.capacity);
  o.token_budget = l.token_budget > 0 ? l.token_budget : o.prefill_chunk + o.max_rows;
  o.prefix_cache = !l.no_prefix_cache;
  o.preempt = !l.no_preempt;
  return o;
}

// The deployment in `bytes`, or why not.
result<transport::deploy, std::string> deployment_of(const std::string& bytes) {
  auto m = transport::decode(bytes);
  if (!m) return unexpected(m.error().message());
  auto* d = std::get_if<transport::deploy>(&*m);
  if (!d) return unexpected(std::string("a node takes deployments, not ") + std::string(transport::kind(*m)));
  return *d;
}

// The node's handle of a deployment's model, loaded once.
result<std::shared_ptr<const families::model_handle>, std::string> handle_for(node_state& st, const transport::deploy& d) {
  auto& h = st.handles[d.model];
  if (!h) {
    auto loaded = families::model_handle::load(d.load.model, families::registry::builtin());
    if (!loaded) {
      st.handles.erase(d.model);
      return unexpected(families::message(loaded.error()));
    }
    h = *loaded;
  }
  return h;
}

// A replica's actors on the node: the executor actor over the driver's executor and the driver (its own
// thread), both linked to the node; `keep` holds whatever the driver's other ranks point into.
void spawn_replica(caf::stateful_actor<node_state>* self, std::shared_ptr<const families::model_handle> part,
                   std::shared_ptr<exec::executor> ex, const driver::driver_options& o, const caf::actor& coordinator,
                   const std::string& model, std::shared_ptr<void> keep) {
  auto& st = self->state;
  const std::string device = st.cuda_device >= 0 ? "cuda:" + std::to_string(st.cuda_device) : "cpu:" + std::to_string(st.spawned.size());
  auto dev = self->spawn(executor_actor, ex, device);
  auto drv = self->spawn<caf::detached>(driver_actor, std::move(part), ex, o, st.max_per_replica, coordinator,
                                        model, std::move(keep));
  self->link_to(dev);
  self->link_to(drv);
  st.spawned.push_back(dev);
  st.spawned.push_back(drv);
  st.executors.push_back(ex);
}

caf::behavior node_actor(caf::stateful_actor<node_state>* self, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                         std::string collective_host, int cuda_device) {
  self->state.collective_host = std::move(collective_host);
  self->state.cuda_device = cuda_device;
  self->state.executor_threads = executor_threads;
  self->state.device_memory = device_memory;
  self->state.max_per_replica = max_per_replica;
  return {
      // Spawns the replicas of a deployment; each registers itself with `coordinator` once prepared.
      // Replies with the number spawned, or 0 and why not.
      // A stage before the last of a cross-node replica: a rank actor per rank over its part, for the
      // last stage's driver (ranks.cpp). Replies with the actors, or none and why not.
      [=](rank_atom, const std::string& bytes, const caf::actor& coordinator) -> caf::message {
        auto& st = self->state;
        const std::vector<caf::actor> none;
        auto d = deployment_of(bytes);
        if (!d) return caf::make_message(none, d.error());
        auto h = handle_for(st, *d);
        if (!h) return caf::make_message(none, h.error());
        auto r = spawn_stage(self, *h, d->load, coordinator, st.executor_threads, st.collective_host);
        if (!r) return caf::make_message(none, r.error());
        for (const auto& a : *r) {
          self->link_to(a);
          st.spawned.push_back(a);
        }
        return caf::make_message(*r, std::string());
      },
      // The last stage of a cross-node replica: the driver, over the rank actors of the other stages.
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator, const std::vector<caf::actor>& ranks) -> caf::message {
        auto& st = self->state;
        auto d = deployment_of(bytes);
        if (!d) return caf::make_message(std::int32_t{0}, d.error());
        auto h = handle_for(st, *d);
        if (!h) return caf::make_message(std::int32_t{0}, h.error());
        auto head = make_cross_node_head(self->system(), *h, d->load, coordinator, ranks, st.executor_threads, st.collective_host);
        if (!head) return caf::make_message(std::int32_t{0}, head.error());
        driver::driver_options o = replica_options(d->load, **h);
        o.other_ranks = head->other_ranks;
        o.connect = head->connect;
        spawn_replica(self, head->part, head->executor, o, coordinator, d->model, head->keep);
        return caf::make_message(std::int32_t{1}, std::string());
      },
      [=](deploy_atom, const std::string& bytes, const caf::actor& coordinator) -> caf::message {
        auto& st = self->state;
        auto d = deployment_of(bytes);
        if (!d) return caf::make_message(std::int32_t{0}, d.error());
        auto handle = handle_for(st, *d);
        if (!handle) return caf::make_message(std::int32_t{0}, handle.error());
        const auto& h = *handle;
        driver::driver_options o = replica_options(d->load, *h);
        if (st.device_memory > 0) {
          // The device's memory decides how many replicas share it: what the running executors hold
          // (their own reports) plus what the new ones will.
          std::uint64_t used = 0;
          std::erase_if(st.executors, [](const auto& w) { return w.expired(); });
          for (const auto& w : st.executors)
            if (auto e = w.lock()) {
              const auto m = e->memory();
              used += m.weight_bytes + m.state_bytes + m.scratch_bytes;
            }
          const auto need = replica_bytes(*h, o) * static_cast<std::uint64_t>(d->replicas);
          if (used + need > st.device_memory)
            return caf::make_message(std::int32_t{0}, "device memory: " + std::to_string(used) + " bytes in use + " + std::to_string(need) +
                                                          " needed > " + std::to_string(st.device_memory));
        }
        // A tensor x pipeline parallel replica: its ranks' parts. A split the model refuses fails the
        // first replica, before anything is spawned.
        const int tp = std::max(1, d->load.tensor_parallel), pp = std::max(1, d->load.pipeline_parallel);
        if (st.cuda_device >= 0) {
          // One CUDA executor per replica on the node's GPU (a sharded replica runs on CPU nodes).
          if (tp > 1 || pp > 1)
            return caf::make_message(std::int32_t{0}, std::string("a GPU node serves whole replicas (tensor and pipeline parallel run on cpu nodes)"));
          for (std::int32_t r = 0; r < d->replicas; ++r) {
            exec::cuda::cuda_options co;
            co.device = st.cuda_device;
            auto made = exec::cuda::make_executor(co);
            if (!made) return caf::make_message(r, made.error().message());
            spawn_replica(self, h, std::shared_ptr<exec::executor>(std::move(*made)), o, coordinator, d->model, nullptr);
          }
          return caf::make_message(d->replicas, std::string());
        }
        for (std::int32_t r = 0; r < d->replicas; ++r) {
          auto made = driver::cpu_replica::make(h, tp, pp, st.executor_threads);
          if (!made) return caf::make_message(std::int32_t{0}, made.error());
          std::shared_ptr<driver::cpu_replica> replica(std::move(*made));
          driver::driver_options ro = o;
          replica->attach(ro);
          spawn_replica(self, replica->head(), std::shared_ptr<exec::executor>(replica, &replica->head_executor()), ro, coordinator,
                        d->model, replica);
        }
        return caf::make_message(d->replicas, std::string());
      },
      [=](stats_atom) {
        transport::node_hello h;
        h.node_id = self->state.node_id;
        h.host = "127.0.0.1";
        if (self->state.cuda_device >= 0)
          h.devices.push_back({"cuda:" + std::to_string(self->state.cuda_device), "cuda", self->state.device_memory});
        else
          h.devices.push_back({"cpu:0", "cpu", self->state.device_memory});
        return transport::encode(h);
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- coordinator ----------------------------------------------------------------------------------------

struct replica_slot {
  caf::actor driver;
  std::string model;
  std::int64_t outstanding = 0;
  bool draining = false;  // takes no new job; stops once its last job ends
};

struct pending_deploy {
  std::string model;
  std::int32_t expected = 0;
  std::int32_t ready = 0;
  caf::response_promise rp;
};

struct node_slot {
  std::string id;
  caf::actor actor;
  std::int32_t max_replicas = 0;  // executors its device may host; 0: no bound
  std::uint64_t device_memory = 0;  // what its device offers; 0: not declared
};

struct coordinator_state;
std::optional<std::size_t> next_node_with_room(coordinator_state& st, std::map<std::size_t, std::int32_t>& planned);

// A replica still preparing: how many of its prepare steps are done.
struct preparing_slot {
  caf::actor driver;
  std::string model;
  std::int64_t done = 0, total = 0;
};

struct coordinator_state {
  caf::actor registry;
  std::vector<preparing_slot> preparing;
  std::vector<node_slot> nodes;
  std::size_t next_node = 0;
  std::vector<replica_slot> replicas;
  struct job_route {
    std::size_t replica;
    caf::actor client;
  };
  std::unordered_map<std::uint64_t, job_route> jobs;
  std::uint64_t next_job = 1;
  std::int64_t max_outstanding = 1024, max_per_replica = 256;
  std::int64_t refused = 0;
  std::optional<pending_deploy> deploying;
  std::map<std::string, transport::deploy> deployments;  // by model name: how to start one more replica
  std::map<std::string, std::string> rendezvous;  // the groups' rendezvous keys (kv_set_atom, kv_get_atom)
  std::uint64_t next_group = 0;                    // cross-node replicas: their rendezvous prefixes
  std::size_t rendezvous_bytes = 0;
  static inline const char* name = "coordinator";
};

// Round robin over the nodes, skipping those whose device already hosts max_replicas executors
// (counting the ones this plan adds).
std::optional<std::size_t> next_node_with_room(coordinator_state& st, std::map<std::size_t, std::int32_t>& planned) {
  for (std::size_t tries = 0; tries < st.nodes.size(); ++tries) {
    const std::size_t i = st.next_node++ % st.nodes.size();
    const auto& n = st.nodes[i];
    std::int32_t hosted = planned[i];
    for (const auto& r : st.replicas)
      if (r.driver && r.driver.node() == n.actor.node()) ++hosted;
    if (n.max_replicas == 0 || hosted < n.max_replicas) {
      ++planned[i];
      return i;
    }
  }
  return std::nullopt;
}

// Replicas whose pipeline stages each take a node of their own (ranks.cpp): for each, the nodes of the
// stages before the last spawn rank actors, then the last stage's node spawns the driver over them. The
// stages' pipe meets through this coordinator's rendezvous store under a prefix fresh per replica.
template <class Fail>
void place_across_nodes(caf::stateful_actor<coordinator_state>* self, transport::deploy d, std::int32_t count, Fail fail) {
  auto& st = self->state;
  const int pp = d.load.pipeline_parallel;
  const int tp = std::max(1, d.load.tensor_parallel);
  if (static_cast<int>(st.nodes.size()) < pp)
    return fail("a pipeline of " + std::to_string(pp) + " stages across nodes needs " + std::to_string(pp) + " nodes, " +
                std::to_string(st.nodes.size()) + " joined");
  for (std::int32_t r = 0; r < count; ++r) {
    const std::size_t first = st.next_node++ % st.nodes.size();
    std::vector<caf::actor> stage_nodes;
    for (int s = 0; s < pp; ++s) stage_nodes.push_back(st.nodes[(first + static_cast<std::size_t>(s)) % st.nodes.size()].actor);
    transport::deploy rd = d;
    rd.load.group = "replica-" + std::to_string(st.next_group++);
    struct gathering {
      std::vector<caf::actor> ranks;
      int arrived = 0;
      bool failed = false;
    };
    auto g = std::make_shared<gathering>();
    g->ranks.resize(static_cast<std::size_t>((pp - 1) * tp));
    auto head = [=] {
      transport::deploy hd = rd;
      hd.load.world_rank = pp - 1;
      self->request(stage_nodes.back(), request_timeout, deploy_atom::value, transport::encode(hd), caf::actor_cast<caf::actor>(self), g->ranks)
          .then(
              [=](std::int32_t n, const std::string& why) {
                if (n == 0) fail(why);
              },
              [=](caf::error& e) { fail(self->system().render(e)); });
    };
    for (int s = 0; s + 1 < pp; ++s) {
      transport::deploy sd = rd;
      sd.load.world_rank = s;
      self->request(stage_nodes[static_cast<std::size_t>(s)], request_timeout, rank_atom::value, transport::encode(sd), caf::actor_cast<caf::actor>(self))
          .then(
              [=](const std::vector<caf::actor>& ranks, const std::string& why) {
                if (g->failed) return;
                if (static_cast<int>(ranks.size()) != tp) {
                  g->failed = true;
                  return fail("stage " + std::to_string(s) + ": " + (why.empty() ? std::string("a rank count other than the split's") : why));
                }
                for (int t = 0; t < tp; ++t) g->ranks[static_cast<std::size_t>(s * tp + t)] = ranks[static_cast<std::size_t>(t)];
                if (++g->arrived == pp - 1) head();
              },
              [=](caf::error& e) {
                if (g->failed) return;
                g->failed = true;
                fail("stage " + std::to_string(s) + ": " + self->system().render(e));
              });
    }
  }
}

// Asks nodes with room to start `count` replicas of `d`, one per request, round robin; the pending
// deployment completes when they register (register_atom). A refusal fails it, prefixed with `label`.
void place_replicas(caf::stateful_actor<coordinator_state>* self, transport::deploy d, std::int32_t count, const std::string& label) {
  auto fail = [self, label](const std::string& why) {
    if (!self->state.deploying) return;
    self->state.deploying->rp.deliver(label + ": " + why, std::string());
    self->state.deploying.reset();
  };
  d.replicas = 1;
  if (d.load.across_nodes && d.load.pipeline_parallel > 1) return place_across_nodes(self, d, count, fail);
  const auto bytes = transport::encode(d);
  std::map<std::size_t, std::int32_t> planned;
  for (std::int32_t r = 0; r < count; ++r) {
    const auto slot = next_node_with_room(self->state, planned);
    if (!slot)
      return fail("no node has room for replica " + std::to_string(r + 1) + " of " + std::to_string(count) +
                  " (each node's --max-replicas and --device-memory)");
    self->request(self->state.nodes[*slot].actor, request_timeout, deploy_atom::value, bytes, caf::actor_cast<caf::actor>(self))
        .then(
            [=](std::int32_t n, const std::string& why) {
              if (n == 0) fail(why);
            },
            [=](caf::error& e) { fail(self->system().render(e)); });
  }
}

std::uint64_t affinity_key(const transport::prompt& p) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&p)) {
    for (std::size_t i = 0; i < std::min<std::size_t>(ids->size(), 32); ++i) mix(static_cast<std::uint32_t>((*ids)[i]));
  } else if (const auto* t = std::get_if<std::string>(&p)) {
    for (std::size_t i = 0; i < std::min<std::size_t>(t->size(), 128); ++i) mix(static_cast<unsigned char>((*t)[i]));
  } else {
    for (const auto& m : std::get<std::vector<transport::chat_message>>(p)) {
      for (char c : m.role) mix(static_cast<unsigned char>(c));
      for (std::size_t i = 0; i < std::min<std::size_t>(m.content.size(), 128); ++i) mix(static_cast<unsigned char>(m.content[i]));
      break;  // the system prompt is what requests share
    }
  }
  return h;
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self, caf::actor registry, caf::actor node, std::int64_t max_outstanding,
                                std::int64_t max_per_replica) {
  auto& st = self->state;
  st.registry = registry;
  if (node) st.nodes.push_back({"node-0", node});
  st.max_outstanding = max_outstanding;
  st.max_per_replica = max_per_replica;
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    std::erase_if(st.nodes, [&](const node_slot& n) { return n.actor.address() == dm.source; });
    std::erase_if(st.preparing, [&](const preparing_slot& p) { return p.driver.address() == dm.source; });
    for (std::size_t i = 0; i < st.replicas.size(); ++i) {
      if (st.replicas[i].driver.address() != dm.source) continue;
      // Its jobs end with a disconnected error; the replica leaves the rotation.
      spdlog::info("event=replica_down replica={} draining={} jobs_in_flight={}", i, st.replicas[i].draining, st.replicas[i].outstanding);
      for (auto it = st.jobs.begin(); it != st.jobs.end();) {
        if (it->second.replica == i) {
          if (it->second.client)
            self->send(it->second.client, chunk_atom::value, error_bytes(it->first, "disconnected", "the replica serving this job went away", transport::retry::disconnected));
          it = st.jobs.erase(it);
        } else {
          ++it;
        }
      }
      st.replicas[i].driver = caf::actor{};
    }
  });
  return {
      // Resolves the model through the registry, has the node spawn the replicas and answers once all
      // registered: ("", model name) on success, (error, "").
      [=](deploy_atom, const std::string& bytes) -> caf::response_promise {
        auto rp = self->make_response_promise();
        auto m = transport::decode(bytes);
        if (!m || !std::holds_alternative<transport::deploy>(*m)) {
          rp.deliver(std::string(m ? "not a deployment" : m.error().message()), std::string());
          return rp;
        }
        const auto d = std::get<transport::deploy>(*m);
        self->state.deployments[d.model] = d;
        if (self->state.deploying) {
          rp.deliver(std::string("a deployment is in progress"), std::string());
          return rp;
        }
        self->state.deploying = pending_deploy{d.model, d.replicas, 0, rp};
        self->request(self->state.registry, request_timeout, resolve_atom::value, d.load.model)
            .then(
                [=](const std::string& summary, const std::string& err) {
                  if (summary.empty()) {
                    self->state.deploying->rp.deliver("unknown_model: " + err, std::string());
                    self->state.deploying.reset();
                    return;
                  }
                  auto& st = self->state;
                  if (st.nodes.empty()) {
                    st.deploying->rp.deliver(std::string("no node has joined"), std::string());
                    st.deploying.reset();
                    return;
                  }
                  place_replicas(self, d, d.replicas, "deploy");
                },
                [=](caf::error& e) {
                  if (!self->state.deploying) return;
                  self->state.deploying->rp.deliver("registry: " + self->system().render(e), std::string());
                  self->state.deploying.reset();
                });
        return rp;
      },
      [=](progress_atom, const std::string& model, const caf::actor& driver, std::int64_t done, std::int64_t total) {
        auto& st = self->state;
        for (auto& p : st.preparing)
          if (p.driver == driver) {
            p.done = done, p.total = total;
            return;
          }
        self->monitor(driver);  // one that dies preparing leaves the list
        st.preparing.push_back({driver, model, done, total});
      },
      [=](register_atom, const std::string& model, const caf::actor& driver, const std::string& err) {
        auto& st = self->state;
        std::erase_if(st.preparing, [&](const preparing_slot& p) { return p.driver == driver; });
        if (!err.empty()) {
          if (st.deploying) {
            st.deploying->rp.deliver("replica refused to prepare: " + err, std::string());
            st.deploying.reset();
          }
          return;
        }
        self->monitor(driver);
        st.replicas.push_back({driver, model, 0});
        if (st.deploying && st.deploying->model == model && ++st.deploying->ready == st.deploying->expected) {
          st.deploying->rp.deliver(std::string(), model);
          st.deploying.reset();
        }
      },
      // Admission and routing. Replies (job id, "") or (0, error envelope bytes).
      [=](submit_atom, const std::string& bytes, const caf::actor& client) -> caf::message {
        auto& st = self->state;
        auto refuse = [&](std::string code, std::string why, transport::retry r) {
          ++st.refused;
          return caf::make_message(std::uint64_t{0}, error_bytes(0, std::move(code), std::move(why), r));
        };
        auto m = transport::decode(bytes);
        if (!m) return refuse("bad_message", m.error().message(), m.error().retry());
        auto* j = std::get_if<transport::job_submit>(&*m);
        if (!j) return refuse("bad_message", "the coordinator takes job submissions here, not " + std::string(transport::kind(*m)), transport::retry::failed);
        if (static_cast<std::int64_t>(st.jobs.size()) >= st.max_outstanding)
          return refuse("overloaded", "the cluster holds " + std::to_string(st.jobs.size()) + " jobs, its bound", transport::retry::overloaded);
        // Prefix affinity: the replica a prompt's opening hashes to, unless it is clearly busier than
        // the least loaded one; otherwise the least loaded.
        std::vector<std::size_t> live;
        for (std::size_t i = 0; i < st.replicas.size(); ++i)
          if (st.replicas[i].driver && !st.replicas[i].draining && (j->model.empty() || j->model == st.replicas[i].model)) live.push_back(i);
        if (live.empty()) return refuse("unknown_model", "no replica serves model '" + j->model + "'", transport::retry::failed);
        std::size_t best = live.front();
        for (auto i : live)
          if (st.replicas[i].outstanding < st.replicas[best].outstanding) best = i;
        const std::size_t preferred = live[affinity_key(j->prompt) % live.size()];
        if (st.replicas[preferred].outstanding <= st.replicas[best].outstanding + 2) best = preferred;
        if (st.replicas[best].outstanding >= st.max_per_replica)
          return refuse("overloaded", "every replica holds its bound of jobs", transport::retry::overloaded);
        j->job_id = st.next_job++;
        spdlog::debug("event=job_routed job={} replica={} outstanding={}", j->job_id, best, st.replicas[best].outstanding + 1);
        ++st.replicas[best].outstanding;
        st.jobs[j->job_id] = {best, client};
        self->send(st.replicas[best].driver, submit_atom::value, transport::encode(*j), client);
        return caf::make_message(j->job_id, std::string());
      },
      [=](cancel_atom, const std::string& bytes) {
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m || !std::holds_alternative<transport::cancel_job>(*m)) return;
        const auto id = std::get<transport::cancel_job>(*m).job_id;
        if (auto it = st.jobs.find(id); it != st.jobs.end() && st.replicas[it->second.replica].driver)
          self->send(st.replicas[it->second.replica].driver, cancel_atom::value, id);
      },
      [=](done_atom, std::uint64_t job) {
        auto& st = self->state;
        if (auto it = st.jobs.find(job); it != st.jobs.end()) {
          auto& r = st.replicas[it->second.replica];
          if (r.outstanding > 0) --r.outstanding;
          st.jobs.erase(it);
          if (r.draining && r.outstanding == 0 && r.driver) self->send(r.driver, stop_atom::value);
        }
      },
      // Scaling: more replicas are placed round robin on the nodes and prepared before they take
      // traffic (the answer comes once they are registered); fewer drain the newest replicas (no new
      // jobs; each stops when its last job ends). Replies (error, model).
      [=](scale_atom, const std::string& bytes) -> caf::response_promise {
        auto rp = self->make_response_promise();
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m || !std::holds_alternative<transport::scale>(*m)) {
          rp.deliver(std::string(m ? "not a scale command" : m.error().message()), std::string());
          return rp;
        }
        const auto sc = std::get<transport::scale>(*m);
        auto dep = st.deployments.find(sc.model);
        if (dep == st.deployments.end()) {
          rp.deliver("unknown_model: nothing named '" + sc.model + "' is deployed", std::string());
          return rp;
        }
        std::vector<std::size_t> live;
        for (std::size_t i = 0; i < st.replicas.size(); ++i)
          if (st.replicas[i].driver && !st.replicas[i].draining && st.replicas[i].model == sc.model) live.push_back(i);
        const auto have = static_cast<std::int32_t>(live.size());
        if (sc.replicas < have) {
          for (std::int32_t k = 0; k < have - sc.replicas; ++k) {
            auto& r = st.replicas[live[live.size() - 1 - static_cast<std::size_t>(k)]];
            r.draining = true;
            if (r.outstanding == 0) self->send(r.driver, stop_atom::value);
          }
          rp.deliver(std::string(), sc.model);
          return rp;
        }
        if (sc.replicas == have) {
          rp.deliver(std::string(), sc.model);
          return rp;
        }
        if (st.deploying || st.nodes.empty()) {
          rp.deliver(std::string(st.nodes.empty() ? "no node has joined" : "a deployment is in progress"), std::string());
          return rp;
        }
        st.deploying = pending_deploy{sc.model, sc.replicas - have, 0, rp};
        place_replicas(self, dep->second, sc.replicas - have, "scale");
        return rp;
      },
      // A node leaving (SIGTERM): its replicas take no new job and stop after their last one. Answers
      // how many of its replicas still run; the node asks again until none does.
      [=](drain_atom, const caf::actor& node) {
        std::int32_t left = 0;
        for (auto& r : self->state.replicas) {
          if (!r.driver || r.driver.node() != node.node()) continue;
          if (!r.draining) {
            r.draining = true;
            if (r.outstanding == 0) self->send(r.driver, stop_atom::value);
          }
          ++left;
        }
        return left;
      },
      // A node's bound on the executors its device hosts and the memory the device offers (sent right
      // after it joins).
      [=](capacity_atom, const caf::actor& node, std::int32_t max_replicas, std::uint64_t device_memory) {
        for (auto& n : self->state.nodes)
          if (n.actor == node) n.max_replicas = max_replicas, n.device_memory = device_memory;
      },
      // A node that proved it holds the cluster's secret (the gatekeeper checked it).
      [=](node_atom, const std::string& id, const caf::actor& node) {
        self->monitor(node);
        self->state.nodes.push_back({id, node});
      },
      // The rendezvous of collective groups (Gloo's addresses, NCCL's unique id): set once, read by
      // everyone. Replies with why not, or an empty string.
      [=](kv_set_atom, const std::string& key, const std::string& value) -> std::string {
        auto& st = self->state;
        if (key.empty() || key.size() > rendezvous_max_key) return "a rendezvous key holds 1 to " + std::to_string(rendezvous_max_key) + " bytes";
        if (value.size() > rendezvous_max_value)
          return "a rendezvous value holds at most " + std::to_string(rendezvous_max_value) + " bytes, got " + std::to_string(value.size());
        if (st.rendezvous.contains(key)) return "rendezvous key '" + key + "' is set already (use a fresh prefix per group)";
        if (st.rendezvous_bytes + key.size() + value.size() > rendezvous_max_bytes)
          return "the rendezvous store is full (" + std::to_string(rendezvous_max_bytes) + " bytes)";
        st.rendezvous_bytes += key.size() + value.size();
        st.rendezvous.emplace(key, value);
        return {};
      },
      [=](kv_get_atom, const std::string& key) {
        const auto& st = self->state;
        const auto it = st.rendezvous.find(key);
        return it == st.rendezvous.end() ? caf::make_message(false, std::string()) : caf::make_message(true, it->second);
      },
      [=](status_atom) {
        const auto& st = self->state;
        nlohmann::json j;
        j["nodes"] = nlohmann::json::array();
        for (const auto& n : st.nodes) j["nodes"].push_back(n.id);
        // Each node's device as the placement planner takes it (troupe deploy --plan); memory 0: the
        // node declared none (--device-memory).
        j["devices"] = nlohmann::json::array();
        for (const auto& n : st.nodes)
          j["devices"].push_back({{"node", n.id}, {"name", "cpu:0"}, {"kind", "cpu"}, {"memory_bytes", n.device_memory}});
        j["replicas"] = nlohmann::json::array();
        for (const auto& r : st.replicas)
          if (r.driver) {
            std::string node_name;
            for (const auto& n : st.nodes)
              if (n.actor.node() == r.driver.node()) node_name = n.id;
            j["replicas"].push_back({{"model", r.model}, {"outstanding", r.outstanding}, {"draining", r.draining},
                                     {"node", to_string(r.driver.node())}, {"node_name", node_name}});
          }
        j["preparing"] = nlohmann::json::array();
        for (const auto& p : st.preparing) {
          std::string node_name;
          for (const auto& n : st.nodes)
            if (n.actor.node() == p.driver.node()) node_name = n.id;
          j["preparing"].push_back({{"model", p.model}, {"node", to_string(p.driver.node())}, {"node_name", node_name},
                                    {"done", p.done}, {"total", p.total}});
        }
        j["jobs"] = st.jobs.size();
        j["refused"] = st.refused;
        return j.dump();
      },
      [=](replicas_atom) {
        std::vector<caf::actor> v;
        for (const auto& r : self->state.replicas)
          if (r.driver) v.push_back(r.driver);
        return v;
      },
      [=](stats_atom) {
        transport::stats s;
        s.running = static_cast<std::int64_t>(self->state.jobs.size());
        s.jobs_refused = self->state.refused;
        return transport::encode(s);
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- client ---------------------------------------------------------------------------------------------

struct client_actor_state {
  caf::actor coordinator;
  std::shared_ptr<stream_table> streams;
  // Chunks that arrived before their job's admission reached this actor (drivers answer the client
  // directly, so they may overtake the coordinator's reply); bounded.
  std::unordered_map<std::uint64_t, std::vector<std::string>> early;
  std::size_t early_count = 0;
  std::int64_t dropped = 0;  // chunks that did not decode, or belonged to nobody
  static inline const char* name = "client";
};

constexpr std::size_t max_early_chunks = 1 << 16;
constexpr int max_resumes = 3;

void deliver(caf::stateful_actor<client_actor_state>* self, const std::string& bytes);

// A job whose replica was lost is submitted again with the output already delivered, so it resumes
// where it stopped on another replica.
void resume(caf::stateful_actor<client_actor_state>* self, std::uint64_t old_id, std::shared_ptr<job_stream> stream, transport::error why) {
  if (!stream->request || stream->resumes >= max_resumes || stream->is_ended()) return stream->fail(std::move(why));
  auto req = *stream->request;
  req.prior_output = stream->delivered();
  if (static_cast<std::int64_t>(req.prior_output.size()) >= req.max_tokens) {
    transport::token_chunk done;
    done.job_id = old_id;
    done.finish_reason = "length";
    return stream->push(std::move(done));
  }
  ++stream->resumes;
  req.job_id = 0;
  self->request(self->state.coordinator, request_timeout, submit_atom::value, transport::encode(req), caf::actor_cast<caf::actor>(self))
      .then(
          [=](std::uint64_t id, const std::string& err) {
            if (id == 0) {
              auto m = transport::decode(err);
              stream->fail(m && std::holds_alternative<transport::error>(*m) ? std::get<transport::error>(*m) : why);
              return;
            }
            self->state.streams->alias(old_id, id);
            if (auto it = self->state.early.find(id); it != self->state.early.end()) {
              auto chunks = std::move(it->second);
              self->state.early_count -= chunks.size();
              self->state.early.erase(it);
              for (const auto& c : chunks) deliver(self, c);
            }
          },
          [=](caf::error&) { stream->fail(why); });
}

void deliver(caf::stateful_actor<client_actor_state>* self, const std::string& bytes) {
  auto& st = self->state;
  auto m = transport::decode(bytes);
  if (!m) {
    ++st.dropped;
    return;
  }
  std::uint64_t id = 0;
  if (auto* c = std::get_if<transport::token_chunk>(&*m)) id = c->job_id;
  else if (auto* e = std::get_if<transport::error>(&*m)) id = e->job_id;
  else {
    ++st.dropped;
    return;
  }
  if (id == 0 || st.streams->is_dropped(id)) {
    ++st.dropped;
    return;
  }
  auto stream = st.streams->find(id);
  if (!stream) {
    if (st.early_count >= max_early_chunks) {
      ++st.dropped;
      return;
    }
    st.early[id].push_back(bytes);
    ++st.early_count;
    return;
  }
  if (auto* c = std::get_if<transport::token_chunk>(&*m)) {
    stream->push(std::move(*c));
  } else {
    auto& e = std::get<transport::error>(*m);
    if (e.retry == transport::retry::disconnected) return resume(self, id, stream, std::move(e));
    stream->fail(std::move(e));
  }
}

caf::behavior client_actor(caf::stateful_actor<client_actor_state>* self, caf::actor coordinator, std::shared_ptr<stream_table> streams) {
  self->state.coordinator = coordinator;
  self->state.streams = streams;
  return {
      // From the facade: forwards to the coordinator; replies (job id, "") or (0, error bytes).
      [=](submit_atom, const std::string& bytes) -> caf::response_promise {
        auto rp = self->make_response_promise();
        self->request(self->state.coordinator, request_timeout, submit_atom::value, bytes, caf::actor_cast<caf::actor>(self))
            .then(
                [=](std::uint64_t id, const std::string& err) mutable {
                  if (id != 0) {
                    auto stream = self->state.streams->create(id);
                    if (auto m = transport::decode(bytes); m && std::holds_alternative<transport::job_submit>(*m))
                      stream->request = std::get<transport::job_submit>(*m);
                    if (auto it = self->state.early.find(id); it != self->state.early.end()) {
                      auto chunks = std::move(it->second);
                      self->state.early_count -= chunks.size();
                      self->state.early.erase(it);
                      for (const auto& c : chunks) deliver(self, c);
                    }
                  }
                  rp.deliver(id, err);
                },
                [=](caf::error& e) mutable {
                  rp.deliver(std::uint64_t{0}, error_bytes(0, "disconnected", self->system().render(e), transport::retry::disconnected));
                });
        return rp;
      },
      [=](chunk_atom, const std::string& bytes) { deliver(self, bytes); },
      [=](cancel_atom, std::uint64_t job) { self->send(self->state.coordinator, cancel_atom::value, transport::encode(transport::cancel_job{job})); },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

// ---- facade ---------------------------------------------------------------------------------------------

struct client_state {
  caf::actor_system* sys = nullptr;
  caf::actor actor;
  std::shared_ptr<stream_table> streams = std::make_shared<stream_table>();
  ~client_state() {
    if (actor) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

std::unique_ptr<client> client_set::open(caf::actor_system& sys, const caf::actor& coordinator) {
  auto cs = std::make_shared<client_state>();
  cs->sys = &sys;
  cs->actor = sys.spawn(client_actor, coordinator, cs->streams);
  clients_.push_back(cs);
  return std::unique_ptr<client>(new client(cs));
}

void client_set::close_all() {
  for (auto& w : clients_)
    if (auto c = w.lock()) {
      caf::anon_send_exit(c->actor, caf::exit_reason::user_shutdown);
      c->actor = caf::actor{};
    }
}

caf::actor client_set::newest() const {
  auto c = clients_.empty() ? nullptr : clients_.back().lock();
  return c ? c->actor : caf::actor{};
}

caf::actor spawn_registry(caf::actor_system& sys) { return sys.spawn(registry_actor, std::string("registry")); }

caf::actor spawn_coordinator(caf::actor_system& sys, const caf::actor& registry, const caf::actor& node, std::int64_t max_outstanding,
                             std::int64_t max_per_replica) {
  return sys.spawn(coordinator_actor, registry, node, max_outstanding, max_per_replica);
}

caf::actor spawn_node(caf::actor_system& sys, int executor_threads, std::int64_t max_per_replica, std::uint64_t device_memory,
                      std::string collective_host, int cuda_device) {
  return sys.spawn(node_actor, executor_threads, max_per_replica, device_memory, std::move(collective_host), cuda_device);
}

client::~client() = default;

result<job, transport::error> client::submit(const transport::job_submit& request) {
  caf::scoped_actor self{*s_->sys};
  std::uint64_t id = 0;
  std::string err;
  self->request(s_->actor, request_timeout, submit_atom::value, transport::encode(request))
      .receive([&](std::uint64_t i, const std::string& e) { id = i, err = e; },
               [&](caf::error& e) { err = error_bytes(0, "disconnected", s_->sys->render(e), transport::retry::disconnected); });
  if (id == 0) {
    auto m = transport::decode(err);
    if (m && std::holds_alternative<transport::error>(*m)) return unexpected(std::get<transport::error>(*m));
    return unexpected(transport::error{0, "internal", "the submission failed without a reason", transport::retry::failed});
  }
  job j;
  j.id_ = id;
  j.stream_ = s_->streams->find(id);
  if (!j.stream_) j.stream_ = s_->streams->create(id);
  j.client_ = s_;
  return j;
}

std::optional<transport::token_chunk> job::next() {
  std::unique_lock lock(stream_->m);
  stream_->cv.wait(lock, [&] { return !stream_->pending.empty() || stream_->ended; });
  if (stream_->pending.empty()) return std::nullopt;
  auto c = std::move(stream_->pending.front());
  stream_->pending.pop_front();
  return c;
}

job_result job::wait() {
  std::unique_lock lock(stream_->m);
  stream_->cv.wait(lock, [&] { return stream_->ended; });
  auto r = stream_->acc;
  r.resumes = stream_->resumes;
  lock.unlock();
  std::static_pointer_cast<client_state>(client_)->streams->erase(stream_);
  return r;
}

void job::cancel() { caf::anon_send(std::static_pointer_cast<client_state>(client_)->actor, cancel_atom::value, stream_->current.load()); }

struct cluster_state {
  cluster_options options;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor registry, node, coordinator;
  std::string model;
  client_set clients;

  ~cluster_state() {
    if (!sys) return;
    clients.close_all();
    for (auto* a : {&coordinator, &node, &registry})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    coordinator = node = registry = caf::actor{};
    sys.reset();  // waits for every actor to quit
  }
};

local_cluster::local_cluster(std::unique_ptr<cluster_state> s) : s_(std::move(s)) {}
local_cluster::~local_cluster() = default;
const std::string& local_cluster::name() const { return s_->model; }

result<std::unique_ptr<local_cluster>, std::string> local_cluster::start(const std::filesystem::path& model, const cluster_options& options) {
  auto s = std::make_unique<cluster_state>();
  s->options = options;
  s->cfg = std::make_unique<caf::actor_system_config>();
  s->cfg->set("scheduler.max-threads", static_cast<std::size_t>(std::max(1, options.scheduler_threads)));
  // Work sharing parks idle workers on a condition variable; work stealing polls, which takes cycles
  // from the executors' compute threads on a small machine.
  s->cfg->set("scheduler.policy", caf::atom("sharing"));
  s->sys = std::make_unique<caf::actor_system>(*s->cfg);
  s->registry = spawn_registry(*s->sys);
  s->node = spawn_node(*s->sys, options.executor_threads, options.max_per_replica, std::uint64_t{0});
  s->coordinator = spawn_coordinator(*s->sys, s->registry, s->node, options.max_outstanding, options.max_per_replica);
  s->model = model.filename().string();
  transport::deploy d;
  d.model = s->model;
  d.replicas = options.replicas;
  d.load.model = model.string();
  d.load.device = "cpu";
  d.load.max_rows = options.driver.max_rows;
  d.load.capacity = options.driver.capacity;
  d.load.block_size = options.driver.block_size;
  d.load.pool_blocks = options.driver.pool_blocks;
  d.load.prefill_chunk = options.driver.prefill_chunk;
  d.load.token_budget = options.driver.token_budget;
  d.load.no_prefix_cache = !options.driver.prefix_cache;
  d.load.no_preempt = !options.driver.preempt;
  d.load.tensor_parallel = options.tensor_parallel;
  d.load.pipeline_parallel = options.pipeline_parallel;
  caf::scoped_actor self{*s->sys};
  std::string err;
  self->request(s->coordinator, request_timeout, deploy_atom::value, transport::encode(d))
      .receive([&](const std::string& e, const std::string&) { err = e; }, [&](caf::error& e) { err = s->sys->render(e); });
  if (!err.empty()) return unexpected(err);
  return std::unique_ptr<local_cluster>(new local_cluster(std::move(s)));
}

std::unique_ptr<client> local_cluster::connect() { return s_->clients.open(*s_->sys, s_->coordinator); }

// Every live replica's figures: the coordinator names the drivers, each driver answers for itself.
std::vector<transport::stats> collect_replica_stats(caf::actor_system& sys, const caf::actor& coordinator) {
  caf::scoped_actor self{sys};
  std::vector<caf::actor> drivers;
  self->request(coordinator, request_timeout, replicas_atom::value).receive([&](const std::vector<caf::actor>& v) { drivers = v; }, [](caf::error&) {});
  std::vector<transport::stats> out;
  for (const auto& d : drivers)
    self->request(d, request_timeout, stats_atom::value)
        .receive(
            [&](const std::string& b) {
              auto m = transport::decode(b);
              if (m && std::holds_alternative<transport::stats>(*m)) out.push_back(std::get<transport::stats>(*m));
            },
            [](caf::error&) {});
  return out;
}


std::vector<transport::stats> local_cluster::replica_stats() { return collect_replica_stats(*s_->sys, s_->coordinator); }

transport::stats local_cluster::stats() {
  transport::stats total;
  for (const auto& s : replica_stats()) {
    total.queued += s.queued;
    total.running += s.running;
    total.kv_blocks_used += s.kv_blocks_used;
    total.kv_blocks_total += s.kv_blocks_total;
    total.tokens_per_second += s.tokens_per_second;
    total.jobs_done += s.jobs_done;
    total.jobs_refused += s.jobs_refused;
    total.prompt_tokens += s.prompt_tokens;
    total.prefix_hit_tokens += s.prefix_hit_tokens;
  }
  caf::scoped_actor self{*s_->sys};
  self->request(s_->coordinator, request_timeout, stats_atom::value)
      .receive(
          [&](const std::string& b) {
            auto m = transport::decode(b);
            if (m && std::holds_alternative<transport::stats>(*m)) total.jobs_refused += std::get<transport::stats>(*m).jobs_refused;
          },
          [](caf::error&) {});
  return total;
}

result<std::string, std::string> local_cluster::resolve(const std::filesystem::path& model) {
  caf::scoped_actor self{*s_->sys};
  std::string summary, err = "no answer";
  self->request(s_->registry, request_timeout, resolve_atom::value, model.string())
      .receive([&](const std::string& s, const std::string& e) { summary = s, err = e; }, [&](caf::error& e) { err = s_->sys->render(e); });
  if (summary.empty()) return unexpected(err);
  return summary;
}

bool local_cluster::poke(const std::string& actor, const std::string& bytes) {
  caf::scoped_actor self{*s_->sys};
  caf::actor target;
  if (actor == "coordinator") {
    target = s_->coordinator;
    self->send(target, submit_atom::value, bytes, caf::actor{});
    self->send(target, cancel_atom::value, bytes);
    self->send(target, deploy_atom::value, bytes);
  } else if (actor == "registry") {
    target = s_->registry;
    self->send(target, resolve_atom::value, bytes);
  } else if (actor == "node") {
    target = s_->node;
    self->send(target, deploy_atom::value, bytes, caf::actor{});
  } else if (actor == "driver") {
    self->request(s_->coordinator, request_timeout, replicas_atom::value).receive([&](const std::vector<caf::actor>& v) {
      if (!v.empty()) target = v.front();
    }, [](caf::error&) {});
    if (target) self->send(target, submit_atom::value, bytes, caf::actor{});
  } else if (actor == "client") {
    target = s_->clients.newest();
    if (target) self->send(target, chunk_atom::value, bytes);
  }
  if (!target) return false;
  bool alive = false;
  self->request(target, std::chrono::seconds(60), ping_atom::value).receive([&](ping_atom) { alive = true; }, [](caf::error&) {});
  return alive;
}

}  // namespace troupe::actors
