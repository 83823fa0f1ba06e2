// A replica whose pipeline stages live on different nodes (docs/tensor-parallel.md): the coordinator has
// every stage but the last spawned as a rank actor on a node of its own, then the last stage's node
// spawns the driver with those ranks as remote ranks. The stages' pipe is a Gloo group that meets
// through the coordinator's rendezvous store; the driver reaches each rank actor over CAF to load its
// part, compile each entry and run each step, whose activations then pass stage to stage over Gloo.
#include <arpa/inet.h>
#include <caf/all.hpp>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <map>

#include "actors/actor_internals.hpp"
#include "actors/entry_key.hpp"
#include "engine/core/collective.hpp"
#include "engine/driver/driver.hpp"
#include "engine/driver/weight_source.hpp"
#include "engine/exec/cpu/cpu_executor.hpp"
#include "families/model_handle.hpp"
#include "transport/codec.hpp"
#include "transport/collectives.hpp"

namespace troupe::actors {

// ---- the coordinator's rendezvous store --------------------------------------------------------------

namespace {

class coordinator_store final : public transport::rendezvous_store {
 public:
  coordinator_store(caf::actor_system& sys, coordinator_actor coordinator) : sys_(sys), coordinator_(std::move(coordinator)) {}
  result<void, std::string> set(const std::string& key, const std::string& value) override {
    caf::scoped_actor self{sys_};
    std::string err = "no answer";
    self->request(coordinator_, std::chrono::seconds(30), kv_set_atom::value, key, value)
        .receive([&](const std::string& e) { err = e; }, [&](caf::error& e) { err = sys_.render(e); });
    if (!err.empty()) return unexpected(err);
    return {};
  }
  result<std::optional<std::string>, std::string> get(const std::string& key) override {
    caf::scoped_actor self{sys_};
    std::string err;
    std::optional<std::string> out;
    self->request(coordinator_, std::chrono::seconds(30), kv_get_atom::value, key)
        .receive(
            [&](bool found, std::string& v) {
              if (found) out = std::move(v);
            },
            [&](caf::error& e) { err = sys_.render(e); });
    if (!err.empty()) return unexpected(err);
    return out;
  }

 private:
  caf::actor_system& sys_;
  coordinator_actor coordinator_;
};

// The pipe of a cross-node replica: rank `stage` of `stages`, meeting through the coordinator.
// Its ranks of index `t` (one per stage) share one pipe.
result<std::unique_ptr<collective>, std::string> join_pipe(caf::actor_system& sys, const coordinator_actor& coordinator, const std::string& group,
                                                           int t, int stage, int stages, const std::string& host) {
  transport::gloo_options g;
  g.host = host;
  g.rank = stage;
  g.size = stages;
  g.store = coordinator_rendezvous(sys, coordinator);
  g.prefix = group + "/pipe" + std::to_string(t);
  g.timeout = std::chrono::seconds(60);
  auto c = transport::connect_gloo(g);
  if (!c) return unexpected("stage " + std::to_string(stage) + " joining the pipe: " + c.error().message());
  return transport::as_collective(std::move(*c));
}

constexpr auto rank_step_timeout = std::chrono::seconds(120);

// ---- a stage on another node: the rank actor -------------------------------------------------------

struct rank_state {
  rank_state() = default;  // not an aggregate (CAF would build it from the actor's pointer)
  std::shared_ptr<const families::model_handle> part;
  coordinator_actor coordinator;
  std::string group;
  int t = 0, stage = 0, stages = 1;
  std::string host;  // where its pipe listens
  std::shared_ptr<void> group_keep;  // the stage's tensor-parallel group, shared by its rank actors
  deferred_collective pipe;
  std::unique_ptr<exec::cpu::cpu_executor> ex;
  std::unique_ptr<driver::weight_map_source> weights;
  exec::executable_id exe{};
  struct entry {
    exec::entry_id id;
    std::vector<std::pair<std::string, graph::tensor_type>> slots;  // what a step binds, by name
  };
  std::map<std::string, entry> entries;  // by the key's text (driver::entry_key::str)
  static inline const char* name = "rank";
};

rank_actor_t::behavior_type rank_actor(caf::stateful_actor<rank_state, rank_actor_t::base>* self, std::shared_ptr<const families::model_handle> part,
                                       coordinator_actor coordinator,
                         std::string group, int t, int stage, int stages, int threads, std::string host, collective* tp_group,
                         std::shared_ptr<void> group_keep) {
  auto& st = self->state;
  st.host = std::move(host);
  st.t = t;
  st.group_keep = std::move(group_keep);
  st.part = std::move(part);
  st.coordinator = std::move(coordinator);
  st.group = std::move(group);
  st.stage = stage;
  st.stages = stages;
  st.ex = std::make_unique<exec::cpu::cpu_executor>(exec::cpu::cpu_options{threads, std::nullopt, tp_group, &st.pipe});
  return {
      [=](rank_connect_atom) -> std::string {
        auto& st = self->state;
        if (st.pipe.joined()) return {};
        auto p = join_pipe(self->system(), st.coordinator, st.group, st.t, st.stage, st.stages, st.host);
        if (!p) return p.error();
        st.pipe.join(std::move(*p));
        spdlog::info("event=rank_joined group={} stage={} of={} rank={}", st.group, st.stage, st.stages, st.t);
        return {};
      },
      [=](rank_load_atom) -> std::string {
        auto& st = self->state;
        if (st.weights) return {};
        st.weights = std::make_unique<driver::weight_map_source>(st.part->model().weights());
        auto e = st.ex->load(*st.weights);
        if (!e) return "load: " + e.error().message();
        st.exe = *e;
        return {};
      },
      [=](rank_add_atom, const std::string& bytes) -> std::string {
        auto& st = self->state;
        if (!st.weights) return "an entry before the load";
        auto m = transport::decode(bytes);
        if (!m) return "entry: " + m.error().message();
        const auto* w = std::get_if<transport::entry_key>(&*m);
        if (!w) return "entry: not an EntryKey";
        auto k = from_wire(*w);
        if (!k) return "entry: " + k.error();
        const auto text = k->str();
        if (st.entries.contains(text)) return {};
        families::step_spec spec;
        spec.program = k->program;
        spec.shape = k->shape;
        spec.carried_inputs = k->carried;
        auto g = st.part->model().trace(spec);
        if (!g) return "trace of " + text + ": " + g.error().message();
        auto e = st.ex->add_entry(st.exe, *g);
        if (!e) return "entry " + text + ": " + e.error().message();
        rank_state::entry en{*e, {}};
        for (const auto& s : g->slots()) en.slots.emplace_back(s.slot.name, g->info(s.value).type);
        st.entries.emplace(text, std::move(en));
        return {};
      },
      [=](rank_step_atom, const std::string& bytes) -> std::string {
        auto& st = self->state;
        auto m = transport::decode(bytes);
        if (!m) return "step: " + m.error().message();
        const auto* b = std::get_if<transport::step_batch>(&*m);
        if (!b) return "step: not a step batch";
        auto key = from_wire(b->entry);
        if (!key) return "step: " + key.error();
        const auto it = st.entries.find(key->str());
        if (it == st.entries.end()) return "step: entry '" + key->str() + "' was never added";
        const std::map<std::string, const std::vector<std::int32_t>*> given{
            {"token_ids", &b->token_ids}, {"positions", &b->positions}, {"kv_write_map", &b->kv_write_map}, {"kv_read_map", &b->kv_read_map}};
        exec::step_inputs in;
        for (const auto& [name, type] : it->second.slots) {
          const auto g = given.find(name);
          if (g == given.end()) return "step: slot '" + name + "' is not one a step batch carries";
          if (type.type != dtype::i32 || static_cast<std::int64_t>(g->second->size()) != type.dims.numel())
            return "step: slot '" + name + "' holds " + std::to_string(g->second->size()) + " ids, the entry binds " + type.str();
          in.slots.emplace(name, tensor_view(dtype::i32, type.dims, reinterpret_cast<const std::byte*>(g->second->data())));
        }
        auto out = st.ex->step(it->second.id, in);
        if (!out) return "step: " + out.error().message();
        return {};
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

// ---- the driver's side: a rank actor as a driver::remote_rank ----------------------------------------

class actor_rank final : public driver::remote_rank {
 public:
  actor_rank(caf::actor_system& sys, const caf::actor& rank) : sys_(sys), rank_(caf::actor_cast<rank_actor_t>(rank)) {}
  result<void, std::string> connect() { return ask(std::chrono::seconds(90), rank_connect_atom::value); }
  result<void, std::string> load() override { return ask(request_timeout, rank_load_atom::value); }
  result<void, std::string> add(const driver::entry_key& k) override {
    return ask(request_timeout, rank_add_atom::value, transport::encode(to_wire(k)));
  }
  result<void, std::string> step(const driver::entry_key& k, const exec::step_inputs& in) override {
    transport::step_batch b;
    b.entry = to_wire(k);
    const std::map<std::string, std::vector<std::int32_t>*> slots{
        {"token_ids", &b.token_ids}, {"positions", &b.positions}, {"kv_write_map", &b.kv_write_map}, {"kv_read_map", &b.kv_read_map}};
    for (const auto& [name, v] : in.slots) {
      const auto s = slots.find(name);
      if (s == slots.end() || v.type() != dtype::i32) return unexpected("a remote rank takes i32 token ids, positions and KV maps, not '" + name + "'");
      const auto* p = v.as<std::int32_t>();
      s->second->assign(p, p + v.shape().numel());
    }
    return ask(rank_step_timeout, rank_step_atom::value, transport::encode(b));
  }

 private:
  template <class... Ts>
  result<void, std::string> ask(caf::timespan timeout, Ts&&... xs) {
    caf::scoped_actor self{sys_};
    std::string err = "no answer";
    self->request(rank_, timeout, std::forward<Ts>(xs)...)
        .receive([&](const std::string& e) { err = e; }, [&](caf::error& e) { err = sys_.render(e); });
    if (!err.empty()) return unexpected(err);
    return {};
  }
  caf::actor_system& sys_;
  rank_actor_t rank_;
};

}  // namespace

std::string local_address_toward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  // A UDP socket's connect sends nothing; it only picks the route, and with it the local address.
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr)
      out = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

std::shared_ptr<transport::rendezvous_store> coordinator_rendezvous(caf::actor_system& sys, const coordinator_actor& coordinator) {
  return std::make_shared<coordinator_store>(sys, coordinator);
}

result<std::vector<caf::actor>, std::string> spawn_stage(caf::local_actor* node, const std::shared_ptr<const families::model_handle>& model,
                                                         const transport::load_request& load, const coordinator_actor& coordinator, int threads,
                                                         const std::string& host) {
  const int tp = std::max(1, load.tensor_parallel), pp = load.pipeline_parallel, stage = load.world_rank;
  if (pp < 2 || stage < 0 || stage >= pp - 1) return unexpected("a remote stage is one before the last of " + std::to_string(pp));
  if (load.group.empty()) return unexpected(std::string("a remote stage needs its replica's group"));
  // Every part first: a split the model refuses spawns nothing.
  std::vector<std::shared_ptr<const families::model_handle>> parts;
  for (int t = 0; t < tp; ++t) {
    auto part = tp * pp > 1 ? model->part(t, tp, stage, pp) : model->stage(stage, pp);
    if (!part) return unexpected(families::message(part.error()));
    parts.push_back(*part);
  }
  // The stage's ranks are on this node: their all_reduce meets in an in-process group.
  auto group = std::make_shared<std::vector<std::unique_ptr<collective>>>(tp > 1 ? local_group(tp) : std::vector<std::unique_ptr<collective>>{});
  std::vector<caf::actor> out;
  for (int t = 0; t < tp; ++t)
    out.push_back(caf::actor_cast<caf::actor>(node->spawn<caf::detached>(rank_actor, parts[static_cast<std::size_t>(t)], coordinator, load.group, t,
                                                                         stage, pp, threads, host,
                                                                         tp > 1 ? (*group)[static_cast<std::size_t>(t)].get() : nullptr,
                                                                         std::shared_ptr<void>(group))));
  return out;
}

result<cross_node_head, std::string> make_cross_node_head(caf::actor_system& sys, const std::shared_ptr<const families::model_handle>& model,
                                                         const transport::load_request& load, const coordinator_actor& coordinator,
                                                         const std::vector<caf::actor>& ranks, int threads, const std::string& host) {
  const int tp = std::max(1, load.tensor_parallel), pp = load.pipeline_parallel;
  if (pp < 2 || static_cast<int>(ranks.size()) != (pp - 1) * tp)
    return unexpected("a cross-node replica of " + std::to_string(pp) + " stages of " + std::to_string(tp) + " ranks has " +
                      std::to_string((pp - 1) * tp) + " remote ranks, got " + std::to_string(ranks.size()));
  // The last stage's ranks, all here: rank 0 drives, the others are local ranks of the driver.
  std::vector<std::shared_ptr<const families::model_handle>> parts;
  for (int t = 0; t < tp; ++t) {
    auto part = tp > 1 ? model->part(t, tp, pp - 1, pp) : model->stage(pp - 1, pp);
    if (!part) return unexpected(families::message(part.error()));
    parts.push_back(*part);
  }
  struct stage_parts {
    std::vector<std::unique_ptr<collective>> group;  // the last stage's tensor-parallel group
    std::vector<std::unique_ptr<deferred_collective>> pipes;
    std::vector<std::unique_ptr<exec::cpu::cpu_executor>> ex;
    std::vector<std::shared_ptr<actor_rank>> remotes;
  };
  auto p = std::make_shared<stage_parts>();
  if (tp > 1) p->group = local_group(tp);
  for (int t = 0; t < tp; ++t) {
    p->pipes.push_back(std::make_unique<deferred_collective>());
    p->ex.push_back(std::make_unique<exec::cpu::cpu_executor>(
        exec::cpu::cpu_options{threads, std::nullopt, tp > 1 ? p->group[static_cast<std::size_t>(t)].get() : nullptr, p->pipes.back().get()}));
  }
  cross_node_head h;
  h.part = parts[0];
  for (const auto& r : ranks) {
    p->remotes.push_back(std::make_shared<actor_rank>(sys, r));
    h.other_ranks.push_back({nullptr, nullptr, p->remotes.back()});
  }
  for (int t = 1; t < tp; ++t) h.other_ranks.push_back({parts[static_cast<std::size_t>(t)], p->ex[static_cast<std::size_t>(t)].get(), nullptr});
  const std::string group = load.group;
  // Every rank joins its pipe at once (Gloo waits for all of a pipe's stages): the remote ranks and
  // this stage's ranks each on a thread of its own.
  h.connect = [&sys, p, coordinator, group, tp, pp, host]() -> result<void, std::string> {
    std::vector<std::future<result<void, std::string>>> others;
    for (auto& r : p->remotes) others.push_back(std::async(std::launch::async, [r] { return r->connect(); }));
    std::vector<std::future<result<std::unique_ptr<collective>, std::string>>> mine;
    for (int t = 0; t < tp; ++t)
      mine.push_back(std::async(std::launch::async, [&sys, coordinator, group, t, pp, host] { return join_pipe(sys, coordinator, group, t, pp - 1, pp, host); }));
    std::string err;
    for (std::size_t i = 0; i < others.size(); ++i)
      if (auto r = others[i].get(); !r && err.empty()) err = "remote rank " + std::to_string(i) + ": " + r.error();
    for (int t = 0; t < tp; ++t) {
      auto c = mine[static_cast<std::size_t>(t)].get();
      if (!c) {
        if (err.empty()) err = c.error();
        continue;
      }
      p->pipes[static_cast<std::size_t>(t)]->join(std::move(*c));
    }
    if (!err.empty()) return unexpected(err);
    return {};
  };
  h.executor = std::shared_ptr<exec::cpu::cpu_executor>(p, p->ex[0].get());
  h.keep = p;
  return h;
}

}  // namespace troupe::actors
