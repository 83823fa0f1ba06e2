#include "engine/text/bpe_model.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "engine/text/detail/byte_level.hpp"
#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

namespace {

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using vocab_map = std::unordered_map<std::string, token_id, string_hash, std::equal_to<>>;

std::uint64_t pair_key(token_id a, token_id b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

// (left id, right id) -> (rank, merged id), open addressing: the merge lookup is the inner loop of BPE.
class merge_table {
 public:
  struct entry {
    std::uint32_t rank = 0;
    token_id id = 0;
  };

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, empty_key);
    values_.assign(cap, entry{});
    mask_ = cap - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(cap));
  }
  // A later merge of the same pair replaces the earlier one, as Hugging Face's map does.
  void insert_or_assign(std::uint64_t key, entry e) {
    std::size_t at = slot(key);
    while (keys_[at] != empty_key && keys_[at] != key) at = (at + 1) & mask_;
    keys_[at] = key;
    values_[at] = e;
  }
  const entry* find(std::uint64_t key) const {
    if (keys_.empty()) return nullptr;
    std::size_t at = slot(key);
    while (true) {
      if (keys_[at] == key) return &values_[at];
      if (keys_[at] == empty_key) return nullptr;
      at = (at + 1) & mask_;
    }
  }

 private:
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<std::uint64_t> keys_;
  std::vector<entry> values_;
  std::size_t mask_ = 0;
  unsigned shift_ = 60;
};

// Words longer than this are not cached (Hugging Face's limit too): they are rare and would crowd out
// the common ones.
constexpr std::size_t max_cached_word = 256;

// Word -> ids. Most words are short and become a few tokens: those live in flat direct-mapped tables
// of one cache line per entry, read without a lock (a sequence lock per entry: a reader that sees the
// entry change under it counts a miss), so threads encoding at once neither wait on one another nor
// bounce a lock's cache line between cores. Other words live in hash maps behind a lock per shard. A
// colliding word replaces an entry, and a full map is emptied; either way the cache refills with the
// words a text repeats.
class word_cache {
 public:
  bool find(std::string_view word, std::vector<token_id>& out) const {
    const std::size_t h = std::hash<std::string_view>{}(word);
    if (word.size() <= short_key) {
      if (const entry* e = slot(h)) {
        std::array<std::uint64_t, entry_words> w;
        const std::uint64_t before = std::atomic_ref(e->version).load(std::memory_order_acquire);
        if ((before & 1) == 0) {
          // Acquire loads of words a writer stores with release: reading any word of a newer write
          // makes that writer's odd version visible to the check below.
          for (std::size_t k = 0; k < entry_words; ++k)
            w[k] = std::atomic_ref(e->words[k]).load(std::memory_order_acquire);
          if (std::atomic_ref(e->version).load(std::memory_order_relaxed) == before) {
            const auto* bytes = reinterpret_cast<const unsigned char*>(w.data());
            const std::size_t key_len = bytes[8], ids_len = bytes[9];
            if (w[0] == tag(h) && key_len == word.size() && std::memcmp(bytes + 10, word.data(), key_len) == 0) {
              token_id ids[short_ids];
              std::memcpy(ids, bytes + 32, sizeof ids);
              out.insert(out.end(), ids, ids + ids_len);
              return true;
            }
          }
        }
      }
    }
    // Long words, and short words of many tokens.
    long_shard& s = long_[h % long_shards];
    std::lock_guard lock(s.mutex);
    const auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const token_id* ids, std::size_t n) const {
    const std::size_t h = std::hash<std::string_view>{}(word);
    if (word.size() <= short_key && n <= short_ids) {
      entry* e = writable_slot(h);
      std::uint64_t v = std::atomic_ref(e->version).load(std::memory_order_relaxed);
      // Another thread is writing this entry: leave it to them.
      if ((v & 1) != 0 || !std::atomic_ref(e->version).compare_exchange_strong(v, v + 1, std::memory_order_acquire))
        return;
      std::array<std::uint64_t, entry_words> w{};
      auto* bytes = reinterpret_cast<unsigned char*>(w.data());
      w[0] = tag(h);
      bytes[8] = static_cast<unsigned char>(word.size());
      bytes[9] = static_cast<unsigned char>(n);
      std::memcpy(bytes + 10, word.data(), word.size());
      std::memcpy(bytes + 32, ids, n * sizeof(token_id));
      for (std::size_t k = 0; k < entry_words; ++k) std::atomic_ref(e->words[k]).store(w[k], std::memory_order_release);
      std::atomic_ref(e->version).store(v + 2, std::memory_order_release);
      return;
    }
    long_shard& s = long_[h % long_shards];
    std::lock_guard lock(s.mutex);
    if (s.map.size() >= long_capacity) s.map.clear();
    s.map.try_emplace(std::string(word), ids, ids + n);
  }

 private:
  // An entry: a version, then seven words holding the hash tag, the key's length and bytes (at byte 10
  // of the words), the ids' count (byte 9) and the ids (from byte 32).
  static constexpr std::size_t entry_words = 7;
  static constexpr std::size_t short_key = 22;
  static constexpr std::size_t short_ids = 6;
  static constexpr std::size_t short_slots = 1 << 16;  // 4 MiB, allocated on the first insert
  static constexpr std::size_t long_shards = 16;
  static constexpr std::size_t long_capacity = 1 << 12;  // per shard
  static std::uint64_t tag(std::size_t h) { return static_cast<std::uint64_t>(h) | 1; }  // 0 marks an empty slot

  struct alignas(64) entry {
    std::uint64_t version = 0;  // odd while a writer fills the entry
    std::uint64_t words[entry_words] = {};
  };
  static_assert(sizeof(entry) == 64);

  const entry* slot(std::size_t h) const {
    const entry* t = table_.load(std::memory_order_acquire);
    return t == nullptr ? nullptr : &t[h & (short_slots - 1)];
  }
  entry* writable_slot(std::size_t h) const {
    entry* t = table_.load(std::memory_order_acquire);
    if (t == nullptr) {
      std::lock_guard lock(table_mutex_);
      t = table_.load(std::memory_order_relaxed);
      if (t == nullptr) {
        storage_ = std::make_unique<entry[]>(short_slots);
        t = storage_.get();
        table_.store(t, std::memory_order_release);
      }
    }
    return &t[h & (short_slots - 1)];
  }

  struct long_shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<token_id>, string_hash, std::equal_to<>> map;
  };
  mutable std::array<long_shard, long_shards> long_;
  mutable std::mutex table_mutex_;
  mutable std::unique_ptr<entry[]> storage_;
  mutable std::atomic<entry*> table_{nullptr};
};

// Characters below this code point are looked up in a table instead of the vocabulary's hash map; the
// byte-level alphabet lies below U+0144.
constexpr char32_t small_char_limit = 0x800;

struct symbol {
  token_id id = 0;
  int prev = -1;
  int next = -1;
  bool live = true;
};

struct queued_merge {
  std::uint32_t rank = 0;
  int pos = 0;
  token_id id = 0;
  // The priority queue pops the greatest: make that the lowest rank, then the leftmost position.
  bool operator<(const queued_merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

struct bpe_model::impl {
  bpe_options options;
  vocab_map vocab;
  std::vector<std::string> tokens;  // by id; empty where no token has that id
  std::vector<bool> present;
  std::vector<token_id> small_chars;  // code point -> id, or -1; empty when prefixes or suffixes apply
  std::array<token_id, 256> byte_ids{};
  std::optional<token_id> unk_id;
  merge_table merges;

  // For raw-byte input: each byte's alphabet character id, and the vocabulary keyed by the bytes each
  // byte-level token stands for (for ignore_merges).
  bool raw_ready = false;
  std::array<token_id, 256> byte_char_ids{};
  vocab_map raw_vocab;

  word_cache cache;
  word_cache raw_cache;

  void index_vocab() {
    token_id top = -1;
    for (const auto& [tok, id] : vocab) top = std::max(top, id);
    tokens.assign(static_cast<std::size_t>(top + 1), std::string());
    present.assign(static_cast<std::size_t>(top + 1), false);
    for (const auto& [tok, id] : vocab) {
      tokens[static_cast<std::size_t>(id)] = tok;
      present[static_cast<std::size_t>(id)] = true;
    }
    if (options.continuing_subword_prefix.empty() && options.end_of_word_suffix.empty()) {
      small_chars.assign(small_char_limit, -1);
      for (const auto& [tok, id] : vocab) {
        if (tok.empty() || tok.size() > 2) continue;
        std::size_t i = 0;
        const char32_t c = detail::next_scalar(tok, i);
        if (i == tok.size() && c < small_char_limit) small_chars[c] = id;
      }
    }
    static constexpr char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name{'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      const auto it = vocab.find(name);
      byte_ids[static_cast<std::size_t>(b)] = it == vocab.end() ? -1 : it->second;
    }
    if (options.unk_token) {
      const auto it = vocab.find(*options.unk_token);
      if (it != vocab.end()) unk_id = it->second;
    }
    raw_ready = !small_chars.empty();
    for (int b = 0; b < 256 && raw_ready; ++b) {
      const auto it = vocab.find(detail::byte_level_char(static_cast<unsigned char>(b)));
      raw_ready = it != vocab.end();
      if (raw_ready) byte_char_ids[static_cast<std::size_t>(b)] = it->second;
    }
    if (raw_ready && options.ignore_merges) {
      raw_vocab.reserve(vocab.size());
      std::string bytes;
      for (const auto& [tok, id] : vocab) {
        bytes.clear();
        if (detail::byte_level_decode(tok, bytes)) raw_vocab.try_emplace(bytes, id);
      }
    }
  }

  token_id lookup_char(std::string_view word, std::size_t start, std::size_t end, bool first, bool last,
                       std::string& scratch) const {
    if (!small_chars.empty()) {
      std::size_t i = start;
      const char32_t c = detail::next_scalar(word, i);
      if (c < small_char_limit) return small_chars[c];
      const auto it = vocab.find(word.substr(start, end - start));
      return it == vocab.end() ? -1 : it->second;
    }
    scratch.clear();
    if (!first) scratch += options.continuing_subword_prefix;
    scratch.append(word.substr(start, end - start));
    if (last) scratch += options.end_of_word_suffix;
    const auto it = vocab.find(std::string_view(scratch));
    return it == vocab.end() ? -1 : it->second;
  }

  void encode_word(std::string_view word, std::vector<token_id>& out) const {
    std::vector<symbol> syms;
    syms.reserve(word.size());
    const auto add = [&](token_id id) {
      const int n = static_cast<int>(syms.size());
      syms.push_back({id, n - 1, -1, true});
      if (n > 0) syms[static_cast<std::size_t>(n - 1)].next = n;
    };
    token_id pending_unk = -1;  // an unknown token not yet added, while fuse_unk may extend it
    std::string scratch;
    std::size_t i = 0;
    while (i < word.size()) {
      const std::size_t start = i;
      i += detail::utf8_length(static_cast<unsigned char>(word[i]));
      const token_id id = lookup_char(word, start, i, start == 0, i >= word.size(), scratch);
      if (id >= 0) {
        if (pending_unk >= 0) {
          add(pending_unk);
          pending_unk = -1;
        }
        add(id);
        continue;
      }
      if (options.byte_fallback) {
        // The bytes of the character as looked up, affixes included, as Hugging Face does.
        std::string looked(word.substr(start, i - start));
        if (small_chars.empty()) {
          looked.clear();
          if (start != 0) looked += options.continuing_subword_prefix;
          looked.append(word.substr(start, i - start));
          if (i >= word.size()) looked += options.end_of_word_suffix;
        }
        const bool all = std::all_of(looked.begin(), looked.end(),
                                     [&](char b) { return byte_ids[static_cast<unsigned char>(b)] >= 0; });
        if (all) {
          for (const char b : looked) add(byte_ids[static_cast<unsigned char>(b)]);
          continue;
        }
      }
      if (unk_id) {
        if (pending_unk >= 0 && !options.fuse_unk) add(pending_unk);
        pending_unk = *unk_id;
      }
    }
    if (pending_unk >= 0) add(pending_unk);
    merge(syms, out);
  }

  void encode_bytes(std::string_view bytes, std::vector<token_id>& out) const {
    std::vector<symbol> syms(bytes.size());
    for (std::size_t k = 0; k < bytes.size(); ++k)
      syms[k] = {byte_char_ids[static_cast<unsigned char>(bytes[k])], static_cast<int>(k) - 1,
                 k + 1 < bytes.size() ? static_cast<int>(k + 1) : -1, true};
    merge(syms, out);
  }

  // Hugging Face's Word::merge_all: the queued pair of lowest rank (then leftmost) merges, until none.
  void merge(std::vector<symbol>& syms, std::vector<token_id>& out) const {
    std::priority_queue<queued_merge> queue;
    for (std::size_t k = 0; k + 1 < syms.size(); ++k)
      if (const auto* m = merges.find(pair_key(syms[k].id, syms[k + 1].id)))
        queue.push({m->rank, static_cast<int>(k), m->id});
    while (!queue.empty()) {
      const queued_merge top = queue.top();
      queue.pop();
      auto& left = syms[static_cast<std::size_t>(top.pos)];
      if (!left.live || left.next < 0) continue;
      auto& right = syms[static_cast<std::size_t>(left.next)];
      // An entry is stale when either side has merged since it was queued.
      const auto* now = merges.find(pair_key(left.id, right.id));
      if (now == nullptr || now->id != top.id) continue;
      left.id = top.id;
      right.live = false;
      left.next = right.next;
      if (right.next >= 0) syms[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0)
        if (const auto* m = merges.find(pair_key(syms[static_cast<std::size_t>(left.prev)].id, left.id)))
          queue.push({m->rank, left.prev, m->id});
      if (left.next >= 0)
        if (const auto* m = merges.find(pair_key(left.id, syms[static_cast<std::size_t>(left.next)].id)))
          queue.push({m->rank, top.pos, m->id});
    }
    for (const auto& s : syms)
      if (s.live) out.push_back(s.id);
  }
};

result<bpe_model, text_error> bpe_model::from_merges(std::vector<std::pair<std::string, token_id>> vocab,
                                                     std::span<const bpe_merge> merges, bpe_options options,
                                                     const bpe_source& source) {
  auto m = std::make_shared<impl>();
  m->options = std::move(options);
  m->vocab.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    if (id < 0)
      return troupe::unexpected(text_error{text_error_code::bad_value, source.file, source.vocab_field,
                                           "token '" + tok + "' has the negative id " + std::to_string(id)});
    m->vocab.try_emplace(std::move(tok), id);  // the first of duplicate tokens wins
  }
  m->index_vocab();
  m->merges.reserve(merges.size());
  const std::size_t prefix_len = m->options.continuing_subword_prefix.size();
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const auto& mg = merges[r];
    const auto field = [&] { return source.merges_field + "[" + std::to_string(r) + "]"; };
    const auto a = m->vocab.find(mg.left);
    if (a == m->vocab.end())
      return troupe::unexpected(text_error{text_error_code::unknown_token, source.file, field(),
                                           "merge names '" + mg.left + "', which is not in the vocabulary"});
    const auto b = m->vocab.find(mg.right);
    if (b == m->vocab.end())
      return troupe::unexpected(text_error{text_error_code::unknown_token, source.file, field(),
                                           "merge names '" + mg.right + "', which is not in the vocabulary"});
    std::string merged = mg.left;
    if (prefix_len > 0 && mg.right.compare(0, prefix_len, m->options.continuing_subword_prefix) == 0) {
      merged.append(mg.right, prefix_len);
    } else {
      merged += mg.right;
    }
    const auto c = m->vocab.find(merged);
    if (c == m->vocab.end())
      return troupe::unexpected(text_error{text_error_code::unknown_token, source.file, field(),
                                           "merge result '" + merged + "' is not in the vocabulary"});
    m->merges.insert_or_assign(pair_key(a->second, b->second), {static_cast<std::uint32_t>(r), c->second});
  }
  return bpe_model(std::move(m));
}

result<bpe_model, text_error> bpe_model::from_scores(std::vector<std::string> tokens, std::span<const float> scores,
                                                    const std::vector<bool>& mergeable, bpe_options options,
                                                    const bpe_source& source) {
  if (scores.size() != tokens.size() || mergeable.size() != tokens.size())
    return troupe::unexpected(text_error{text_error_code::bad_value, source.file, source.merges_field,
                                         "holds " + std::to_string(scores.size()) + " scores for " +
                                             std::to_string(tokens.size()) + " tokens"});
  auto m = std::make_shared<impl>();
  m->options = std::move(options);
  m->vocab.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    m->vocab.try_emplace(tokens[i], static_cast<token_id>(i));  // the first of duplicate pieces wins
  m->index_vocab();
  // Equal scores share a rank, so the leftmost pair wins among them, as in SentencePiece.
  std::vector<float> distinct;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (mergeable[i]) distinct.push_back(scores[i]);
  std::sort(distinct.begin(), distinct.end(), std::greater<>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const auto rank_of = [&](float s) {
    return static_cast<std::uint32_t>(std::lower_bound(distinct.begin(), distinct.end(), s, std::greater<>()) -
                                      distinct.begin());
  };
  struct pending {
    std::uint64_t key;
    merge_table::entry e;
  };
  std::vector<pending> found;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (!mergeable[t]) continue;
    const std::string_view s = tokens[t];
    if (m->vocab.find(s)->second != static_cast<token_id>(t)) continue;
    std::size_t k = detail::utf8_length(static_cast<unsigned char>(s.empty() ? 0 : s[0]));
    while (k < s.size()) {
      const auto a = m->vocab.find(s.substr(0, k));
      if (a != m->vocab.end()) {
        const auto b = m->vocab.find(s.substr(k));
        if (b != m->vocab.end()) found.push_back({pair_key(a->second, b->second), {rank_of(scores[t]), static_cast<token_id>(t)}});
      }
      k += detail::utf8_length(static_cast<unsigned char>(s[k]));
    }
  }
  m->merges.reserve(found.size());
  for (const auto& f : found) m->merges.insert_or_assign(f.key, f.e);
  return bpe_model(std::move(m));
}

void bpe_model::tokenize(std::string_view word, std::vector<token_id>& out) const {
  if (word.empty()) return;
  const impl& m = *impl_;
  const bool cacheable = word.size() < max_cached_word;
  if (cacheable && m.cache.find(word, out)) return;
  const std::size_t mark = out.size();
  const auto whole = m.options.ignore_merges ? m.vocab.find(word) : m.vocab.end();
  if (whole != m.vocab.end()) {
    out.push_back(whole->second);
  } else {
    m.encode_word(word, out);
  }
  if (cacheable) m.cache.insert(word, out.data() + mark, out.size() - mark);
}

bool bpe_model::reads_raw_bytes() const { return impl_->raw_ready; }

void bpe_model::tokenize_bytes(std::string_view bytes, std::vector<token_id>& out) const {
  if (bytes.empty()) return;
  const impl& m = *impl_;
  const bool cacheable = bytes.size() < max_cached_word;
  if (cacheable && m.raw_cache.find(bytes, out)) return;
  const std::size_t mark = out.size();
  const auto whole = m.options.ignore_merges ? m.raw_vocab.find(bytes) : m.raw_vocab.end();
  if (whole != m.raw_vocab.end()) {
    out.push_back(whole->second);
  } else {
    m.encode_bytes(bytes, out);
  }
  if (cacheable) m.raw_cache.insert(bytes, out.data() + mark, out.size() - mark);
}

std::optional<token_id> bpe_model::token_to_id(std::string_view token) const {
  const auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> bpe_model::id_to_token(token_id id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->tokens.size() || !impl_->present[static_cast<std::size_t>(id)])
    return std::nullopt;
  return impl_->tokens[static_cast<std::size_t>(id)];
}

std::size_t bpe_model::id_limit() const { return impl_->tokens.size(); }

const bpe_options& bpe_model::options() const { return impl_->options; }

}  // namespace troupe::text
