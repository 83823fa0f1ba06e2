#include "actors/entry_key.hpp"

namespace troupe::actors {

transport::entry_key to_wire(const driver::entry_key& k) {
  const auto& s = k.shape;
  transport::entry_key w;
  w.program = k.program == families::program::encode ? transport::program_kind::encode : transport::program_kind::step;
  w.rows = s.rows();
  w.tokens = s.tokens();
  w.capacity = s.capacity();
  w.kv = s.kv().kind == families::kv_layout_kind::paged ? transport::kv_layout::paged : transport::kv_layout::contiguous;
  w.block_size = s.kv().block_size;
  w.pool_blocks = s.kv().pool_blocks;
  w.logits = s.logits() == families::logit_rows::all ? transport::logit_rows::all : transport::logit_rows::last;
  w.hidden_carry = s.hidden_carry();
  w.state_rows = s.declared_state_rows();
  w.carried = k.carried;
  return w;
}

result<driver::entry_key, std::string> from_wire(const transport::entry_key& w) {
  auto in = [](std::int64_t v, std::int64_t lo, std::int64_t hi) { return v >= lo && v <= hi; };
  if (!in(w.rows, 1, 1 << 16) || !in(w.tokens, 1, 1 << 24) || !in(w.capacity, 1, std::int64_t{1} << 32) || !in(w.block_size, 0, 1 << 24) ||
      !in(w.pool_blocks, 0, std::int64_t{1} << 32))
    return unexpected("an entry's sizes out of range: rows " + std::to_string(w.rows) + ", tokens " + std::to_string(w.tokens) + ", capacity " +
                      std::to_string(w.capacity) + ", block " + std::to_string(w.block_size) + ", pool " + std::to_string(w.pool_blocks));
  if (w.carried.size() > 64) return unexpected("an entry carries at most 64 inputs, got " + std::to_string(w.carried.size()));
  for (const auto& c : w.carried)
    if (c.empty() || c.size() > 256) return unexpected(std::string("a carried input's name holds 1 to 256 bytes"));
  driver::entry_key k;
  k.program = w.program == transport::program_kind::encode ? families::program::encode : families::program::step;
  families::step_shape s(w.rows, w.tokens, w.capacity);
  if (w.kv == transport::kv_layout::paged) {
    if (w.block_size < 1 || w.pool_blocks < 1) return unexpected(std::string("a paged layout needs a block size and a pool"));
    s.with_kv(families::kv_layout::paged(w.block_size, w.pool_blocks));
  }
  s.with_logits(w.logits == transport::logit_rows::all ? families::logit_rows::all : families::logit_rows::last).with_hidden_carry(w.hidden_carry).with_state_rows(w.state_rows);
  k.shape = s;
  k.carried = w.carried;
  return k;
}

}  // namespace troupe::actors
