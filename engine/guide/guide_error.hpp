#pragma once
// The one error type of the constrained-decoding layer (engine/guide): a grammar, regular expression or
// JSON schema that cannot be turned into a guide. The code is the class a caller branches on (all of
// them are the request's fault: the HTTP API answers 400); `where` points into the source (a rule name,
// a JSON pointer such as "/properties/age", a byte offset "at 12"), `reason` says what is wrong.
#include <string>
#include <string_view>

namespace troupe::guide {

enum class guide_error_code {
  bad_grammar,     // GBNF text that does not parse
  undefined_rule,  // a grammar names a rule it never defines
  left_recursion,  // a rule that can reach itself without consuming a byte (the matcher would not end)
  bad_regex,       // a regular expression that does not parse
  bad_schema,      // a JSON schema that is not JSON or has a keyword of the wrong shape
  unsupported,     // a well-formed construct troupe does not honour (named, never silently dropped)
  too_large,       // a source or its compiled form past the bounds (bytes, rules, repetition counts)
};

std::string_view name(guide_error_code code);

struct guide_error {
  guide_error_code code = guide_error_code::bad_grammar;
  std::string where;
  std::string reason;

  // "json_schema '/properties/age': minimum must be a number (bad_schema)"
  std::string message() const;
};

}  // namespace troupe::guide
