#pragma once
// `troupe chat`: an interactive chat in the terminal with the model's own chat template. Each line read
// is a user turn; the answer streams as it is generated; the conversation is kept and re-rendered
// through the template every turn. `/reset` starts over, `/system TEXT` sets the system prompt, `/exit`
// (or the end of input) ends.
#include <cstdint>
#include <string>

namespace troupe::app {

struct chat_options {
  std::string model;
  std::string system;
  double temperature = 0.7;
  double top_p = 1.0;
  std::int64_t max_tokens = 512;  // per answer
  std::int64_t context = 4096;    // positions per conversation (clamped to the model's)
  std::uint64_t seed = 0;         // 0: a fresh one per session
  std::int64_t threads = 0;
};
int run_chat(const chat_options& opt);

}  // namespace troupe::app
