#include "engine/driver/block_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace troupe::driver {
namespace {

using tokens_t = std::vector<std::int32_t>;

std::uint64_t hash_of(std::uint64_t parent, const tokens_t& t) { return chain_hash(parent, t); }

// The counts a pool reports, checked together so every step of a test pins both.
void expect_counts(const block_pool& pool, std::int32_t available, std::int32_t cached_idle, int line) {
  EXPECT_EQ(pool.available(), available) << "checked at line " << line;
  EXPECT_EQ(pool.cached_idle(), cached_idle) << "checked at line " << line;
}
#define EXPECT_COUNTS(pool, available, idle) expect_counts(pool, available, idle, __LINE__)

// Allocates, publishes under the chain (parent, tokens) and returns the block, still held.
block_id publish_new(block_pool& pool, std::uint64_t parent, const tokens_t& tokens) {
  const std::optional<block_id> b = pool.allocate();
  EXPECT_TRUE(b.has_value());
  if (!b) return -1;
  EXPECT_TRUE(pool.publish(*b, hash_of(parent, tokens), parent, tokens));
  return *b;
}

TEST(chain_hash, stable_and_sensitive_to_parent_and_every_token) {
  const tokens_t t{11, 22, 33, 44};
  const std::uint64_t h = chain_hash(root_hash, t);
  EXPECT_EQ(chain_hash(root_hash, t), h);
  EXPECT_EQ(chain_hash(root_hash, tokens_t{11, 22, 33, 44}), h);
  EXPECT_NE(chain_hash(root_hash + 1, t), h);
  EXPECT_NE(chain_hash(h, t), h);
  for (std::size_t i = 0; i < t.size(); ++i) {
    tokens_t u = t;
    u[i] += 1;
    EXPECT_NE(chain_hash(root_hash, u), h) << "token " << i;
    u[i] = -t[i];  // a sign flip changes the hash too
    EXPECT_NE(chain_hash(root_hash, u), h) << "token " << i;
  }
  EXPECT_NE(chain_hash(root_hash, tokens_t{11, 22, 33}), h);          // a prefix
  EXPECT_NE(chain_hash(root_hash, tokens_t{11, 22, 33, 44, 0}), h);   // a trailing zero
  EXPECT_NE(chain_hash(root_hash, tokens_t{22, 11, 33, 44}), h);      // order matters
  EXPECT_NE(chain_hash(root_hash, tokens_t{}), chain_hash(root_hash, tokens_t{0}));
  // Chaining: a second block hashed under the first block's hash differs from the same tokens at the root.
  EXPECT_NE(chain_hash(h, t), chain_hash(root_hash, t));
}

TEST(chain_hash, no_collisions_among_small_chains) {
  std::set<std::uint64_t> seen;
  int n = 0;
  for (std::uint64_t parent : {root_hash, std::uint64_t{0}, std::uint64_t{1}, ~std::uint64_t{0}}) {
    for (std::int32_t a = -8; a < 24; ++a) {
      for (std::int32_t b = 0; b < 32; ++b) {
        seen.insert(chain_hash(parent, tokens_t{a, b}));
        seen.insert(chain_hash(parent, tokens_t{a, b, a}));
        n += 2;
      }
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
}

TEST(block_pool, invalid_sizes_give_an_empty_pool) {
  for (auto [blocks, size] : {std::pair{0, 4}, std::pair{-3, 4}, std::pair{4, 0}, std::pair{4, -2}}) {
    block_pool pool(blocks, size);
    EXPECT_EQ(pool.blocks(), 0) << blocks << "x" << size;
    EXPECT_GE(pool.block_size(), 0);
    EXPECT_COUNTS(pool, 0, 0);
    EXPECT_FALSE(pool.allocate());
    EXPECT_FALSE(pool.published(0));
    EXPECT_FALSE(pool.publish(0, 1, root_hash, tokens_t(static_cast<std::size_t>(std::max(size, 0)), 1)));
    EXPECT_FALSE(pool.lookup(1, root_hash, tokens_t{}));
  }
  block_pool pool(3, 0);
  EXPECT_EQ(pool.block_size(), 0);
  block_pool ok(3, 16);
  EXPECT_EQ(ok.blocks(), 3);
  EXPECT_EQ(ok.block_size(), 16);
}

TEST(block_pool, allocate_until_exhausted_then_release_returns_blocks) {
  block_pool pool(4, 2);
  EXPECT_COUNTS(pool, 4, 0);
  for (block_id want = 0; want < 4; ++want) {
    const auto b = pool.allocate();
    ASSERT_TRUE(b);
    EXPECT_EQ(*b, want);  // block 0 first, then in order
    EXPECT_EQ(pool.refs(*b), 1);
    EXPECT_FALSE(pool.published(*b));
    EXPECT_COUNTS(pool, 3 - want, 0);
  }
  EXPECT_FALSE(pool.allocate());
  EXPECT_FALSE(pool.allocate());
  EXPECT_COUNTS(pool, 0, 0);

  pool.release(2);
  EXPECT_EQ(pool.refs(2), 0);
  EXPECT_COUNTS(pool, 1, 0);
  pool.release(0);
  EXPECT_COUNTS(pool, 2, 0);
  EXPECT_EQ(pool.allocate(), 0);  // the free list is a stack: the last released goes first
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_FALSE(pool.allocate());
  EXPECT_COUNTS(pool, 0, 0);
  EXPECT_EQ(pool.stats().evictions, 0);
}

TEST(block_pool, retain_and_release_count_references) {
  block_pool pool(2, 2);
  const block_id b = *pool.allocate();
  pool.retain(b);
  pool.retain(b);
  EXPECT_EQ(pool.refs(b), 3);
  EXPECT_COUNTS(pool, 1, 0);
  pool.release(b);
  EXPECT_EQ(pool.refs(b), 2);
  EXPECT_COUNTS(pool, 1, 0);
  pool.release(b);
  EXPECT_EQ(pool.refs(b), 1);
  EXPECT_COUNTS(pool, 1, 0);
  pool.release(b);
  EXPECT_EQ(pool.refs(b), 0);
  EXPECT_COUNTS(pool, 2, 0);  // unpublished: back on the free list, not cached
}

TEST(block_pool, release_or_retain_of_an_unheld_block_changes_nothing) {
  block_pool pool(2, 2);
  const block_id b = *pool.allocate();
  pool.release(b);
  EXPECT_DEBUG_DEATH(pool.release(b), "");
  EXPECT_DEBUG_DEATH(pool.retain(b), "");
  EXPECT_DEBUG_DEATH(pool.release(7), "");
  EXPECT_DEBUG_DEATH(pool.retain(-1), "");
  EXPECT_EQ(pool.refs(0), 0);
  EXPECT_EQ(pool.refs(1), 0);
  EXPECT_COUNTS(pool, 2, 0);
  // The free list was not corrupted: both blocks come out once each.
  const auto x = pool.allocate();
  const auto y = pool.allocate();
  ASSERT_TRUE(x && y);
  EXPECT_NE(*x, *y);
  EXPECT_FALSE(pool.allocate());
}

TEST(block_pool, publish_then_lookup_shares_the_block) {
  block_pool pool(4, 3);
  const tokens_t t{5, 6, 7};
  const std::uint64_t h = hash_of(root_hash, t);
  const block_id b = *pool.allocate();
  EXPECT_TRUE(pool.publish(b, h, root_hash, t));
  EXPECT_TRUE(pool.published(b));
  EXPECT_EQ(pool.stats().published, 1);
  EXPECT_COUNTS(pool, 3, 0);

  EXPECT_EQ(pool.lookup(h, root_hash, t), b);
  EXPECT_EQ(pool.refs(b), 2);
  EXPECT_EQ(pool.stats().lookups, 1);
  EXPECT_EQ(pool.stats().hits, 1);
  EXPECT_COUNTS(pool, 3, 0);

  // A child block chained under b's hash.
  const tokens_t u{8, 9, 10};
  const std::uint64_t hu = hash_of(h, u);
  const block_id c = *pool.allocate();
  EXPECT_TRUE(pool.publish(c, hu, h, u));
  EXPECT_EQ(pool.lookup(hu, h, u), c);
  EXPECT_EQ(pool.refs(c), 2);
  EXPECT_FALSE(pool.lookup(hu, root_hash, u));  // the same tokens under another parent
  EXPECT_COUNTS(pool, 2, 0);

  pool.release(b);
  EXPECT_COUNTS(pool, 2, 0);
  pool.release(b);  // count zero, published: cached and idle
  EXPECT_EQ(pool.refs(b), 0);
  EXPECT_TRUE(pool.published(b));
  EXPECT_COUNTS(pool, 3, 1);
  pool.release(c);
  pool.release(c);
  EXPECT_COUNTS(pool, 4, 2);

  EXPECT_EQ(pool.stats().lookups, 3);
  EXPECT_EQ(pool.stats().hits, 2);
  EXPECT_EQ(pool.stats().published, 2);
  EXPECT_EQ(pool.stats().evictions, 0);
}

TEST(block_pool, lookup_verifies_tokens_and_parent_so_collisions_miss) {
  block_pool pool(4, 2);
  const tokens_t t{1, 2};
  const std::uint64_t h = hash_of(root_hash, t);
  const block_id b = publish_new(pool, root_hash, t);

  EXPECT_FALSE(pool.lookup(h, root_hash, tokens_t{1, 3}));     // same hash, other tokens
  EXPECT_FALSE(pool.lookup(h, root_hash, tokens_t{2, 1}));
  EXPECT_FALSE(pool.lookup(h, root_hash + 1, t));              // same hash and tokens, other parent
  EXPECT_FALSE(pool.lookup(h + 1, root_hash, t));              // the right chain under another key
  EXPECT_FALSE(pool.lookup(h, root_hash, tokens_t{1}));        // a wrong length
  EXPECT_FALSE(pool.lookup(h, root_hash, tokens_t{1, 2, 3}));
  EXPECT_EQ(pool.refs(b), 1);
  EXPECT_EQ(pool.stats().lookups, 6);
  EXPECT_EQ(pool.stats().hits, 0);

  // A real collision: another chain published under the same key; each lookup finds its own block.
  const tokens_t other{3, 4};
  const block_id c = *pool.allocate();
  EXPECT_TRUE(pool.publish(c, h, root_hash, other));
  EXPECT_EQ(pool.lookup(h, root_hash, t), b);
  EXPECT_EQ(pool.lookup(h, root_hash, other), c);
  EXPECT_FALSE(pool.lookup(h, root_hash, tokens_t{4, 3}));
  EXPECT_EQ(pool.refs(b), 2);
  EXPECT_EQ(pool.refs(c), 2);
  EXPECT_EQ(pool.stats().lookups, 9);
  EXPECT_EQ(pool.stats().hits, 2);
  EXPECT_COUNTS(pool, 2, 0);

  // Evicting one of the colliding blocks leaves the other findable.
  pool.release(b);
  pool.release(b);
  EXPECT_COUNTS(pool, 3, 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), b);  // the free list is empty: b is evicted
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_FALSE(pool.published(b));
  EXPECT_FALSE(pool.lookup(h, root_hash, t));
  EXPECT_EQ(pool.lookup(h, root_hash, other), c);
  EXPECT_EQ(pool.refs(c), 3);
}

TEST(block_pool, idle_cached_blocks_are_evicted_lru_first_only_when_no_block_is_free) {
  block_pool pool(4, 2);
  const tokens_t ta{1, 1}, tb{2, 2}, tc{3, 3};
  const block_id a = publish_new(pool, root_hash, ta);
  const block_id b = publish_new(pool, root_hash, tb);
  const block_id c = publish_new(pool, root_hash, tc);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_COUNTS(pool, 1, 0);

  // Released in the order b, a, c: b is the least recently used.
  pool.release(b);
  EXPECT_COUNTS(pool, 2, 1);
  pool.release(a);
  EXPECT_COUNTS(pool, 3, 2);
  pool.release(c);
  EXPECT_COUNTS(pool, 4, 3);

  // The never-cached free block goes first; nothing is evicted.
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.stats().evictions, 0);
  EXPECT_COUNTS(pool, 3, 3);
  EXPECT_TRUE(pool.published(a) && pool.published(b) && pool.published(c));

  // Then the idle cached blocks, least recently used first; each forgets its chain.
  EXPECT_EQ(pool.allocate(), b);
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_FALSE(pool.published(b));
  EXPECT_EQ(pool.refs(b), 1);
  EXPECT_COUNTS(pool, 2, 2);
  EXPECT_FALSE(pool.lookup(hash_of(root_hash, tb), root_hash, tb));
  EXPECT_EQ(pool.stats().hits, 0);

  EXPECT_EQ(pool.allocate(), a);
  EXPECT_EQ(pool.stats().evictions, 2);
  EXPECT_FALSE(pool.lookup(hash_of(root_hash, ta), root_hash, ta));
  EXPECT_COUNTS(pool, 1, 1);

  // c is still cached and findable.
  EXPECT_EQ(pool.lookup(hash_of(root_hash, tc), root_hash, tc), c);
  EXPECT_COUNTS(pool, 0, 0);
  EXPECT_FALSE(pool.allocate());

  // The evicted block, never published again, returns to the free list, not the cache.
  pool.release(b);
  EXPECT_COUNTS(pool, 1, 0);
  // Its old chain can be published again by another block.
  EXPECT_TRUE(pool.publish(a, hash_of(root_hash, tb), root_hash, tb));
  pool.release(a);
  EXPECT_COUNTS(pool, 2, 1);
  EXPECT_EQ(pool.lookup(hash_of(root_hash, tb), root_hash, tb), a);
  EXPECT_EQ(pool.stats().evictions, 2);
}

TEST(block_pool, lookup_revives_an_idle_block_and_refreshes_its_recency) {
  block_pool pool(2, 2);
  const tokens_t ta{1, 2}, tb{3, 4};
  const block_id a = publish_new(pool, root_hash, ta);
  const block_id b = publish_new(pool, root_hash, tb);
  pool.release(a);
  pool.release(b);  // idle order: a (LRU), b
  EXPECT_COUNTS(pool, 2, 2);

  // Revived: referenced again, off the idle list, no longer evictable.
  EXPECT_EQ(pool.lookup(hash_of(root_hash, ta), root_hash, ta), a);
  EXPECT_EQ(pool.refs(a), 1);
  EXPECT_TRUE(pool.published(a));
  EXPECT_COUNTS(pool, 1, 1);
  EXPECT_EQ(pool.allocate(), b);  // only b may be evicted
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_COUNTS(pool, 0, 0);
  EXPECT_FALSE(pool.allocate());
  EXPECT_TRUE(pool.published(a));
  EXPECT_EQ(pool.lookup(hash_of(root_hash, ta), root_hash, ta), a);  // a second sharer
  EXPECT_EQ(pool.refs(a), 2);

  // Re-publish b's contents, then idle both; a is released last, so b is now the least recent.
  EXPECT_TRUE(pool.publish(b, hash_of(root_hash, tb), root_hash, tb));
  pool.release(a);
  EXPECT_COUNTS(pool, 0, 0);
  pool.release(b);
  EXPECT_COUNTS(pool, 1, 1);
  pool.release(a);
  EXPECT_COUNTS(pool, 2, 2);
  // Looking b up and releasing it again makes a the least recent.
  EXPECT_EQ(pool.lookup(hash_of(root_hash, tb), root_hash, tb), b);
  pool.release(b);
  EXPECT_EQ(pool.allocate(), a);
  EXPECT_FALSE(pool.lookup(hash_of(root_hash, ta), root_hash, ta));
  EXPECT_EQ(pool.lookup(hash_of(root_hash, tb), root_hash, tb), b);
  EXPECT_COUNTS(pool, 0, 0);
  EXPECT_EQ(pool.stats().evictions, 2);
  EXPECT_EQ(pool.stats().hits, 4);
  EXPECT_EQ(pool.stats().lookups, 5);
  EXPECT_EQ(pool.stats().published, 3);
}

TEST(block_pool, publish_refusals_change_nothing) {
  block_pool pool(4, 2);
  const tokens_t t{7, 8};
  const std::uint64_t h = hash_of(root_hash, t);
  const block_id a = *pool.allocate();
  const block_id b = *pool.allocate();

  EXPECT_FALSE(pool.publish(a, h, root_hash, tokens_t{7}));         // too short
  EXPECT_FALSE(pool.publish(a, h, root_hash, tokens_t{7, 8, 9}));   // too long
  EXPECT_FALSE(pool.publish(a, h, root_hash, tokens_t{}));
  EXPECT_FALSE(pool.published(a));
  EXPECT_EQ(pool.stats().published, 0);

  EXPECT_TRUE(pool.publish(a, h, root_hash, t));
  EXPECT_EQ(pool.stats().published, 1);
  EXPECT_FALSE(pool.publish(a, h, root_hash, t));                                       // already published
  EXPECT_FALSE(pool.publish(a, hash_of(root_hash, tokens_t{1, 1}), root_hash, tokens_t{1, 1}));  // under any chain
  EXPECT_FALSE(pool.publish(b, h, root_hash, t));                                       // chain held by a
  EXPECT_FALSE(pool.published(b));
  EXPECT_EQ(pool.stats().published, 1);
  EXPECT_EQ(pool.lookup(h, root_hash, t), a);  // a still holds it, under its original chain
  pool.release(a);

  // The duplicate is refused while the owner is idle in the cache, too.
  pool.release(a);
  EXPECT_COUNTS(pool, 3, 1);
  EXPECT_FALSE(pool.publish(b, h, root_hash, t));
  EXPECT_COUNTS(pool, 3, 1);

  // Blocks the caller does not hold, and ids outside the pool.
  EXPECT_FALSE(pool.publish(2, hash_of(root_hash, tokens_t{5, 5}), root_hash, tokens_t{5, 5}));  // free
  EXPECT_FALSE(pool.publish(-1, 1, root_hash, tokens_t{5, 5}));
  EXPECT_FALSE(pool.publish(4, 1, root_hash, tokens_t{5, 5}));
  EXPECT_FALSE(pool.published(-1));
  EXPECT_FALSE(pool.published(4));
  EXPECT_COUNTS(pool, 3, 1);
  EXPECT_EQ(pool.stats().published, 1);

  // The same tokens under another parent are another chain.
  EXPECT_TRUE(pool.publish(b, hash_of(h, t), h, t));
  EXPECT_EQ(pool.stats().published, 2);
}

// ---- a randomized check against a reference model ----

struct chain {
  std::uint64_t hash = 0;
  std::uint64_t parent = 0;
  tokens_t tokens;
  bool operator==(const chain&) const = default;
};

// The contract, written as plainly as possible: maps and a stack, linear scans.
struct reference_pool {
  explicit reference_pool(std::int32_t n) {
    for (block_id b = 0; b < n; ++b) refs[b] = 0;
    for (block_id b = n - 1; b >= 0; --b) free.push_back(b);
  }
  std::int32_t block_size = 2;
  std::map<block_id, std::int32_t> refs;
  std::vector<block_id> free;                    // a stack
  std::map<std::int64_t, block_id> idle;         // by release time, least recent first
  std::map<block_id, chain> ids;                 // published blocks
  std::int64_t clock = 0;
  block_pool_stats stats;

  bool is_idle(block_id b) const {
    for (const auto& [t, x] : idle) {
      if (x == b) return true;
    }
    return false;
  }
  void unidle(block_id b) {
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if (it->second == b) {
        idle.erase(it);
        return;
      }
    }
  }
  std::optional<block_id> allocate() {
    block_id b;
    if (!free.empty()) {
      b = free.back();
      free.pop_back();
    } else if (!idle.empty()) {
      b = idle.begin()->second;
      idle.erase(idle.begin());
      ids.erase(b);
      ++stats.evictions;
    } else {
      return std::nullopt;
    }
    refs[b] = 1;
    return b;
  }
  void retain(block_id b) { ++refs[b]; }
  void release(block_id b) {
    if (--refs[b] > 0) return;
    if (ids.contains(b)) {
      idle[clock++] = b;
    } else {
      free.push_back(b);
    }
  }
  std::optional<block_id> lookup(const chain& c) {
    ++stats.lookups;
    for (const auto& [b, id] : ids) {
      if (id == c) {
        unidle(b);
        ++refs[b];
        ++stats.hits;
        return b;
      }
    }
    return std::nullopt;
  }
  bool publish(block_id b, const chain& c) {
    if (refs[b] <= 0 || ids.contains(b) || c.tokens.size() != static_cast<std::size_t>(block_size)) return false;
    for (const auto& [x, id] : ids) {
      if (id == c) return false;
    }
    ids[b] = c;
    ++stats.published;
    return true;
  }
};

void expect_same(const block_pool& pool, const reference_pool& model, int step) {
  const std::int32_t n = pool.blocks();
  std::int32_t referenced = 0, free_count = 0, idle_count = 0;
  for (block_id b = 0; b < n; ++b) {
    const std::int32_t r = model.refs.at(b);
    ASSERT_EQ(pool.refs(b), r) << "block " << b << " step " << step;
    ASSERT_EQ(pool.published(b), model.ids.contains(b)) << "block " << b << " step " << step;
    const bool in_free = std::find(model.free.begin(), model.free.end(), b) != model.free.end();
    const bool idle = model.is_idle(b);
    // Exactly one state per block; never free (or idle) and referenced at once.
    ASSERT_EQ((r > 0) + in_free + idle, 1) << "block " << b << " step " << step;
    ASSERT_FALSE(in_free && model.ids.contains(b)) << "block " << b << " step " << step;
    ASSERT_EQ(idle, model.ids.contains(b) && r == 0) << "block " << b << " step " << step;
    referenced += r > 0;
    // What the pool shows from outside: an unreferenced block is free or idle by its identity.
    if (pool.refs(b) == 0) (pool.published(b) ? idle_count : free_count) += 1;
  }
  ASSERT_EQ(referenced + free_count + idle_count, n) << "step " << step;
  ASSERT_EQ(pool.cached_idle(), idle_count) << "step " << step;
  ASSERT_EQ(pool.available(), free_count + idle_count) << "step " << step;
  ASSERT_EQ(pool.cached_idle(), static_cast<std::int32_t>(model.idle.size())) << "step " << step;
  ASSERT_EQ(pool.available(), static_cast<std::int32_t>(model.free.size() + model.idle.size())) << "step " << step;
  ASSERT_EQ(pool.stats().lookups, model.stats.lookups) << "step " << step;
  ASSERT_EQ(pool.stats().hits, model.stats.hits) << "step " << step;
  ASSERT_EQ(pool.stats().evictions, model.stats.evictions) << "step " << step;
  ASSERT_EQ(pool.stats().published, model.stats.published) << "step " << step;
}

TEST(block_pool, random_operations_match_a_reference_model) {
  constexpr std::int32_t n = 16;
  block_pool pool(n, 2);
  reference_pool model(n);
  std::mt19937_64 rng(20240611);
  auto pick = [&](std::uint64_t k) { return rng() % k; };
  std::vector<block_id> held;  // one entry per reference the test holds

  // A small universe of chains; the key keeps only 2 bits of the hash, so most keys collide.
  auto random_chain = [&]() {
    chain c;
    const std::uint64_t parents[] = {root_hash, 1, 2};
    c.parent = parents[pick(3)];
    const std::size_t len = pick(10) == 0 ? (pick(2) ? 1 : 3) : 2;
    for (std::size_t i = 0; i < len; ++i) c.tokens.push_back(static_cast<std::int32_t>(pick(2)));
    c.hash = chain_hash(c.parent, c.tokens) & 3;
    return c;
  };

  std::int64_t refusals = 0, exhausted = 0;
  for (int step = 0; step < 10000; ++step) {
    const std::uint64_t op = pick(100);
    if (op < 25) {
      const auto got = pool.allocate();
      const auto want = model.allocate();
      ASSERT_EQ(got, want) << "step " << step;
      if (got) {
        held.push_back(*got);
      } else {
        ++exhausted;
      }
    } else if (op < 35) {
      if (held.empty()) continue;
      const block_id b = held[pick(held.size())];
      pool.retain(b);
      model.retain(b);
      held.push_back(b);
    } else if (op < 65) {
      if (held.empty()) continue;
      const std::size_t i = pick(held.size());
      const block_id b = held[i];
      held[i] = held.back();
      held.pop_back();
      pool.release(b);
      model.release(b);
    } else if (op < 80) {
      if (held.empty()) continue;
      const block_id b = held[pick(held.size())];
      const chain c = random_chain();
      const bool got = pool.publish(b, c.hash, c.parent, c.tokens);
      ASSERT_EQ(got, model.publish(b, c)) << "step " << step;
      refusals += !got;
    } else {
      const chain c = random_chain();
      const auto got = pool.lookup(c.hash, c.parent, c.tokens);
      ASSERT_EQ(got, model.lookup(c)) << "step " << step;
      if (got) held.push_back(*got);
    }
    expect_same(pool, model, step);
    if (HasFatalFailure()) return;
  }
  // The walk reached every path it means to check.
  EXPECT_GT(model.stats.hits, 100);
  EXPECT_GT(model.stats.evictions, 100);
  EXPECT_GT(refusals, 100);
  EXPECT_GT(exhausted, 10);

  // Everything released: every block is free or idle cached.
  for (block_id b : held) {
    pool.release(b);
    model.release(b);
  }
  expect_same(pool, model, -1);
  EXPECT_EQ(pool.available(), n);
}

}  // namespace
}  // namespace troupe::driver
