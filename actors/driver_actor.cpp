// The driver actor: one per model replica, over one Driver<Serving> (its prepared entry set and its
// sequence store) and the scheduler's continuous-batching rounds. Detached: it prepares and steps on its
// own thread. Jobs arrive from the coordinator; chunks go straight to each job's client.
#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>

#include "actors/actor_internals.hpp"
#include "engine/text/chat_prompt.hpp"
#include "engine/text/chat_template.hpp"
#include "families/model_handle.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace {

struct driver_job {
  std::uint64_t job = 0;
  client_actor_t client;
  std::int64_t prompt_tokens = 0;
  std::int64_t generated = 0;
  bool logprobs = false;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  bool expired = false;
  bool orphan = false;  // a job of a coordinator this replica no longer serves (its client was told to resubmit)
};

struct driver_actor_state {
  driver_actor_state() = default;  // not an aggregate (CAF would build it from the actor's pointer)
  std::shared_ptr<const families::model_handle> handle;
  std::shared_ptr<exec::executor> ex;
  std::shared_ptr<void> ranks;  // a tensor-parallel replica's group and other ranks' executors
  std::optional<driver::driver<driver::serving>> drv;
  std::optional<text::chat_template> chat;
  std::map<driver::seq_id, driver_job> jobs;
  std::unordered_map<std::uint64_t, driver::seq_id> by_job;
  coordinator_actor coordinator;
  bool ticking = false;
  std::int64_t max_jobs = 0;
  std::int64_t done = 0, refused = 0;
  std::uint64_t replica_id = 0;  // as the coordinator knows it (a restarted one may adopt it under another)
  double tokens_per_second = 0;
  static inline const char* name = "driver";
};

// The request's prompt as token ids, by its form.
result<std::vector<std::int32_t>, std::string> prompt_ids(driver_actor_state& st, const transport::job_submit& j) {
  if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&j.prompt)) return *ids;
  const auto* codec = st.handle->text();
  if (!codec) return unexpected("a text prompt needs the model's tokenizer: " + st.handle->text_problem());
  // Each media marker takes the vision tower's begin token (docs/vision.md); without images the text is as given.
  const auto* tower = st.handle->vision();
  auto marked = [&](std::string text) {
    if (!tower || j.images.empty()) return text;
    for (auto at = text.find(transport::media_marker); at != std::string::npos; at = text.find(transport::media_marker, at))
      text.replace(at, transport::media_marker.size(), tower->spec.begin_text), at += tower->spec.begin_text.size();
    return text;
  };
  if (const auto* t = std::get_if<std::string>(&j.prompt)) {
    auto ids = codec->encode(marked(*t), true);
    if (!ids) return unexpected(ids.error().message());
    return std::vector<std::int32_t>(ids->begin(), ids->end());
  }
  if (!st.chat) {
    if (codec->chat_template().empty()) return unexpected(std::string("the model ships no chat template"));
    auto t = text::chat_template::parse(codec->chat_template());
    if (!t) return unexpected("chat template: " + t.error().message);
    st.chat.emplace(std::move(*t));
  }
  nlohmann::json msgs = nlohmann::json::array();
  for (const auto& m : std::get<std::vector<transport::chat_message>>(j.prompt)) msgs.push_back({{"role", m.role}, {"content", marked(m.content)}});
  return text::chat_prompt_ids(*codec, *st.chat, msgs.dump(), j.tools_json);
}

result<driver::request_inputs, std::string> request_inputs_of(const transport::job_submit& j) {
  driver::request_inputs out;
  for (const auto& in : j.inputs) {
    const std::optional<dtype> t = in.dtype;
    if (is_quantized(*t)) return unexpected("input '" + in.name + "': a block-quantized element type '" + std::string(name(*t)) + "'");
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
  s.draft_tokens = c.draft_tokens;
  s.accepted_tokens = c.accepted_tokens;
  return s;
}

using driver_self = caf::stateful_actor<driver_actor_state, driver_actor_t::base>;

driver_actor_t::behavior_type driver_actor(driver_self* self, std::shared_ptr<const families::model_handle> handle,
                           std::shared_ptr<exec::executor> ex, driver::driver_options options, std::int64_t max_jobs,
                           caf::actor coordinator_handle, std::string model, std::shared_ptr<void> ranks, std::uint64_t replica_id) {
  const auto coordinator = caf::actor_cast<coordinator_actor>(coordinator_handle);
  auto& st = self->state;
  st.handle = handle;
  st.ex = ex;
  st.ranks = std::move(ranks);
  st.coordinator = coordinator;
  st.max_jobs = max_jobs;
  st.replica_id = replica_id;
  // Prepared here, on the driver's own thread: the entries compile before it serves. The coordinator
  // hears how far it has come (what `troupe status` and `troupe deploy --progress` show).
  options.on_prepare = [self, coordinator, replica_id](std::int64_t done, std::int64_t total) {
    self->send(coordinator, progress_atom::value, replica_id, done, total);
  };
  auto prepared = driver::driver<driver::unprepared>(handle, *ex, options).prepare();
  if (!prepared) {
    // Told to the coordinator, which fails the deployment naming this node; the node only monitors
    // this actor, so its failure takes nothing else with it.
    spdlog::warn("event=replica_prepare_failed replica={} model={} reason=\"{}\"", replica_id, model, prepared.error().second.message());
    self->send(coordinator, register_atom::value, replica_id, caf::actor_cast<caf::actor>(self), prepared.error().second.message());
    self->quit(caf::sec::runtime_error);
    return driver_actor_t::behavior_type::make_empty_behavior();
  }
  st.drv.emplace(std::move(*prepared));
  self->send(coordinator, register_atom::value, replica_id, caf::actor_cast<caf::actor>(self), std::string());

  static_assert(static_cast<int>(transport::last_guide_kind) == static_cast<int>(guide::guide_kind::choice),
                "transport::guide_kind and guide::guide_kind are one list in one order");
  auto finish_job = [self](std::uint64_t job) { self->send(self->state.coordinator, done_atom::value, job); };
  auto refuse = [self, finish_job](std::uint64_t job, const client_actor_t& client, transport::error_code code, std::string why, transport::retry r) {
    ++self->state.refused;
    if (client) self->send(client, chunk_atom::value, error_bytes(job, code, std::move(why), r));
    finish_job(job);
  };
  auto start_ticking = [self] {
    if (self->state.ticking) return;
    self->state.ticking = true;
    self->send(self, tick_atom::value);
  };

  return {
      [=](submit_atom, const std::string& bytes, const caf::actor& client_handle) {
        const auto client = caf::actor_cast<client_actor_t>(client_handle);
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m) return refuse(0, client, transport::error_code::bad_message, m.error().message(), m.error().retry());
        auto* j = std::get_if<transport::job_submit>(&*m);
        if (!j) return refuse(0, client, transport::error_code::bad_message, "a driver takes job submissions, not " + std::string(transport::kind(*m)), transport::retry::failed);
        if (static_cast<std::int64_t>(st.jobs.size()) >= st.max_jobs)
          return refuse(j->job_id, client, transport::error_code::overloaded, "the replica holds " + std::to_string(st.jobs.size()) + " jobs", transport::retry::overloaded);
        if (st.by_job.contains(j->job_id)) return refuse(j->job_id, client, transport::error_code::invalid_request, "job id already running", transport::retry::failed);
        auto ids = prompt_ids(st, *j);
        if (!ids) return refuse(j->job_id, client, transport::error_code::invalid_request, ids.error(), transport::retry::failed);
        if (j->embed) {
          // An embedding: the encode program over the prompt, pooled as the model declares; answered
          // at once (one step per chunk bucket, no sequence held).
          if (!j->inputs.empty() || j->guide.kind != transport::guide_kind::none || !j->prior_output.empty())
            return refuse(j->job_id, client, transport::error_code::invalid_request, "an embedding takes a prompt only", transport::retry::failed);
          const std::vector<std::vector<std::int32_t>> rows{std::move(*ids)};
          auto e = st.drv->embed(rows, st.handle->pooling());
          if (!e)
            return refuse(j->job_id, client, transport::error_code_named(driver::name(e.error().code)).value_or(transport::error_code::internal),
                          e.error().message(), transport::retry::failed);
          transport::token_chunk c;
          c.job_id = j->job_id;
          c.embedding = std::move(e->front());
          c.finish_reason = transport::finish_reason::eos;
          c.usage = {static_cast<std::int64_t>(rows.front().size()), 0, 0};
          c.replica = st.replica_id;
          ++st.done;
          if (client) self->send(client, chunk_atom::value, transport::encode(c));
          finish_job(j->job_id);
          return;
        }
        auto inputs = request_inputs_of(*j);
        if (!inputs) return refuse(j->job_id, client, transport::error_code::invalid_request, inputs.error(), transport::retry::failed);
        driver::seq_request r;
        r.prompt = std::move(*ids);
        const auto& s = j->sampling;
        r.sampling = {s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.top_logprobs, s.seed};
        r.logit_bias = s.logit_bias;
        r.max_tokens = j->max_tokens;
        r.stop_ids = j->stop_ids;
        r.ignore_eos = j->ignore_eos;
        r.speculate = !j->no_speculation;
        r.adapter = j->adapter;
        if (j->beams > 1) {
          r.beams = j->beams;
          r.length_penalty = j->length_penalty;
          r.early_stopping = j->early_stopping;
        }
        r.stop = j->stop;
        r.inputs = std::move(*inputs);
        r.prior_output = j->prior_output;
        r.guided = {static_cast<guide::guide_kind>(j->guide.kind), j->guide.text};
        if (!j->images.empty() || st.handle->vision()) {
          // Images: decoded here, encoded by the vision tower, their rows placed as request inputs.
          std::vector<families::image_u8> images;
          for (std::size_t i = 0; i < j->images.size(); ++i) {
            const auto& b = j->images[i];
            auto img = families::decode_image(std::span(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
            if (!img) return refuse(j->job_id, client, transport::error_code::invalid_request, "image " + std::to_string(i) + ": " + img.error().message(), transport::retry::failed);
            images.push_back(std::move(*img));
          }
          auto w = st.drv->with_images(std::move(r), images);
          if (!w)
            return refuse(j->job_id, client, transport::error_code_named(driver::name(w.error().code)).value_or(transport::error_code::invalid_request),
                          w.error().message(), transport::retry::failed);
          r = std::move(*w);
        }
        const auto prompt_len = static_cast<std::int64_t>(r.prompt.size());
        auto id = st.drv->open(std::move(r));
        if (!id) {
          // An adapter this replica has not loaded is a model no deployment serves, as the API reports it.
          const auto code = id.error().code == driver::driver_error_code::unknown_adapter
                                ? transport::error_code::unknown_model
                                : transport::error_code_named(driver::name(id.error().code)).value_or(transport::error_code::invalid_request);
          return refuse(j->job_id, client, code, id.error().message(), transport::retry::failed);
        }
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
            c.usage = {j.prompt_tokens, j.generated, u.cached_tokens};
            c.replica = st.replica_id;
            for (const auto& b : u.beams)
              c.beams.push_back({b.tokens, b.text, b.logprob, b.score,
                                 transport::finish_reason_named(driver::name(b.finished)).value_or(transport::finish_reason::error)});
            if (u.finished)
              c.finish_reason = j.expired && *u.finished == driver::finish_reason::cancelled
                                    ? transport::finish_reason::deadline
                                    : transport::finish_reason_named(driver::name(*u.finished)).value_or(transport::finish_reason::error);
            if (j.client) self->send(j.client, chunk_atom::value, transport::encode(c));
            if (u.finished) {
              spdlog::debug("event=job_finished job={} tokens={} reason={}", j.job, j.generated, transport::name(c.finish_reason));
              ++st.done;
              if (!j.orphan) finish_job(j.job), st.by_job.erase(j.job);
              (void)st.drv->release(u.id);
              st.jobs.erase(it);
            }
          }
        } else {
          for (auto& [seq, j] : st.jobs) {
            if (j.client) self->send(j.client, chunk_atom::value, error_bytes(j.job, transport::error_code::internal, r.error().message(), transport::retry::failed));
            if (!j.orphan) finish_job(j.job);
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
      // A LoRA adapter loaded (a path) or unloaded (none) while serving (docs/adapters.md).
      [=](adapter_atom, const std::string& name, const std::string& path) -> std::string {
        auto& d = *self->state.drv;
        auto r = path.empty() ? d.unload_adapter(name) : d.load_adapter(name, path);
        if (r) spdlog::info("event=adapter_{} name={} path=\"{}\"", path.empty() ? "unloaded" : "loaded", name, path);
        return r ? std::string() : r.error().message();
      },
      // Drained (or removed by the coordinator): quits with the normal reason.
      [=](stop_atom) { self->quit(); },
      // A coordinator (restarted, or the same one after this node's link came back) takes this
      // replica over under `id`: it serves as before, without loading again.
      [=](adopt_atom, const caf::actor& coordinator, std::uint64_t id) {
        auto& st = self->state;
        st.coordinator = caf::actor_cast<coordinator_actor>(coordinator);
        st.replica_id = id;
        // The jobs of the coordinator before: their clients were failed with a retryable error when it
        // went, and job ids start again with the new one, so they end here, unreported.
        for (auto& [seq, j] : st.jobs) {
          j.orphan = true;
          j.client = client_actor_t{};
          (void)st.drv->cancel(seq);
        }
        st.by_job.clear();
        spdlog::info("event=replica_adopted model={} replica={}", model, id);
        self->send(self->state.coordinator, register_atom::value, id, caf::actor_cast<caf::actor>(self), std::string());
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

caf::actor spawn_driver(caf::local_actor* parent, driver_spawn a) {
  return caf::actor_cast<caf::actor>(parent->spawn<caf::detached>(driver_actor, std::move(a.handle), std::move(a.executor), std::move(a.options), a.max_jobs, a.coordinator,
                                      std::move(a.model), std::move(a.keep), a.replica_id));
}

}  // namespace troupe::actors
