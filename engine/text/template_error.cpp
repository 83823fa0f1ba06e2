#include "engine/text/template_error.hpp"

namespace troupe::text {

std::string_view name(template_error_code code) {
  switch (code) {
    case template_error_code::syntax_error: return "syntax_error";
    case template_error_code::unknown_filter: return "unknown_filter";
    case template_error_code::unknown_test: return "unknown_test";
    case template_error_code::type_error: return "type_error";
    case template_error_code::undefined_call: return "undefined_call";
    case template_error_code::raise_exception: return "raise_exception";
    case template_error_code::output_limit: return "output_limit";
    case template_error_code::loop_limit: return "loop_limit";
    case template_error_code::recursion_limit: return "recursion_limit";
    case template_error_code::invalid_input: return "invalid_input";
  }
  return "unknown";
}

std::string template_error::describe() const {
  std::string out;
  if (line > 0) out = std::to_string(line) + ":" + std::to_string(column) + ": ";
  out += message;
  out += " (";
  out += name(code);
  out += ")";
  return out;
}

}  // namespace troupe::text
