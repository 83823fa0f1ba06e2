#pragma once
// JSON schemas to GBNF: the grammar's rule "root" accepts the JSON texts valid against the schema, in
// the subset OpenAI's strict mode, vLLM and llama.cpp's json-schema-to-grammar accept. It is a
// generator's grammar, not a validator: object properties come in their declared order, whitespace
// between tokens is bounded (llama.cpp's `space`), and a keyword troupe cannot honour exactly is refused
// as unsupported, naming it (json_schema.cpp lists every such choice). Not a JSON Schema validator.
#include <string>
#include <string_view>

#include "engine/core/result.hpp"
#include "engine/guide/guide_error.hpp"

namespace troupe::guide {

// GBNF text whose rule "root" accepts exactly the JSON texts valid against `schema_json` (JSON text).
result<std::string, guide_error> json_schema_to_gbnf(std::string_view schema_json);

// GBNF text for any JSON value whose top level is an object (OpenAI's response_format json_object).
std::string json_object_gbnf();

}  // namespace troupe::guide
