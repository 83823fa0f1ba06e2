#pragma once
// `troupe inspect --model PATH`: the checkpoint's format, configuration summary, tensors and formats.
#include <string>

namespace troupe::app {

struct inspect_options {
  std::string model;
  bool json = false;
};
int run_inspect(const inspect_options& opt);

// `troupe selfcheck`: the end-to-end path of the foundation layers on a generated checkpoint.
struct selfcheck_options {
  std::string dir;  // where to write the checkpoints; a temporary directory when empty
  bool keep = false;
};
int run_selfcheck(const selfcheck_options& opt);

}  // namespace troupe::app
