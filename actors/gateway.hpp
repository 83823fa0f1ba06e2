#pragma once
// The OpenAI-compatible HTTP gateway over a cluster's client actors: /v1/chat/completions,
// /v1/completions (streaming with server-sent events or not), /v1/models, /health, /ready, /metrics.
// HTTP is Debian's cpp-httplib (libcpp-httplib-dev): a small, well-kept server with a thread pool,
// chunked responses for SSE and body size limits, and no framework around it; the gateway blocks only
// its own HTTP worker threads, never an actor.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/cluster.hpp"
#include "engine/core/result.hpp"

namespace troupe::actors {

struct gateway_options {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0: any free port (see gateway::port)
  std::vector<std::string> api_keys;       // empty: no authentication
  std::size_t max_body_bytes = 4 << 20;    // larger bodies get 413
  int http_threads = 128;                  // concurrent connections served (streams hold one each)
  int io_timeout_s = 30;                   // read/write timeout per connection
  std::int32_t max_n = 16;                 // choices per request
  int max_connections = 1024;              // open client connections, in all (the front refuses more: 503)
  int max_connections_per_client = 64;     // per client address
  int head_deadline_ms = 10000;            // a request's head must arrive within this (else 408)
  int body_deadline_ms = 30000;            // and its body within this after the head
};

// Reads an API key file: one key a line; blank lines and lines starting with '#' are skipped.
result<std::vector<std::string>, std::string> read_api_keys(const std::filesystem::path& file);

// Tool calls in a reply, in the Hermes format most chat templates use (<tool_call>{"name": ...,
// "arguments": {...}}</tool_call>, any number), or a reply that is one such JSON object: the text left
// outside them and the OpenAI tool_calls array as JSON (empty when there is none).
std::pair<std::string, std::string> parse_tool_calls(const std::string& text);

// Whether `host:port` can be listened on now (a port in use is refused by name): checked before
// anything is loaded, so a second server on a used port exits at once.
result<void, std::string> port_available(const std::string& host, int port);

// The chat page served at `/` (actors/chat_page.cpp): one static HTML document over the public API.
std::string_view chat_page();

struct gateway_state;

class gateway {
 public:
  // Serves `backend` (which must outlive the gateway) from a background thread; returns once bound.
  // `model` is read for its tokenizer only (token strings in logprobs); it may be empty.
  static result<std::unique_ptr<gateway>, std::string> start(serving_backend& backend, const std::filesystem::path& model,
                                                             gateway_options options);
  ~gateway();  // stops accepting, then waits for the server thread
  int port() const;
  // Blocks until stop() (from another thread or a signal handler's helper).
  void wait();
  void stop();

 private:
  explicit gateway(std::unique_ptr<gateway_state> s);
  std::unique_ptr<gateway_state> s_;
};

}  // namespace troupe::actors
