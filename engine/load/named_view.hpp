#pragma once
// A tensor as a checkpoint names it: the name stored in the file and a view of its bytes. Readers hand
// these out in file order; writers take a list of them.
#include <string>

#include "engine/core/tensor.hpp"

namespace troupe::load {

struct named_view {
  std::string name;
  tensor_view view;
};

}  // namespace troupe::load
