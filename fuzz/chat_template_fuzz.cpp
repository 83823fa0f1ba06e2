// Feeds arbitrary text to chat_template::parse as a template and renders what parses with fixed
// conversations and tight limits: no input may crash, hang, leak or exhaust the stack, and every
// failure must be a typed template_error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/text/chat_template.hpp"

namespace {

volatile std::size_t sink = 0;

constexpr std::string_view conversations[] = {
    R"([])",
    R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9\ud83d\ude00"},
        {"role": "assistant", "content": "<think>x</think>\n\nHello", "reasoning_content": null},
        {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": {"a": [1, 2.5, true, null]}}}]},
        {"role": "tool", "content": ""}, {"role": "user", "content": ["not", "a", "string"]}])",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = troupe::text::chat_template::parse(source);
  if (!tmpl) {
    sink = sink + tmpl.error().message.size() + tmpl.error().line;
    return 0;
  }
  troupe::text::chat_render_options options;
  options.date = troupe::text::jinja::calendar_time{2024, 7, 26, 14, 5};
  options.bos_token = "<s>";
  options.tools_json = R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  options.extra_json = R"({"enable_thinking": false})";
  // Small limits keep each run fast; they are what the fuzzer should hit instead of memory or time.
  options.limits.max_output_bytes = 1 << 16;
  options.limits.max_loop_iterations = 10'000;
  options.limits.max_recursion_depth = 200;
  for (const auto messages : conversations) {
    options.add_generation_prompt = !options.add_generation_prompt;
    auto out = tmpl->render(messages, options);
    sink = sink + (out ? out->size() : out.error().message.size());
  }
  return 0;
}
