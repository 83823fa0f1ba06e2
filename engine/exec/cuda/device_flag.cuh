#pragma once
// The step flag's device side (kernels.hpp: step_flag), shared by the kernel files: the first
// refusal of a step wins and is read back with the outputs.
#include <cuda_runtime.h>

#include "engine/exec/cuda/kernels.hpp"

namespace troupe::exec::cuda {

__device__ __forceinline__ void raise_flag(step_flag* f, std::int32_t code, std::int32_t eqn, std::int64_t value, std::int64_t bound) {
  if (atomicCAS(&f->code, 0, -1) == 0) {  // the first refusal wins; -1 while its fields are written
    f->eqn = eqn;
    f->value = value;
    f->bound = bound;
    __threadfence();
    atomicExch(&f->code, code);
  }
}

}  // namespace troupe::exec::cuda
