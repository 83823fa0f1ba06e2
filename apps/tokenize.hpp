#pragma once
// `troupe tokenize --tokenizer PATH [--no-special] (TEXT | --jsonl FILE)`: token ids as JSON arrays,
// from a tokenizer.json, a model directory or a GGUF file.
#include <string>

namespace troupe::app {

struct tokenize_options {
  std::string tokenizer;     // tokenizer.json, a model directory, or a .gguf file
  std::string text;          // the text to encode, when no jsonl file is given
  std::string jsonl;         // one JSON string per line; one JSON array of ids per line comes out
  bool no_special = false;   // add no bos/eos (Hugging Face's add_special_tokens=False)
};
int run_tokenize(const tokenize_options& opt);

}  // namespace troupe::app
