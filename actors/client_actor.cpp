// The client actor (one per user session: its submitted jobs, their token streams, cancellation and
// the resumption of a job whose replica was lost) and the facade of actors/cluster.hpp over it.
#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "actors/actor_internals.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
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
    if (c.replica != 0) acc.replica = c.replica;
    if (!c.embedding.empty()) acc.embedding = c.embedding;
    if (!c.beams.empty()) acc.beams = c.beams;
    ++acc.chunks;
    if (c.finish_reason != transport::finish_reason::running) {
      acc.finish_reason = std::string(transport::name(c.finish_reason));
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
  // Every stream still listed (the jobs not yet waited for).
  std::vector<std::shared_ptr<job_stream>> all() {
    std::lock_guard lock(m);
    std::vector<std::shared_ptr<job_stream>> out;
    for (const auto& [id, s] : streams) out.push_back(s);
    return out;
  }
  // A stream is listed under the id it runs under now (alias moves it).
  void erase(const std::shared_ptr<job_stream>& s) {
    std::lock_guard lock(m);
    if (auto it = streams.find(s->current); it != streams.end() && it->second == s) streams.erase(it);
  }
};

// ---- client ---------------------------------------------------------------------------------------------

struct client_actor_state {
  client_actor_state() = default;  // not an aggregate (CAF would build it from the actor's pointer)
  coordinator_actor coordinator;
  std::shared_ptr<stream_table> streams;
  // Chunks that arrived before their job's admission reached this actor (drivers answer the client
  // directly, so they may overtake the coordinator's reply); bounded.
  std::unordered_map<std::uint64_t, std::vector<std::string>> early;
  std::size_t early_count = 0;
  std::int64_t dropped = 0;  // chunks that did not decode, or belonged to nobody
  // The coordinator is gone (its process died or its link was lost): every job and submission fails at
  // once with a retryable error instead of waiting for answers that cannot come.
  bool coordinator_lost = false;
  struct pending_submit {
    std::shared_ptr<bool> answered;
    caf::typed_response_promise<std::uint64_t, std::string> rp;
  };
  std::vector<pending_submit> pending;  // submissions the coordinator has not answered yet
  static inline const char* name = "client";
};

transport::error coordinator_gone() {
  return {0, transport::error_code::disconnected, "the coordinator went away; submit again once it is back", transport::retry::disconnected};
}

constexpr std::size_t max_early_chunks = 1 << 16;
constexpr int max_resumes = 3;
// A resumed job finds no serving replica of its model while the coordinator replaces the lost ones:
// it asks again this often, this many times (about a minute).
constexpr auto resume_retry = std::chrono::milliseconds(500);
constexpr int max_resume_waits = 120;

using client_self = caf::stateful_actor<client_actor_state, client_actor_t::base>;

void deliver(client_self* self, const std::string& bytes);

// The chunks of job `id` that overtook its admission, delivered now that it is known.
void deliver_early(client_self* self, std::uint64_t id) {
  auto it = self->state.early.find(id);
  if (it == self->state.early.end()) return;
  auto chunks = std::move(it->second);
  self->state.early_count -= chunks.size();
  self->state.early.erase(it);
  for (const auto& c : chunks) deliver(self, c);
}

// A job whose replica was lost is submitted again with the output already delivered, so it resumes
// where it stopped on another replica.
void resubmit(client_self* self, std::uint64_t old_id, std::shared_ptr<job_stream> stream, transport::error why,
              transport::job_submit req, int waits) {
  if (self->state.coordinator_lost) return stream->fail(coordinator_gone());
  self->request(self->state.coordinator, request_timeout, submit_atom::value, transport::encode(req), caf::actor_cast<caf::actor>(self))
      .then(
          [=](std::uint64_t id, const std::string& err, const std::string&) {
            if (id == 0) {
              auto m = transport::decode(err);
              const bool is_error = m && std::holds_alternative<transport::error>(*m);
              // No replica of the model serves right now (it is being replaced): wait and ask again.
              if (is_error && std::get<transport::error>(*m).retry == transport::retry::overloaded && waits < max_resume_waits && !stream->is_ended()) {
                self->delayed_send(self, resume_retry, tick_atom::value, old_id, transport::encode(req), waits + 1);
                return;
              }
              stream->fail(is_error ? std::get<transport::error>(*m) : why);
              return;
            }
            self->state.streams->alias(old_id, id);
            deliver_early(self, id);
          },
          [=](caf::error&) { stream->fail(why); });
}

// A job whose replica was lost is submitted again, to its own model, with the output already
// delivered, so it resumes where it stopped on another replica of that model.
void resume(client_self* self, std::uint64_t old_id, std::shared_ptr<job_stream> stream, transport::error why) {
  if (!stream->request || stream->resumes >= max_resumes || stream->is_ended()) return stream->fail(std::move(why));
  auto req = *stream->request;
  req.prior_output = stream->delivered();
  if (req.max_tokens > 0 && static_cast<std::int64_t>(req.prior_output.size()) >= req.max_tokens) {  // 0: the capacity's bound
    transport::token_chunk done;
    done.job_id = old_id;
    done.finish_reason = transport::finish_reason::length;
    return stream->push(std::move(done));
  }
  ++stream->resumes;
  req.job_id = 0;
  resubmit(self, old_id, std::move(stream), std::move(why), std::move(req), 0);
}

void deliver(client_self* self, const std::string& bytes) {
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

client_actor_t::behavior_type client_actor(client_self* self, coordinator_actor coordinator, std::shared_ptr<stream_table> streams) {
  self->state.coordinator = coordinator;
  self->state.streams = streams;
  self->monitor(coordinator);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.coordinator.address() || st.coordinator_lost) return;
    st.coordinator_lost = true;
    for (auto& p : st.pending)
      if (!*p.answered) {
        *p.answered = true;
        p.rp.deliver(std::uint64_t{0}, transport::encode(coordinator_gone()));
      }
    st.pending.clear();
    for (auto& s : st.streams->all()) {
      auto e = coordinator_gone();
      e.job_id = s->current.load();
      s->fail(std::move(e));
    }
  });
  return {
      // From the facade: forwards to the coordinator; replies (job id, "") or (0, error bytes).
      [=](submit_atom, const std::string& bytes) -> caf::typed_response_promise<std::uint64_t, std::string> {
        auto rp = self->make_response_promise<std::uint64_t, std::string>();
        if (self->state.coordinator_lost) {
          rp.deliver(std::uint64_t{0}, transport::encode(coordinator_gone()));
          return rp;
        }
        auto answered = std::make_shared<bool>(false);
        std::erase_if(self->state.pending, [](const auto& p) { return *p.answered; });
        self->state.pending.push_back({answered, rp});
        self->request(self->state.coordinator, request_timeout, submit_atom::value, bytes, caf::actor_cast<caf::actor>(self))
            .then(
                [=](std::uint64_t id, const std::string& err, const std::string& model) mutable {
                  if (*answered) return;  // answered already: the coordinator was lost meanwhile
                  *answered = true;
                  if (id != 0) {
                    auto stream = self->state.streams->create(id);
                    if (auto m = transport::decode(bytes); m && std::holds_alternative<transport::job_submit>(*m)) {
                      stream->request = std::get<transport::job_submit>(*m);
                      stream->request->model = model;  // resumed only on replicas of the model it was routed to
                    }
                    deliver_early(self, id);
                  }
                  rp.deliver(id, err);
                },
                [=](caf::error& e) mutable {
                  if (*answered) return;
                  *answered = true;
                  rp.deliver(std::uint64_t{0}, error_bytes(0, transport::error_code::disconnected, self->system().render(e), transport::retry::disconnected));
                });
        return rp;
      },
      [=](chunk_atom, const std::string& bytes) { deliver(self, bytes); },
      // A resumption waiting for a replica of its model.
      [=](tick_atom, std::uint64_t old_id, const std::string& req_bytes, int waits) {
        auto stream = self->state.streams->find(old_id);
        auto m = transport::decode(req_bytes);
        if (!stream || !m || !std::holds_alternative<transport::job_submit>(*m)) return;
        resubmit(self, old_id, stream, transport::error{old_id, transport::error_code::disconnected, "the replica serving this job went away", transport::retry::disconnected},
                 std::get<transport::job_submit>(*m), waits);
      },
      [=](cancel_atom, std::uint64_t job) { self->send(self->state.coordinator, cancel_atom::value, transport::encode(transport::cancel_job{job})); },
      // The session reached the coordinator again (restarted, or its link restored): new submissions go
      // there. The jobs of before were failed with a retryable error when it went.
      [=](adopt_atom, const caf::actor& coordinator) {
        auto& st = self->state;
        st.coordinator = caf::actor_cast<coordinator_actor>(coordinator);
        st.coordinator_lost = false;
        self->monitor(coordinator);
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

// ---- facade ---------------------------------------------------------------------------------------------

struct client_state {
  caf::actor_system* sys = nullptr;
  std::mutex m;  // guards `actor` (a reconnected session gives the client a fresh actor)
  client_actor_t actor;
  std::shared_ptr<stream_table> streams = std::make_shared<stream_table>();
  client_actor_t current() {
    std::lock_guard lock(m);
    return actor;
  }
  ~client_state() {
    if (actor) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }
};

std::unique_ptr<client> client_set::open(caf::actor_system& sys, const coordinator_actor& coordinator) {
  auto cs = std::make_shared<client_state>();
  cs->sys = &sys;
  cs->actor = sys.spawn(client_actor, coordinator, cs->streams);
  clients_.push_back(cs);
  return std::unique_ptr<client>(new client(cs));
}

void client_set::rehome(const coordinator_actor& coordinator) {
  std::erase_if(clients_, [](const auto& w) { return w.expired(); });
  // A fresh client actor over the same streams: the replicas' nodes may still hold proxies of the old
  // one from before the coordinator went, whose route died with it (CAF 0.17 keeps such a proxy, and
  // chunks sent to it are lost). Its jobs were all failed when the coordinator went.
  for (auto& w : clients_)
    if (auto c = w.lock()) {
      auto fresh = c->sys->spawn(client_actor, coordinator, c->streams);
      std::lock_guard lock(c->m);
      if (!c->actor) continue;
      caf::anon_send_exit(c->actor, caf::exit_reason::user_shutdown);
      c->actor = fresh;
    }
}

void client_set::close_all() {
  for (auto& w : clients_)
    if (auto c = w.lock()) {
      std::lock_guard lock(c->m);
      caf::anon_send_exit(c->actor, caf::exit_reason::user_shutdown);
      c->actor = client_actor_t{};
    }
}

caf::actor client_set::newest() const {
  auto c = clients_.empty() ? nullptr : clients_.back().lock();
  return c ? caf::actor_cast<caf::actor>(c->current()) : caf::actor{};
}




client::~client() = default;

result<job, transport::error> client::submit(const transport::job_submit& request) {
  caf::scoped_actor self{*s_->sys};
  std::uint64_t id = 0;
  std::string err;
  self->request(s_->current(), request_timeout, submit_atom::value, transport::encode(request))
      .receive([&](std::uint64_t i, const std::string& e) { id = i, err = e; },
               [&](caf::error& e) { err = error_bytes(0, transport::error_code::disconnected, s_->sys->render(e), transport::retry::disconnected); });
  if (id == 0) {
    auto m = transport::decode(err);
    if (m && std::holds_alternative<transport::error>(*m)) return unexpected(std::get<transport::error>(*m));
    return unexpected(transport::error{0, transport::error_code::internal, "the submission failed without a reason", transport::retry::failed});
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

void job::cancel() { caf::anon_send(std::static_pointer_cast<client_state>(client_)->current(), cancel_atom::value, stream_->current.load()); }

}  // namespace troupe::actors
