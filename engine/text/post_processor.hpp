#pragma once
// A post-processor adds the special tokens a model expects around an encoded text (add_special_tokens):
// a template ($A between fixed tokens: TemplateProcessing, and the fixed forms RobertaProcessing and
// BertProcessing take). ByteLevel post-processing only trims offsets, which troupe does not keep, so it
// adds nothing. troupe encodes single sequences, so only a template's single-sequence form is kept; a
// Sequence of processors applies each template in turn.
#include <vector>

#include "engine/text/token_id.hpp"

namespace troupe::text {

// One element of a template: fixed ids, or the encoded sequence itself.
struct template_piece {
  bool sequence = false;
  std::vector<token_id> ids;  // when not the sequence
};

using token_template = std::vector<template_piece>;

class post_processor {
 public:
  void add(token_template t) { templates_.push_back(std::move(t)); }
  bool empty() const { return templates_.empty(); }
  std::vector<token_id> apply(std::vector<token_id> ids) const;
  // The ids every template puts before / after the sequence, in order (for a caller that must know
  // whether a bos is added).
  std::vector<token_id> prefix() const;
  std::vector<token_id> suffix() const;

 private:
  std::vector<token_template> templates_;
};

}  // namespace troupe::text
