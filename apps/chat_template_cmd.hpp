#pragma once
// `troupe chat-template --model PATH --messages FILE [--add-generation-prompt] [--tools FILE]
// [--kwargs JSON] [--template NAME] [--date YYYY-MM-DD[THH:MM]]`: renders a conversation with the model's
// chat template and prints the prompt text exactly (no newline added).
#include <string>

namespace troupe::app {

struct chat_template_options {
  std::string model;          // a model directory, a tokenizer_config.json or a GGUF file
  std::string messages;       // a JSON file holding the messages array; "-" for stdin
  std::string tools;          // a JSON file holding the tools array; empty: none
  std::string kwargs;         // a JSON object of extra template variables (enable_thinking, ...)
  std::string template_name;  // which of several named templates; empty: transformers' choice
  std::string date;           // what strftime_now prints; the current UTC time when empty
  bool add_generation_prompt = false;
};
int run_chat_template(const chat_template_options& opt);

}  // namespace troupe::app
