#include "apps/exec_runner.hpp"

namespace troupe::app {

exec_runner::exec_runner(std::shared_ptr<const families::model_handle> h, exec::executor& ex, std::int64_t capacity)
    : handle_(std::move(h)), ex_(&ex), capacity_(capacity), weights_(std::make_unique<weight_map_weights>(handle_->model().weights())) {}

result<exec_runner, std::string> exec_runner::create(std::shared_ptr<const families::model_handle> handle, exec::executor& ex,
                                                     std::int64_t capacity) {
  exec_runner r(std::move(handle), ex, capacity);
  auto exe = ex.load(*r.weights_);
  if (!exe) return unexpected(exe.error().message());
  r.exe_ = *exe;
  return r;
}

result<exec::entry_id, std::string> exec_runner::entry_for(std::int64_t tokens, bool all_logits) {
  const auto key = std::make_pair(tokens, all_logits);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  families::step_spec spec;
  spec.shape = families::step_shape(1, tokens, capacity_).with_logits(all_logits ? families::logit_rows::all : families::logit_rows::last);
  auto g = handle_->model().trace(spec);
  if (!g) return unexpected("trace: " + g.error().message());
  auto e = ex_->add_entry(exe_, *g);
  if (!e) return unexpected("prepare: " + e.error().message());
  entries_.emplace(key, *e);
  return *e;
}

result<void, std::string> exec_runner::prepare(std::int64_t tokens, bool all_logits) {
  auto e = entry_for(tokens, all_logits);
  if (!e) return unexpected(e.error());
  return {};
}

result<void, std::string> exec_runner::reset() {
  pos_ = 0;
  auto r = ex_->reset_states(exe_);
  if (!r) return unexpected(r.error().message());
  return {};
}

result<std::vector<float>, std::string> exec_runner::feed(std::span<const std::int32_t> tokens, bool all_logits) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0) return unexpected(std::string("no tokens to feed"));
  if (pos_ + n > capacity_) return unexpected("the sequence would pass its capacity of " + std::to_string(capacity_));
  auto e = entry_for(n, all_logits);
  if (!e) return unexpected(e.error());
  if (!ids_.data() || ids_.numel() != n) {
    ids_ = tensor(dtype::i32, {n});
    pos_slot_ = tensor(dtype::i32, {n});
  }
  if (!read_.data() || read_.numel() != capacity_) read_ = tensor(dtype::i32, {1, capacity_});
  if (!row_.data()) row_ = tensor(dtype::i32, {1});  // one sequence: state row 0 of each recurrent pool
  for (std::int64_t i = 0; i < n; ++i) {
    ids_.as<std::int32_t>()[i] = tokens[i];
    pos_slot_.as<std::int32_t>()[i] = static_cast<std::int32_t>(pos_ + i);
  }
  for (std::int64_t j = 0; j < capacity_; ++j) read_.as<std::int32_t>()[j] = j < pos_ + n ? static_cast<std::int32_t>(j) : -1;
  exec::step_inputs in;
  in.slots = {{"token_ids", ids_.view()}, {"positions", pos_slot_.view()}, {"kv_write_map", pos_slot_.view()}, {"kv_read_map", read_.view()},
              {"state_rows", row_.view()}};
  auto out = ex_->step_views_of(*e, in);
  if (!out) return unexpected("step: " + out.error().message());
  pos_ += n;
  const tensor_view* found = out->find("logits");
  if (!found) return std::vector<float>{};  // a pipeline stage before the last
  const auto* logits = reinterpret_cast<const float*>(found->data());
  return std::vector<float>(logits, logits + found->numel());
}

}  // namespace troupe::app
