#include "engine/exec/executor.hpp"

namespace troupe::exec {

std::string_view name(exec_error_code c) {
  switch (c) {
    case exec_error_code::unsupported: return "unsupported";
    case exec_error_code::missing_weight: return "missing_weight";
    case exec_error_code::bad_binding: return "bad_binding";
    case exec_error_code::index_out_of_range: return "index_out_of_range";
    case exec_error_code::unknown_id: return "unknown_id";
    case exec_error_code::state_conflict: return "state_conflict";
    case exec_error_code::device_error: return "device_error";
  }
  return "unknown";
}

std::string exec_error::message() const { return where + ": " + reason + " (" + std::string(name(code)) + ")"; }

}  // namespace troupe::exec
