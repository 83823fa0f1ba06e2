#include "engine/load/load_error.hpp"

namespace troupe::load {

std::string_view name(load_error_code code) {
  switch (code) {
    case load_error_code::io: return "io";
    case load_error_code::bad_magic: return "bad_magic";
    case load_error_code::truncated_header: return "truncated_header";
    case load_error_code::truncated_data: return "truncated_data";
    case load_error_code::header_too_large: return "header_too_large";
    case load_error_code::bad_header: return "bad_header";
    case load_error_code::tensor_out_of_range: return "tensor_out_of_range";
    case load_error_code::tensor_overlap: return "tensor_overlap";
    case load_error_code::shape_overflow: return "shape_overflow";
    case load_error_code::unknown_dtype: return "unknown_dtype";
    case load_error_code::duplicate_name: return "duplicate_name";
    case load_error_code::non_utf8_key: return "non_utf8_key";
    case load_error_code::unsupported_version: return "unsupported_version";
    case load_error_code::bad_alignment: return "bad_alignment";
    case load_error_code::bad_metadata: return "bad_metadata";
    case load_error_code::missing_key: return "missing_key";
    case load_error_code::wrong_type: return "wrong_type";
    case load_error_code::unsupported_quantization: return "unsupported_quantization";
    case load_error_code::bad_quantization: return "bad_quantization";
    case load_error_code::unsupported_adapter: return "unsupported_adapter";
    case load_error_code::bad_adapter: return "bad_adapter";
  }
  return "unknown";
}

std::string load_error::message() const {
  std::string m = file.empty() ? std::string("<memory>") : file;
  m += ": ";
  if (!item.empty()) {
    m += '\'';
    m += item;
    m += "': ";
  }
  m += reason;
  m += " (";
  m += name(code);
  m += ')';
  return m;
}

}  // namespace troupe::load
