// Every test process writes its fixtures under temp_directory_path()/troupe...-<pid>[.ext], and ctest runs one
// test per process: without this each run of the suite left tens of gigabytes behind (a full disk after
// a few runs). Linked into every test binary (cmake/troupe.cmake); the directories of this process are
// removed when it exits. A directory another process must read is never named for a pid.
#include <unistd.h>

#include <filesystem>
#include <string>

namespace {

struct scratch_cleanup {
  ~scratch_cleanup() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto tmp = fs::temp_directory_path(ec);
    if (ec) return;
    const std::string suffix = "-" + std::to_string(::getpid());
    fs::directory_iterator it(tmp, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const auto name = it->path().filename().string(), stem = it->path().stem().string();
      if (name.starts_with("troupe") && (name.ends_with(suffix) || stem.ends_with(suffix))) {  // a directory, or a file like x-<pid>.gguf
        std::error_code rm;
        fs::remove_all(it->path(), rm);
      }
    }
  }
} const cleanup_at_exit;

}  // namespace
