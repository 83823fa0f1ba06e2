#include "engine/guide/automaton.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace troupe::guide {
namespace {
constexpr std::uint32_t unknown = 0xFFFFFFFFu;
}

struct automaton::index {
  std::unordered_map<std::uint64_t, std::uint32_t> nodes;  // pos << 32 | parent -> node id
  std::unordered_map<std::vector<std::uint32_t>, state, hash_vec> states;
  std::unordered_set<std::uint64_t> seen;  // scratch of one expansion
};

std::size_t automaton::hash_vec::operator()(const std::vector<std::uint32_t>& v) const noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (auto x : v) h = (h ^ x) * 1099511628211ull;
  return static_cast<std::size_t>(h ^ (h >> 29));
}

namespace {
std::uint32_t add_sat(std::uint32_t a, std::uint32_t b) {
  return a >= automaton::unreachable - b ? automaton::unreachable : a + b;
}
}  // namespace

automaton::automaton(std::shared_ptr<const grammar> g) : g_(std::move(g)), index_(std::make_unique<index>()) {
  // The fewest bytes each rule derives (a fixpoint), then per position the fewest to its alternative's end.
  const auto& gr = *g_;
  std::vector<std::uint32_t> rule_min(gr.alts.size(), unreachable);
  auto elem_min = [&](const element& e) { return e.k == element::kind::bytes ? 1u : e.k == element::kind::rule ? rule_min[e.index] : 0u; };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < gr.alts.size(); ++r)
      for (auto a : gr.alts[r]) {
        std::uint32_t sum = 0;
        for (auto p = a; gr.flat[p].k != element::kind::end; ++p) sum = add_sat(sum, elem_min(gr.flat[p]));
        if (sum < rule_min[r]) rule_min[r] = sum, changed = true;
      }
  }
  rest_min_.assign(gr.flat.size(), 0);
  for (std::size_t p = gr.flat.size(); p-- > 0;)
    rest_min_[p] = gr.flat[p].k == element::kind::end ? 0 : add_sat(elem_min(gr.flat[p]), rest_min_[p + 1]);
  init();
}

std::uint32_t automaton::node_cost(std::uint32_t n) {
  if (n == 0) return 0;
  if (node_cost_.size() < nodes_.size()) node_cost_.resize(nodes_.size(), unreachable - 1);
  if (node_cost_[n] != unreachable - 1) return node_cost_[n];
  const auto nd = nodes_[n];
  return node_cost_[n] = add_sat(rest_min_[nd.pos], node_cost(nd.parent));
}

std::uint32_t automaton::cost(state s) {
  if (s == dead) return unreachable;
  if (state_cost_.size() < stacks_.size()) state_cost_.resize(stacks_.size(), unreachable - 1);
  if (state_cost_[s] != unreachable - 1) return state_cost_[s];
  std::uint32_t best = unreachable;
  for (auto n : stacks_[s]) best = std::min(best, node_cost(n));
  return state_cost_[s] = best;
}
automaton::~automaton() = default;
automaton::automaton(automaton&&) noexcept = default;
automaton& automaton::operator=(automaton&&) noexcept = default;

void automaton::init() {
  node_cost_.clear();
  state_cost_.clear();
  nodes_.assign(1, node{0, 0});
  stacks_.assign(1, {});
  accepting_.assign(1, false);
  trans_.assign(256, dead);  // the dead state stays dead
  index_->nodes.clear();
  index_->states.clear();
  index_->states.emplace(std::vector<std::uint32_t>{}, dead);
  std::vector<std::uint32_t> out;
  index_->seen.clear();
  for (auto a : g_->alts[g_->root]) expand(a, 0, out);
  start_ = intern_state(std::move(out));
}

bool automaton::maybe_reset(std::size_t max_states, std::size_t max_nodes) {
  if (stacks_.size() <= max_states && nodes_.size() <= max_nodes) return false;
  ++generation_;
  init();
  return true;
}

std::uint32_t automaton::intern_node(std::uint32_t pos, std::uint32_t parent) {
  const auto key = (static_cast<std::uint64_t>(pos) << 32) | parent;
  auto [it, fresh] = index_->nodes.emplace(key, static_cast<std::uint32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

automaton::state automaton::intern_state(std::vector<std::uint32_t> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  auto it = index_->states.find(stacks);
  if (it != index_->states.end()) return it->second;
  const auto id = static_cast<state>(stacks_.size());
  const bool acc = !stacks.empty() && stacks.front() == 0;
  index_->states.emplace(stacks, id);
  stacks_.push_back(std::move(stacks));
  accepting_.push_back(acc);
  trans_.resize(trans_.size() + 256, unknown);
  return id;
}

// Every stack reachable from "resume at pos, then parent" without consuming a byte, as stacks whose top
// is a byte set (or the empty stack, 0). The grammar has no left recursion, so this ends; `seen` keeps a
// position reached twice in one expansion (common with nullable helpers) from being walked twice.
void automaton::expand(std::uint32_t pos, std::uint32_t parent, std::vector<std::uint32_t>& out) {
  const auto key = (static_cast<std::uint64_t>(pos) << 32) | parent;
  if (!index_->seen.insert(key).second) return;
  const auto& e = g_->flat[pos];
  switch (e.k) {
    case element::kind::end:
      if (parent == 0) {
        out.push_back(0);
      } else {
        const auto p = nodes_[parent];
        expand(p.pos, p.parent, out);
      }
      return;
    case element::kind::bytes:
      out.push_back(intern_node(pos, parent));
      return;
    case element::kind::rule: {
      // A reference closing its alternative resumes straight at the parent (a tail call), so right
      // recursion, the form every repetition takes, does not grow the stack.
      const auto cont = g_->flat[pos + 1].k == element::kind::end ? parent : intern_node(pos + 1, parent);
      for (auto a : g_->alts[e.index]) expand(a, cont, out);
      return;
    }
  }
}

automaton::state automaton::compute_next(state s, std::uint8_t byte) {
  std::vector<std::uint32_t> out;
  index_->seen.clear();
  // stacks_[s] may move while nodes are interned below: copy the few ids first.
  const auto stacks = stacks_[s];
  for (auto n : stacks) {
    if (n == 0) continue;
    const auto nd = nodes_[n];
    if (!g_->sets[g_->flat[nd.pos].index].test(byte)) continue;
    expand(nd.pos + 1, nd.parent, out);
  }
  const auto to = intern_state(std::move(out));
  trans_[static_cast<std::size_t>(s) * 256 + byte] = to;  // trans_ may have grown: index again
  return to;
}

automaton::state automaton::next(state s, std::string_view bytes) {
  for (char c : bytes) {
    if (s == dead) return dead;
    s = next(s, static_cast<std::uint8_t>(c));
  }
  return s;
}

bool matches(const grammar& g, std::string_view text) {
  automaton a(std::make_shared<const grammar>(g));
  return a.accepting(a.next(a.start(), text));
}

bool viable_prefix(const grammar& g, std::string_view text) {
  automaton a(std::make_shared<const grammar>(g));
  return a.next(a.start(), text) != automaton::dead;
}

}  // namespace troupe::guide
