#pragma once
// The one error type of the load layer: a checkpoint file (or config) could not be read, and why. The
// code is the failure class a caller may branch on; file, item (a tensor name or a metadata key) and
// reason are the specifics a person needs to find the bad byte.
#include <string>
#include <string_view>

namespace troupe::load {

enum class load_error_code {
  io,                   // the file could not be opened, mapped or written
  bad_magic,            // not the format it claims to be
  truncated_header,     // the file ends inside its header
  truncated_data,       // the file ends inside the tensor data the header describes
  header_too_large,     // a header length that runs past the file or past the format's limit
  bad_header,           // malformed header structure (JSON syntax, missing or extra fields, sizes)
  tensor_out_of_range,  // a tensor's bytes lie outside the data section
  tensor_overlap,       // two tensors share bytes
  shape_overflow,       // an element or byte count that does not fit in 64 bits
  unknown_dtype,        // a dtype code troupe does not know
  duplicate_name,       // a tensor name or metadata key given twice
  non_utf8_key,         // a tensor name or metadata key that is not valid UTF-8
  unsupported_version,  // a GGUF version other than 2 or 3
  bad_alignment,        // a GGUF alignment that is not a power of two, or a misaligned tensor offset
  bad_metadata,         // a metadata value of the wrong form
  missing_key,          // a config key that is absent
  wrong_type,           // a config key whose value has another type than asked for
  unsupported_quantization,  // a quantized checkpoint in a form troupe does not implement (the field named)
  bad_quantization,          // a quantized linear's stored tensors that disagree with each other or the config
  unsupported_adapter,       // a LoRA adapter in a form troupe does not implement (the field named)
  bad_adapter,               // a LoRA adapter whose tensors disagree with each other or with its config
};

std::string_view name(load_error_code code);

struct load_error {
  load_error_code code = load_error_code::io;
  std::string file;    // the path, or the name given to an in-memory parse
  std::string item;    // the tensor name or key at fault; empty when the fault is the file as a whole
  std::string reason;  // what is wrong, with the numbers involved

  // "model.gguf: 'blk.0.attn_q.weight': data [64, 128) ends past the data section of 96 bytes
  // (tensor_out_of_range)"
  std::string message() const;
};

}  // namespace troupe::load
