// TCP plumbing of the fronts (transport/sockets.hpp).
#include "transport/sockets.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::transport {

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6) ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

result<listener, std::string> listen_tcp(const std::string& host, int port, int backlog) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); e != 0)
    return unexpected("cannot resolve " + host + ": " + ::gai_strerror(e));
  listener l;
  std::string why = "no address";
  for (auto* a = res; a && l.fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
      l.fd = fd;
      sockaddr_storage s{};
      socklen_t len = sizeof s;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len);
      l.port = ntohs(s.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(s).sin6_port : reinterpret_cast<sockaddr_in&>(s).sin_port);
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (l.fd < 0) return unexpected("cannot listen on " + host + ":" + service + ": " + why);
  return l;
}

result<int, std::string> connect_tcp(const std::string& host, int port, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); e != 0) return unexpected("cannot resolve " + host + ": " + ::gai_strerror(e));
  int fd = -1;
  std::string why = "no address";
  for (auto* a = res; a && fd < 0; a = a->ai_next) {
    const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) continue;
    if (::connect(s, a->ai_addr, a->ai_addrlen) == 0) {
      fd = s;
      break;
    }
    if (errno == EINPROGRESS) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      pollfd p{s, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (left > 0 && ::poll(&p, 1, static_cast<int>(left)) == 1 && ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        fd = s;
        break;
      }
      why = err ? std::strerror(err) : "no answer in time";
    } else why = std::strerror(errno);
    ::close(s);
  }
  ::freeaddrinfo(res);
  if (fd < 0) return unexpected("cannot connect to " + host + ":" + service + ": " + why);
  set_no_delay(fd);
  return fd;
}

}  // namespace troupe::transport
