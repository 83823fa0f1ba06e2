// Byte sizes as the command line takes them (node --device-memory, plan --node).
#include <cstdlib>

#include "apps/cluster_cmd.hpp"

namespace troupe::app {

// "16GiB", "512MiB", "2000000" -> bytes.
std::optional<std::uint64_t> parse_bytes(const std::string& t) {
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || v < 0) return std::nullopt;
  const std::string unit(end);
  double scale = 1;
  if (unit == "KiB") scale = 1024.0;
  else if (unit == "MiB") scale = 1024.0 * 1024;
  else if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") return std::nullopt;
  return static_cast<std::uint64_t>(v * scale);
}

}  // namespace troupe::app
