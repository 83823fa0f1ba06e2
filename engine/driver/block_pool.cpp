#include "engine/driver/block_pool.hpp"

#include <algorithm>
#include <cassert>

namespace troupe::driver {

namespace {

// The splitmix64 finalizer: a bijection on 64 bits with full avalanche.
constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// FNV-style chaining (fold one token in, then scramble) with a strong finalizer per step, and the
// length folded in last so chains of different lengths differ even when one is a prefix of the other.
// Tokens are read as their 32-bit pattern, so the result does not depend on sign extension.
std::uint64_t chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  std::uint64_t h = mix(parent ^ 0xcbf29ce484222325ull);  // FNV-1a offset basis as a domain tag
  for (std::int32_t t : tokens) h = mix((h ^ static_cast<std::uint32_t>(t)) * 0x100000001b3ull);
  return mix(h ^ (static_cast<std::uint64_t>(tokens.size()) << 32));
}

block_pool::block_pool(std::int32_t blocks, std::int32_t block_size) : block_size_(std::max(block_size, 0)) {
  const std::int32_t n = (blocks > 0 && block_size >= 1) ? blocks : 0;
  const auto count = static_cast<std::size_t>(n);
  refs_.assign(count, 0);
  slots_.resize(count);
  free_.reserve(count);
  for (std::int32_t b = n - 1; b >= 0; --b) free_.push_back(b);  // block 0 on top
  by_hash_.reserve(count);
}

std::int32_t block_pool::available() const { return static_cast<std::int32_t>(free_.size()) + idle_count_; }

std::int32_t block_pool::cached_idle() const { return idle_count_; }

bool block_pool::published(block_id b) const { return valid(b) && at(b).published; }

std::optional<block_id> block_pool::allocate() {
  block_id b = none;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (idle_head_ != none) {
    b = idle_head_;
    idle_unlink(b);
    forget(b);
    ++stats_.evictions;
  } else {
    return std::nullopt;
  }
  assert(refs(b) == 0 && !at(b).published);
  refs_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void block_pool::retain(block_id b) {
  const bool ok = valid(b) && refs(b) > 0;
  assert(ok && "block_pool::retain of a block nobody holds");
  if (!ok) return;
  ++refs_[static_cast<std::size_t>(b)];
}

void block_pool::release(block_id b) {
  const bool ok = valid(b) && refs(b) > 0;
  assert(ok && "block_pool::release of a block with count zero");
  if (!ok) return;
  if (--refs_[static_cast<std::size_t>(b)] > 0) return;
  if (at(b).published) {
    idle_push_back(b);
  } else {
    free_.push_back(b);
  }
}

bool block_pool::holds(block_id b, std::uint64_t parent, std::span<const std::int32_t> tokens) const {
  const slot& s = at(b);
  return s.published && s.parent == parent && std::ranges::equal(s.tokens, tokens);
}

std::optional<block_id> block_pool::lookup(std::uint64_t hash, std::uint64_t parent,
                                           std::span<const std::int32_t> tokens) {
  ++stats_.lookups;
  if (tokens.size() != static_cast<std::size_t>(block_size_)) return std::nullopt;
  const auto [first, last] = by_hash_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    const block_id b = it->second;
    if (!holds(b, parent, tokens)) continue;
    if (at(b).idle) idle_unlink(b);
    ++refs_[static_cast<std::size_t>(b)];
    ++stats_.hits;
    return b;
  }
  return std::nullopt;
}

bool block_pool::publish(block_id b, std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens) {
  if (!valid(b) || refs(b) <= 0 || at(b).published) return false;
  if (tokens.size() != static_cast<std::size_t>(block_size_)) return false;
  const auto [first, last] = by_hash_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    if (holds(it->second, parent, tokens)) return false;
  }
  slot& s = at(b);
  s.hash = hash;
  s.parent = parent;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.published = true;
  by_hash_.emplace(hash, b);
  ++stats_.published;
  return true;
}

void block_pool::forget(block_id b) {
  slot& s = at(b);
  if (!s.published) return;
  const auto [first, last] = by_hash_.equal_range(s.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == b) {
      by_hash_.erase(it);
      break;
    }
  }
  s.published = false;
  s.tokens.clear();  // keeps the capacity for the next publish
}

void block_pool::idle_push_back(block_id b) {
  slot& s = at(b);
  assert(!s.idle);
  s.prev = idle_tail_;
  s.next = none;
  if (idle_tail_ != none) {
    at(idle_tail_).next = b;
  } else {
    idle_head_ = b;
  }
  idle_tail_ = b;
  s.idle = true;
  ++idle_count_;
}

void block_pool::idle_unlink(block_id b) {
  slot& s = at(b);
  assert(s.idle);
  if (s.prev != none) {
    at(s.prev).next = s.next;
  } else {
    idle_head_ = s.next;
  }
  if (s.next != none) {
    at(s.next).prev = s.prev;
  } else {
    idle_tail_ = s.prev;
  }
  s.prev = s.next = none;
  s.idle = false;
  --idle_count_;
}

}  // namespace troupe::driver
