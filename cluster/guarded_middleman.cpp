// CAF's middleman behind the link guard: connect() and open() of CAF's middleman actor, overridden.
#include "cluster/guarded_middleman.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

namespace troupe::cluster {

// A doorman that listens on nothing: connections arrive through feed_connection() (the guard's front,
// after authentication), posted onto the multiplexer's thread like an accepted socket would be.
class fed_doorman final : public caf::io::doorman {
 public:
  fed_doorman(caf::io::network::multiplexer& mx, std::int64_t id) : caf::io::doorman(caf::io::accept_handle::from_int(id)), mx_(mx) {}
  bool new_connection() override { return false; }  // nothing to accept: connections are fed
  void graceful_shutdown() override { detach(&mx_, false); }
  void launch() override {}
  std::string addr() const override { return "127.0.0.1"; }
  std::uint16_t port() const override { return 0; }
  void add_to_loop() override {}
  void remove_from_loop() override {}
  // On the multiplexer's thread: CAF's side of a link becomes a scribe of the broker that owns us.
  void take(int fd) {
    if (detached()) {
      ::close(fd);
      return;
    }
    auto sptr = mx_.new_scribe(fd);
    auto hdl = sptr->hdl();
    parent()->add_scribe(std::move(sptr));
    caf::io::doorman::new_connection(&mx_, hdl);
  }

 private:
  caf::io::network::multiplexer& mx_;
};

class doorman_feed {
 public:
  void set(caf::intrusive_ptr<fed_doorman> d, caf::io::network::multiplexer* mx) {
    std::lock_guard lock(m_);
    door_ = std::move(d);
    mx_ = mx;
  }
  int connection() {
    std::lock_guard lock(m_);
    if (!door_) return -1;
    auto pair = loopback_pair();
    if (!pair) {
      spdlog::error("event=link_pair_failed reason=\"{}\"", pair.error());
      return -1;
    }
    mx_->post([d = door_, fd = pair->theirs] { d->take(fd); });
    return pair->ours;
  }

 private:
  std::mutex m_;
  caf::intrusive_ptr<fed_doorman> door_;
  caf::io::network::multiplexer* mx_ = nullptr;
};

std::shared_ptr<doorman_feed> guarded_links::make_feed() { return std::make_shared<doorman_feed>(); }
int feed_connection(doorman_feed& f) { return f.connection(); }
void close_feed(doorman_feed& f) { f.set(nullptr, nullptr); }

namespace {

class guarded_middleman final : public caf::io::middleman_actor_impl {
 public:
  guarded_middleman(caf::actor_config& cfg, caf::actor basp, guarded_links links)
      : caf::io::middleman_actor_impl(cfg, std::move(basp)), links_(std::move(links)) {}

  const char* name() const override { return "guarded_middleman"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    auto fd = dial_link(host, port, links_.tls, links_.limits, links_.dial_deadline);
    if (!fd) {
      spdlog::warn("event=dial_failed peer={}:{} reason=\"{}\"", host, port, fd.error());
      return caf::make_error(caf::sec::cannot_connect_to_node, fd.error());
    }
    return system().middleman().backend().new_scribe(*fd);
  }

  // Whatever port and address are asked for, the published actor listens on nothing reachable: its
  // doorman takes the links the guard's front authenticated.
  caf::expected<caf::io::doorman_ptr> open(std::uint16_t, const char*, bool) override {
    auto& mx = system().middleman().backend();
    auto d = caf::make_counted<fed_doorman>(mx, (std::int64_t{1} << 40) + next_id_++);
    links_.feed->set(d, &mx);
    return caf::io::doorman_ptr{d};
  }

 private:
  guarded_links links_;
  std::int64_t next_id_ = 0;
};

}  // namespace

caf::io::middleman_actor spawn_guarded_middleman(caf::actor_system& sys, guarded_links links) {
  auto basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<guarded_middleman, caf::detached + caf::hidden>(std::move(basp), std::move(links));
}

}  // namespace troupe::cluster
