#pragma once
// CAF's middleman behind the link guard (cluster/link_guard.hpp): a middleman actor whose connections
// are dialed through the guard (TLS, bounded framing) and whose published "port" listens on nothing:
// its doorman is fed by the guard's front, one loopback socket pair per authenticated link, so no
// socket CAF reads is reachable by another process. Everything else CAF's own middleman actor does
// (caching, handshakes, publishing) is unchanged.
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "cluster/link_guard.hpp"

namespace troupe::cluster {

class doorman_feed;  // hands authenticated links to the published doorman

struct guarded_links {
  std::shared_ptr<tls_context> tls;   // null: plain links (loopback and --insecure only)
  link_limits limits;
  std::chrono::milliseconds dial_deadline{10000};
  std::shared_ptr<doorman_feed> feed = make_feed();  // servers: what link_front's `inner` calls
  static std::shared_ptr<doorman_feed> make_feed();
};

// CAF's end of a new connection to the published actor; the returned socket is the guard's end (-1
// when nothing is published yet or the pair could not be made).
int feed_connection(doorman_feed& f);
// Lets go of the doorman (before the actor system goes): later connections get -1.
void close_feed(doorman_feed& f);

// The middleman actor to publish and connect with. Send it an exit before the actor system goes.
caf::io::middleman_actor spawn_guarded_middleman(caf::actor_system& sys, guarded_links links);

}  // namespace troupe::cluster
