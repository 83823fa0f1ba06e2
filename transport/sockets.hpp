#pragma once
// TCP plumbing both fronts use (the cluster's link guard, the gateway's HTTP front): a listening
// socket, a connect with a deadline, a peer's address as text.
#include <chrono>
#include <string>

#include "engine/core/result.hpp"

namespace troupe::transport {

struct listener {
  int fd = -1;
  int port = 0;  // the bound port (what port 0 picked)
};
// Binds and listens on host:port (SO_REUSEADDR, no SO_REUSEPORT: a used port is refused).
result<listener, std::string> listen_tcp(const std::string& host, int port, int backlog = 1024);
// A connected non-blocking socket with TCP_NODELAY, within `deadline`, or why not.
result<int, std::string> connect_tcp(const std::string& host, int port, std::chrono::milliseconds deadline);
void set_nonblocking(int fd);
void set_no_delay(int fd);
// The numeric address of an accepted peer (IPv4 or IPv6), "?" otherwise.
std::string peer_address(int fd);

}  // namespace troupe::transport
