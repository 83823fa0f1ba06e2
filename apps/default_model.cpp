#include "apps/default_model.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <system_error>

#ifndef TROUPE_INSTALL_DATADIR
#define TROUPE_INSTALL_DATADIR "/usr/local/share"
#endif

namespace troupe::app {
namespace fs = std::filesystem;

namespace {

std::string file_name() { return std::string(default_model_name) + ".gguf"; }

// The running binary's directory, from /proc/self/exe (argv[0] can be relative or a PATH lookup).
std::optional<fs::path> binary_dir() {
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return std::nullopt;
  return exe.parent_path();
}

}  // namespace

std::vector<fs::path> default_model_candidates() {
  std::vector<fs::path> out;
  if (const auto dir = binary_dir()) out.push_back((*dir / ".." / "share" / "troupe" / "models" / file_name()).lexically_normal());
  out.push_back(fs::path(TROUPE_INSTALL_DATADIR) / "troupe" / "models" / file_name());
  return out;
}

result<fs::path, std::string> find_default_model() {
  // An explicit TROUPE_DEFAULT_MODEL that names nothing is the user's mistake, not a reason to fall back.
  if (const char* env = std::getenv("TROUPE_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    std::error_code ec;
    if (fs::exists(env, ec)) return fs::path(env);
    return unexpected("TROUPE_DEFAULT_MODEL names " + std::string(env) + ", which does not exist");
  }
  const auto candidates = default_model_candidates();
  std::string looked;
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(c, ec)) return c;
    looked += "\n  " + c.string();
  }
  return unexpected("the embedded default model " + std::string(default_model_name) +
                    " is not installed; looked in:" + looked + "\npass --model, or set TROUPE_DEFAULT_MODEL");
}

result<std::string, std::string> model_or_default(const std::string& given, const char* command) {
  if (!given.empty()) return given;
  auto found = find_default_model();
  if (!found) return unexpected("troupe " + std::string(command) + ": no --model given and " + found.error());
  std::fprintf(stderr, "troupe %s: no --model given; using the embedded model %s (%s)\n", command, default_model_name,
               found->c_str());
  return found->string();
}

}  // namespace troupe::app
