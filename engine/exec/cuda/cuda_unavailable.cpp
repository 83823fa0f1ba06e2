// The CUDA target's factory in a build without nvcc: refuses by name.
#include "engine/exec/cuda/cuda_executor.hpp"

namespace troupe::exec::cuda {

namespace {
const char* const why = "this build of troupe has no CUDA target (nvcc was not found when it was configured; TROUPE_CUDA=ON requires it)";
}

result<std::vector<device_info>, std::string> devices() { return unexpected(std::string(why)); }

result<std::unique_ptr<executor>, exec_error> make_executor(const cuda_options&) {
  return unexpected(exec_error{exec_error_code::device_error, "cuda", why});
}

result<double, std::string> copy_bandwidth(int, std::size_t, int) { return unexpected(std::string(why)); }

}  // namespace troupe::exec::cuda
