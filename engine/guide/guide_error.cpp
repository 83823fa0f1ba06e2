#include "engine/guide/guide_error.hpp"

namespace troupe::guide {

std::string_view name(guide_error_code code) {
  switch (code) {
    case guide_error_code::bad_grammar: return "bad_grammar";
    case guide_error_code::undefined_rule: return "undefined_rule";
    case guide_error_code::left_recursion: return "left_recursion";
    case guide_error_code::bad_regex: return "bad_regex";
    case guide_error_code::bad_schema: return "bad_schema";
    case guide_error_code::unsupported: return "unsupported";
    case guide_error_code::too_large: return "too_large";
  }
  return "unknown";
}

std::string guide_error::message() const {
  std::string m;
  if (!where.empty()) m += where + ": ";
  m += reason;
  m += " (";
  m += name(code);
  m += ")";
  return m;
}

}  // namespace troupe::guide
