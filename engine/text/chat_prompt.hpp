#pragma once
// A conversation's prompt ids: the messages (and tools) rendered through the model's chat template with
// the generation prompt, the model's bos/eos strings given to the template, then encoded without adding
// special tokens (the template wrote the ones it wants). What the driver actor does for a chat job and
// `troupe chat` does for each turn.
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/chat_template.hpp"
#include "engine/text/text_codec.hpp"

namespace troupe::text {

// `messages_json`: an array of {role, content}; `tools_json`: an array of tool schemas, or empty.
result<std::vector<std::int32_t>, std::string> chat_prompt_ids(const text_codec& codec, const chat_template& tmpl,
                                                               std::string_view messages_json, std::string_view tools_json = {});

}  // namespace troupe::text
