#pragma once
// What a request asks its output to be: the kind of guide and its source text. Plain values, cheap to
// include (the driver's request carries one; guide.hpp compiles it).
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::guide {

enum class guide_kind : std::uint8_t {
  none,
  json_object,  // any JSON object (OpenAI's response_format json_object); text unused
  json_schema,  // text: the schema, JSON
  regex,        // text: the pattern, matched in full
  grammar,      // text: GBNF, start rule "root"
  choice,       // text: a JSON array of strings, one of which is the whole output
};
std::string_view name(guide_kind kind);

struct guide_spec {
  guide_kind kind = guide_kind::none;
  std::string text;
  friend bool operator==(const guide_spec&, const guide_spec&) = default;
};

}  // namespace troupe::guide
