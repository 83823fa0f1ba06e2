#pragma once
// The one error type of the text layer: a tokenizer file (tokenizer.json, tokenizer_config.json or a
// GGUF's tokenizer keys) could not be turned into a tokenizer, or a text could not be encoded. The code
// is the failure class a caller may branch on; file and field say where (a JSON path such as
// "model.merges[12]" or a GGUF key), reason says what is wrong.
#include <string>
#include <string_view>

namespace troupe::text {

enum class text_error_code {
  io,                 // the file could not be read
  bad_json,           // not JSON, or JSON of the wrong shape (a field of the wrong type)
  missing_field,      // a field the tokenizer cannot do without (the vocab, a model type)
  unsupported,        // a model, normalizer, pre-tokenizer, post-processor or decoder type troupe lacks
  unknown_token,      // a merge, special token or template naming a token the vocabulary lacks
  bad_regex,          // a pattern PCRE2 refuses; the reason holds PCRE2's message and offset
  bad_value,          // a field whose value is out of range or inconsistent with another
  bad_gguf,           // GGUF tokenizer metadata of the wrong form
  invalid_utf8,       // a text to encode that is not valid UTF-8
};

std::string_view name(text_error_code code);

struct text_error {
  text_error_code code = text_error_code::io;
  std::string file;    // the path, or the name given to an in-memory parse
  std::string field;   // the JSON path or GGUF key at fault; empty when the fault is the file as a whole
  std::string reason;  // what is wrong

  // "tokenizer.json: 'model.merges[3]': merge names 'xq' which is not in the vocabulary (unknown_token)"
  std::string message() const;
};

}  // namespace troupe::text
