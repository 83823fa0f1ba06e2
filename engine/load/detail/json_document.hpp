#pragma once
// JSON text from a checkpoint (a safetensors header, config.json, an index) parsed into a document
// after a checking pass that nlohmann's own parser does not make: a key given twice (which the parser
// would collapse to its last value), a key that is not valid UTF-8 (told apart from other syntax
// errors), and nesting deeper than any checkpoint needs (so walking the document cannot exhaust the
// stack). Private to the load layer: nlohmann types never appear in its public headers.
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/core/result.hpp"
#include "engine/load/load_error.hpp"

namespace troupe::load::detail {

inline constexpr std::size_t max_json_depth = 64;

// Errors name `file`; the item is the dotted path of the key at fault.
result<nlohmann::json, load_error> parse_json(std::string_view text, const std::string& file);

// "string", "integer", ... for messages.
std::string_view json_kind(const nlohmann::json& j);

}  // namespace troupe::load::detail
