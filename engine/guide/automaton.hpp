#pragma once
// The matcher of a grammar: a pushdown automaton over bytes, run as llama.cpp runs its grammars (a set
// of stacks of grammar positions, each stack's top a byte set to match), made deterministic lazily.
// Stacks are persistent lists interned in a node table, so two equal stacks are one id; a set of stacks
// is interned as a state, and the transition of a state on a byte is computed once and kept. Inside a
// JSON string, say, every ordinary character leads back to the same state, so a token trie walk (the
// mask of a step) is mostly table lookups and a state's mask is itself cached by the caller.
//
// Tables grow with the distinct states a request meets (nesting depth makes new ones); past the bounds
// `maybe_reset` drops them all and bumps `generation`, and holders of state ids recompute theirs from
// their input. Not thread-safe: its owner (guide.hpp) serialises use.
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/guide/grammar.hpp"

namespace troupe::guide {

class automaton {
 public:
  using state = std::uint32_t;
  static constexpr state dead = 0;

  explicit automaton(std::shared_ptr<const grammar> g);

  state start() const { return start_; }
  state next(state s, std::uint8_t byte) {
    const auto t = trans_[static_cast<std::size_t>(s) * 256 + byte];
    return t != 0xFFFFFFFFu ? t : compute_next(s, byte);
  }
  state next(state s, std::string_view bytes);
  // The grammar's sentence may end here.
  bool accepting(state s) const { return accepting_[s]; }
  // The fewest bytes that complete a sentence from here (0 when accepting; `unreachable` when none can).
  static constexpr std::uint32_t unreachable = 0xFFFFFFFFu;
  std::uint32_t cost(state s);
  // Some byte continues from here.
  bool can_continue(state s) const { return !stacks_[s].empty() && !(stacks_[s].size() == 1 && accepting_[s]); }

  std::uint64_t generation() const { return generation_; }
  std::size_t states() const { return stacks_.size(); }
  // Drops every table when they hold more than the bounds; true when it did (generation changed). The
  // defaults hold a guide's tables near 20 MiB (a state's transitions are 1 KiB, a node ~40 bytes with
  // its index), whatever grammar a client sends.
  bool maybe_reset(std::size_t max_states = 1u << 13, std::size_t max_nodes = 1u << 18);
  std::size_t nodes() const { return nodes_.size(); }
  // The tables' size in bytes, roughly.
  std::size_t approx_bytes() const { return stacks_.size() * (256 * 4 + 64) + nodes_.size() * 40; }

  const grammar& source() const { return *g_; }

 private:
  struct node {
    std::uint32_t pos;     // the element to match next (a byte set of the flat form)
    std::uint32_t parent;  // the stack below: where to resume when this alternative ends; 0: none
  };
  std::shared_ptr<const grammar> g_;
  std::vector<node> nodes_;                      // 0 is the empty stack (the sentence may end)
  std::vector<std::vector<std::uint32_t>> stacks_;  // state -> sorted node ids; state 0 is dead (no stack)
  std::vector<bool> accepting_;
  std::vector<std::uint32_t> trans_;             // state * 256 + byte -> state; `unknown` not yet computed
  struct hash_vec {
    std::size_t operator()(const std::vector<std::uint32_t>& v) const noexcept;
  };
  struct index;
  std::unique_ptr<index> index_;
  state start_ = dead;
  std::uint64_t generation_ = 0;
  std::vector<std::uint32_t> rest_min_;   // flat position -> fewest bytes to the end of its alternative
  std::vector<std::uint32_t> node_cost_;  // node -> fewest bytes to empty the stack (memo)
  std::vector<std::uint32_t> state_cost_; // state -> min over its stacks (memo)

  std::uint32_t node_cost(std::uint32_t n);

  void init();
  state compute_next(state s, std::uint8_t byte);
  std::uint32_t intern_node(std::uint32_t pos, std::uint32_t parent);
  state intern_state(std::vector<std::uint32_t> stacks);
  void expand(std::uint32_t pos, std::uint32_t parent, std::vector<std::uint32_t>& out);

 public:
  ~automaton();
  automaton(automaton&&) noexcept;
  automaton& operator=(automaton&&) noexcept;
};

}  // namespace troupe::guide
