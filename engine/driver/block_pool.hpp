#pragma once
// The paged KV pool's bookkeeping and the prefix cache (the host side of the sequence store): a fixed
// number of blocks of `block_size` KV slots, each with a reference count. A full block of a sequence
// that carries no request inputs may be published under the hash of its token chain (the hash of the
// previous block's chain and this block's tokens); a later sequence whose prompt starts with the same
// chain finds it with `lookup` and shares it instead of computing it again. A published block whose
// count falls to zero stays cached and is evicted least-recently-used first when `allocate` finds no
// free block. Lookups compare the stored tokens and parent, so a hash collision is never a false hit.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace troupe::driver {

using block_id = std::int32_t;

// The chain hash of a block: parent is the previous block's hash (root_hash for the first block).
inline constexpr std::uint64_t root_hash = 0x9e3779b97f4a7c15ull;
std::uint64_t chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens);

struct block_pool_stats {
  std::int64_t lookups = 0;     // lookup calls
  std::int64_t hits = 0;        // lookups that found a block
  std::int64_t evictions = 0;   // cached blocks reused for new contents
  std::int64_t published = 0;   // blocks registered under a hash
};

class block_pool {
 public:
  // Every block starts free; allocate hands out block 0 first. A negative `blocks` or a `block_size`
  // below 1 gives an empty pool (0 blocks, block_size() = max(block_size, 0)): allocate always misses.
  block_pool(std::int32_t blocks, std::int32_t block_size);

  std::int32_t blocks() const { return static_cast<std::int32_t>(refs_.size()); }
  std::int32_t block_size() const { return block_size_; }
  // Blocks allocate() can hand out now: never used or released, plus cached blocks nobody references.
  std::int32_t available() const;
  // Blocks cached and unreferenced (evictable), for tests and counters.
  std::int32_t cached_idle() const;

  // A block with count 1 and no cached identity: a free block, else the least recently used idle
  // cached block (its hash is forgotten); nullopt when every block is referenced.
  std::optional<block_id> allocate();
  // Adds a reference to a block the caller already holds (count >= 1). Retaining a block with count
  // zero or an id outside the pool is a programming error (asserts; ignored when asserts are off).
  void retain(block_id b);
  // Drops one reference; at zero a published block becomes idle cached (most recently used), any
  // other returns to the free list. Releasing a block with count zero (or an id outside the pool) is a
  // programming error: it asserts, and when asserts are off it is ignored and nothing changes.
  void release(block_id b);
  std::int32_t refs(block_id b) const { return refs_[static_cast<std::size_t>(b)]; }

  // The cached block holding exactly this chain, retained for the caller (count + 1) and marked most
  // recently used (an idle block leaves the idle list; it rejoins as the most recent when its count
  // falls to zero again); nullopt on a miss. Every call counts in stats().lookups, a hit in .hits.
  std::optional<block_id> lookup(std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens);
  // Registers a full block (tokens.size() == block_size) under its chain; `hash` is the lookup key
  // (normally chain_hash(parent, tokens)) and is taken as given. When another block already holds
  // that chain, nothing changes and false is returned (the caller keeps its own private copy). Also
  // false, with nothing changed: a wrong token count, a block already published, or a block the
  // caller does not hold (count zero, or an id outside the pool).
  bool publish(block_id b, std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens);
  bool published(block_id b) const;  // false for an id outside the pool

  const block_pool_stats& stats() const { return stats_; }

 private:
  static constexpr block_id none = -1;
  // Per-block bookkeeping besides the count: the cached identity (meaningful while `published`) and
  // the links of the idle list (meaningful while `idle`). `tokens` keeps its capacity across reuse.
  struct slot {
    std::uint64_t hash = 0;
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;
    block_id prev = none;
    block_id next = none;
    bool published = false;
    bool idle = false;  // published, count zero, linked into the idle list
  };
  bool valid(block_id b) const { return b >= 0 && b < blocks(); }
  slot& at(block_id b) { return slots_[static_cast<std::size_t>(b)]; }
  const slot& at(block_id b) const { return slots_[static_cast<std::size_t>(b)]; }
  // Whether a published block holds exactly this chain.
  bool holds(block_id b, std::uint64_t parent, std::span<const std::int32_t> tokens) const;
  void forget(block_id b);          // drops b's identity and its hash entry
  void idle_push_back(block_id b);  // links b as the most recently used idle block
  void idle_unlink(block_id b);

  std::int32_t block_size_;
  std::vector<std::int32_t> refs_;
  std::vector<slot> slots_;
  std::vector<block_id> free_;                                // count zero, no identity (a stack)
  std::unordered_multimap<std::uint64_t, block_id> by_hash_;  // published blocks (collisions allowed)
  block_id idle_head_ = none;                                 // least recently used idle block
  block_id idle_tail_ = none;                                 // most recently used idle block
  std::int32_t idle_count_ = 0;
  block_pool_stats stats_;
};

}  // namespace troupe::driver
