#pragma once
// Constrained decoding: a request's guide (a JSON schema, free-form JSON, a regular expression, a GBNF
// grammar or a list of choices) compiled once to a byte-level grammar, run by a lazily determinised
// pushdown automaton (automaton.hpp), and turned into the allowed-token mask of each step by walking a
// trie of the model's vocabulary (every token's bytes as the detokenizer emits them). The driver's
// guided-decoding hook calls the guide's function while the forward pass runs; the sampling head applies
// the mask. The end-of-generation ids are allowed exactly where the grammar accepts.
//
// Costs: a mask is one walk of the trie pruned at dead states, with transitions cached per state, and
// is itself cached per automaton state, so the steps inside a JSON string or a repeated structure cost
// a lookup. No Debian package offers this (xgrammar, llguidance and outlines-core are not packaged);
// the design follows llama.cpp's stacks and the published token-trie approach, code of our own.
#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/guide/automaton.hpp"
#include "engine/guide/grammar.hpp"
#include "engine/guide/guide_error.hpp"
#include "engine/guide/spec.hpp"

namespace troupe::text {
class tokenizer;
}

namespace troupe::guide {

// The GBNF text of a spec (validating it), and its compiled grammar.
result<std::string, guide_error> to_gbnf(const guide_spec& spec);
result<std::shared_ptr<const grammar>, guide_error> compile(const guide_spec& spec);

// The model's vocabulary as bytes: what each token adds to the output text.
class vocabulary {
 public:
  // `size`: the logits' width (ids at or past the tokenizer's end are never allowed). `pieces[id]`: the
  // bytes a token adds after the first one; nullopt where the token may never be drawn under a guide (a
  // special or control token, an empty piece). `first`: tokens that add other bytes as the first token of
  // an output (a decoder stripping the text's leading space). `eos`: the end-of-generation ids.
  vocabulary(std::size_t size, std::vector<std::optional<std::string>> pieces,
             std::vector<std::pair<std::int32_t, std::string>> first, std::vector<std::int32_t> eos);
  // From a tokenizer's stream pieces (special tokens excluded).
  static vocabulary of(const text::tokenizer& tok, std::size_t size, std::vector<std::int32_t> eos);

  std::size_t size() const { return size_; }
  std::size_t words() const { return (size_ + 31) / 32; }
  const std::optional<std::string>& piece(std::int32_t id) const;
  const std::string* first_piece(std::int32_t id) const;  // nullptr: the same as piece(id)
  const std::vector<std::int32_t>& eos() const { return eos_; }
  bool is_eos(std::int32_t id) const;
  std::size_t longest_piece() const { return longest_; }
  const std::vector<std::pair<std::int32_t, std::string>>& first_pieces() const { return first_; }

  // The trie of every allowed piece: node 0 is the root.
  struct trie_node {
    std::uint32_t edges_begin = 0, edges_end = 0;    // into edges
    std::uint32_t tokens_begin = 0, tokens_end = 0;  // into tokens: ids whose piece ends here
  };
  struct trie_edge {
    std::uint8_t byte = 0;
    std::uint32_t child = 0;
  };
  const std::vector<trie_node>& nodes() const { return nodes_; }
  const std::vector<trie_edge>& edges() const { return edges_; }
  const std::vector<std::int32_t>& tokens() const { return tokens_; }

 private:
  std::size_t size_ = 0;
  std::vector<std::optional<std::string>> pieces_;
  std::vector<std::pair<std::int32_t, std::string>> first_;
  std::unordered_map<std::int32_t, std::size_t> first_index_;
  std::vector<std::int32_t> eos_;
  std::size_t longest_ = 0;
  std::vector<trie_node> nodes_;
  std::vector<trie_edge> edges_;
  std::vector<std::int32_t> tokens_;
};

// One compiled guide over one vocabulary, shared by the sequences that ask for the same spec. Thread-safe.
class guide {
 public:
  guide(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> vocab);

  // A sequence's place in the guide, advanced incrementally by fill_mask.
  struct cursor {
    std::uint64_t generation = ~0ull;
    automaton::state state = automaton::dead;
    std::size_t consumed = 0;
    std::vector<std::int32_t> seen;  // the tokens consumed: an output that differs (rolled back) restarts
  };
  // The mask of the next token after `output` (the tokens generated so far): ceil(size / 32) words,
  // bit t % 32 of word t / 32 allows token t. Words past the vocabulary's stay as given. `budget`: the
  // tokens the sequence may still draw, this one included; when it runs short, only tokens after which
  // the sentence can still be completed within the rest are allowed (counting a byte per token, which
  // byte-level and byte-fallback vocabularies can always spell), so an output cut by max_tokens is
  // still complete whenever the budget allows any completion.
  void fill_mask(cursor& c, std::span<const std::int32_t> output, std::span<std::uint32_t> mask,
                 std::int64_t budget = std::numeric_limits<std::int64_t>::max());
  // The output's text (eos ids aside) is a whole sentence of the grammar.
  bool accepts(std::span<const std::int32_t> output);

  struct counters {
    std::int64_t masks = 0;         // masks asked for
    std::int64_t mask_hits = 0;     // answered from the per-state cache
    std::int64_t states = 0;        // automaton states so far
  };
  counters stats() const;
  // Memory held by the automaton's tables and the cached masks, roughly.
  std::size_t approx_bytes() const;
  // Bound on the cached masks of one guide.
  static constexpr std::size_t max_mask_bytes = 16u << 20;

 private:
  mutable std::mutex mu_;
  automaton a_;
  std::shared_ptr<const vocabulary> vocab_;
  struct cached_mask {
    std::vector<std::uint32_t> words;
    std::uint32_t max_next_cost = 0;  // the largest completion cost after any allowed token
  };
  std::unordered_map<automaton::state, cached_mask> masks_;
  std::optional<cached_mask> first_mask_;
  counters counters_;

  void advance(cursor& c, std::span<const std::int32_t> output);
  // `limit`: the largest completion cost a token may leave (unreachable: no limit).
  cached_mask compute_mask(automaton::state s, bool first, std::uint32_t limit);
};

// The driver's guided-decoding hook for one sequence (a fresh cursor over a shared guide) that may
// draw `max_tokens` tokens in all.
std::function<void(std::span<const std::int32_t>, std::span<std::uint32_t>)> hook(
    std::shared_ptr<guide> g, std::int64_t max_tokens = std::numeric_limits<std::int64_t>::max());

// Guides of one vocabulary by spec. The least recently used guide no sequence holds is dropped past
// `capacity` guides or `max_bytes` of tables and masks in all, so clients sending many large grammars
// cannot grow a driver's memory without bound (guides in use are bounded each by their own tables'
// limits). Thread-safe.
class guide_cache {
 public:
  explicit guide_cache(std::shared_ptr<const vocabulary> vocab, std::size_t capacity = 32, std::size_t max_bytes = 256u << 20);
  std::size_t size() const;
  result<std::shared_ptr<guide>, guide_error> get(const guide_spec& spec);
  const std::shared_ptr<const vocabulary>& vocab() const { return vocab_; }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const vocabulary> vocab_;
  std::size_t capacity_;
  std::size_t max_bytes_;
  std::list<std::pair<guide_spec, std::shared_ptr<guide>>> lru_;
};

}  // namespace troupe::guide
