#pragma once
// What the gateway reads from a request and how it answers a refusal: OpenAI-style errors, the
// parameter checks that name their field, the sampling, stop, guide and tool-choice fields read into a
// job, and the tool-call parser of model replies. Private to actors/ (gateway.cpp and gateway_request.cpp).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "transport/messages.hpp"

namespace troupe::actors::detail {

using json = nlohmann::json;

// An OpenAI-style error body.
struct api_error {
  int status = 400;
  std::string message;
  std::string param;
  std::string code;
  std::string type = "invalid_request_error";
};

// Parameter checks, each naming its field.
struct params {
  const json& body;
  std::optional<api_error> err;

  void fail(std::string field, std::string why) {
    if (!err) err = api_error{400, "'" + field + "': " + why, field, "invalid_parameter"};
  }
  template <class T>
  std::optional<T> number(const char* field, double lo, double hi) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) {
      fail(field, "must be a number");
      return std::nullopt;
    }
    const double v = it->get<double>();
    if (!(v >= lo && v <= hi) || (std::is_integral_v<T> && v != std::floor(v))) {
      fail(field, "must be " + std::string(std::is_integral_v<T> ? "an integer" : "a number") + " in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
      return std::nullopt;
    }
    return static_cast<T>(v);
  }
  // Up to 16 strings into `out`: an array of them, or (`one_ok`) a lone string.
  void strings(const char* field, bool one_ok, std::vector<std::string>& out) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return;
    const std::string want = one_ok ? "must be a string or an array of up to 16 strings" : "must be an array of up to 16 strings";
    if (one_ok && it->is_string()) return out.push_back(it->get<std::string>());
    if (!it->is_array() || it->size() > 16 || !std::all_of(it->begin(), it->end(), [](const json& x) { return x.is_string(); }))
      return fail(field, want);
    for (const auto& x : *it) out.push_back(x.get<std::string>());
  }
  std::optional<bool> boolean(const char* field) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) {
      fail(field, "must be a boolean");
      return std::nullopt;
    }
    return it->get<bool>();
  }
};

struct request_plan {
  transport::job_submit job;
  std::int32_t n = 1;
  bool stream = false;
  bool include_usage = false;
  std::int32_t logprobs = -1;  // completions: top alternatives (-1: none); chat: top_logprobs when logprobs
  bool tools = false;
};

// JSON text; invalid UTF-8 (a token string that is a lone byte) becomes U+FFFD instead of throwing.
std::string dump(const json& j);
std::string error_body(const api_error& e);
api_error from_transport(const transport::error& e);
// RFC 4648 base64, for embeddings sent as bytes.
std::string base64_of(const std::string& bytes);
// A seed for a request that named none: 53 bits, so a JavaScript client reads it back exactly.
std::uint64_t fresh_seed();
// The sampling and stop fields shared by both completion endpoints.
void read_common(params& p, request_plan& plan);
// A constrained output (response_format, guided_*, grammar, json_schema), compiled to check it.
void read_guide(params& p, transport::job_submit& j, std::string_view raw_body);
// tool_choice: "required" or a named function force a call in the model's format.
void read_tool_choice(params& p, transport::job_submit& j, std::string_view chat_template);
std::string finish_of(const std::string& r);
// JSON from the model's output, discarded past the nesting bound.
json parse_bounded(const std::string& text);
// Tool calls in a reply: the text outside them and the OpenAI tool_calls array.
std::pair<std::string, json> parse_tool_calls_json(const std::string& text);
// Where, at or after `from`, `text` could begin a tool call.
std::size_t call_start(const std::string& text, std::size_t from);

}  // namespace troupe::actors::detail
