// The NCCL backend where this build has no CUDA or no NCCL: no devices, and connecting is a typed
// refusal that says why (nccl_communicator.cpp is the real one).
#include "transport/collectives.hpp"

namespace troupe::transport {

int cuda_devices() { return 0; }

result<std::unique_ptr<communicator>, collective_error> connect_nccl(const nccl_options&) {
  return unexpected(collective_error{collective_error_code::connect_failed, "this build has no CUDA and NCCL (TROUPE_CUDA=OFF or not found)"});
}

}  // namespace troupe::transport
