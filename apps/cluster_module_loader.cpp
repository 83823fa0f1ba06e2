// The binary's side of apps/cluster_module.hpp: finding and opening libtroupe-cluster.so.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

#include "apps/cluster_module.hpp"

#ifndef TROUPE_VERSION_STRING
#define TROUPE_VERSION_STRING "unknown"
#endif
#ifndef TROUPE_INSTALL_LIBDIR
#define TROUPE_INSTALL_LIBDIR "lib"
#endif

namespace troupe::app {
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> candidates() {
  std::vector<fs::path> out;
  if (const char* p = std::getenv("TROUPE_CLUSTER_MODULE"); p && *p) {
    out.emplace_back(p);
    return out;
  }
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return out;
  const auto dir = exe.parent_path();
  out.push_back(dir / cluster_module_file);                                              // a build tree
  out.push_back(dir.parent_path() / TROUPE_INSTALL_LIBDIR / "troupe" / cluster_module_file);  // an install
  return out;
}

struct opened {
  const cluster_module_api* api = nullptr;
  std::string error;
};

opened open_module() {
  opened o;
  for (const auto& path : candidates()) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      o.error += path.string() + ": not found; ";
      continue;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = ::dlerror();
      o.error += path.string() + ": " + (why ? why : "dlopen failed") + "; ";
      continue;
    }
    using entry_fn = const cluster_module_api* (*)();
    auto entry = reinterpret_cast<entry_fn>(::dlsym(h, cluster_module_symbol));
    const cluster_module_api expected;
    const cluster_module_api* api = entry ? entry() : nullptr;
    if (!api) {
      o.error += path.string() + ": no " + cluster_module_symbol + "; ";
    } else if (api->api_size != expected.api_size || api->options_size != expected.options_size || !api->version ||
               std::string(api->version) != TROUPE_VERSION_STRING) {
      o.error += path.string() + ": built from another version of troupe (" + (api->version ? api->version : "?") + "); ";
    } else {
      o.api = api;
      o.error.clear();
      return o;  // kept open for the life of the process
    }
    ::dlclose(h);
  }
  if (o.error.empty()) o.error = "no path to look in";
  return o;
}

}  // namespace

const cluster_module_api* cluster_module(std::string& error) {
  static std::once_flag once;
  static opened o;
  std::call_once(once, [] { o = open_module(); });
  error = o.error;
  return o.api;
}

}  // namespace troupe::app
