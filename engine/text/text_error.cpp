#include "engine/text/text_error.hpp"

namespace troupe::text {

std::string_view name(text_error_code code) {
  switch (code) {
    case text_error_code::io: return "io";
    case text_error_code::bad_json: return "bad_json";
    case text_error_code::missing_field: return "missing_field";
    case text_error_code::unsupported: return "unsupported";
    case text_error_code::unknown_token: return "unknown_token";
    case text_error_code::bad_regex: return "bad_regex";
    case text_error_code::bad_value: return "bad_value";
    case text_error_code::bad_gguf: return "bad_gguf";
    case text_error_code::invalid_utf8: return "invalid_utf8";
  }
  return "unknown";
}

std::string text_error::message() const {
  std::string m = file.empty() ? std::string("<memory>") : file;
  m += ": ";
  if (!field.empty()) {
    m += '\'';
    m += field;
    m += "': ";
  }
  m += reason;
  m += " (";
  m += name(code);
  m += ')';
  return m;
}

}  // namespace troupe::text
