#pragma once
// The gateway's front: what listens on the gateway's public address. httplib 0.11 (Debian's compiled
// library) keeps every header a client sends, waits as long as a slow client keeps trickling bytes and
// serves /health from the same thread pool as the streams, so a hostile client could exhaust it. The
// front takes each connection first: a request reaches httplib (on a loopback port of its own) only
// once its head is complete within a deadline and within bounds (header count, head size, one line's
// size), and once its body (a Content-Length; chunked bodies are refused) has arrived whole within a
// deadline. Connections are capped in all and per client address. A connection whose first request is
// /health, /ready or /metrics goes to a reserved lane (a second small httplib pool), so probes are
// answered while every stream slot is taken. Responses pass through untouched (SSE streams as they
// come).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/result.hpp"

namespace troupe::actors {

struct http_limits {
  int max_connections = 1024;             // in all; past it a connection gets 503 and is closed
  int max_connections_per_client = 64;    // per client address
  int max_headers = 100;                  // past it: 431
  std::size_t max_head_bytes = 64 << 10;  // the request line and headers; past it: 431
  std::size_t max_line_bytes = 8 << 10;   // one header line; past it: 431
  std::size_t max_body_bytes = 4 << 20;   // past it: 413, without reading the body
  std::chrono::milliseconds head_deadline{10000};  // from a request's first byte to its blank line: else 408
  std::chrono::milliseconds body_deadline{30000};  // from the head to the body's last byte: else 408
  std::chrono::milliseconds idle_timeout{120000};  // no byte either way for this long: closed
};

struct http_front_counters {
  std::uint64_t accepted = 0, refused_connections = 0, too_many_headers = 0, head_too_large = 0, timed_out = 0, body_too_large = 0,
                chunked = 0, forwarded = 0, lane = 0,
                evicted = 0;  // closed before their first request head to make room for a newer connection
  std::int64_t open = 0;
};

class http_front {
 public:
  // Listens on host:port (0: any free port) and forwards to 127.0.0.1:main_port, or to
  // 127.0.0.1:lane_port for connections that open with a probe.
  static result<std::unique_ptr<http_front>, std::string> start(const std::string& host, int port, int main_port, int lane_port, http_limits limits);
  ~http_front();  // stops accepting and closes every connection
  int port() const;
  http_front_counters counters() const;

  struct impl;

 private:
  explicit http_front(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

}  // namespace troupe::actors
