#pragma once
// The embedded default model: troupe-kjv, a 3.7M-parameter Llama trained by tools/train_default_model.py
// on the King James Bible (docs/default-model.md). The commands that take --model use it when --model is
// omitted. It is found, in order:
//   1. $TROUPE_DEFAULT_MODEL (a GGUF file or a Hugging Face directory), when set;
//   2. beside the binary: <dir of troupe>/../share/troupe/models/troupe-kjv.gguf (the installed layout,
//      and the build tree's: the build copies models/ there);
//   3. the install prefix troupe was configured with: <prefix>/share/troupe/models/troupe-kjv.gguf.
// Never through the source tree, so an installed troupe works with the source tree gone.
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/result.hpp"

namespace troupe::app {

inline constexpr const char* default_model_name = "troupe-kjv";

// The installed places searched, in order (2 and 3 above; TROUPE_DEFAULT_MODEL is checked before them).
std::vector<std::filesystem::path> default_model_candidates();

// The first candidate that exists, or a message naming every place looked at.
result<std::filesystem::path, std::string> find_default_model();

// `given` when not empty; otherwise the default model, with a line on stderr saying so (`command` names
// the subcommand in that line and in the error).
result<std::string, std::string> model_or_default(const std::string& given, const char* command);

}  // namespace troupe::app
