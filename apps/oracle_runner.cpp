#include "apps/oracle_runner.hpp"

#include <cstring>

namespace troupe::app {

oracle_runner::oracle_runner(std::shared_ptr<const families::model_handle> handle, std::int64_t capacity, collective* group,
                             collective* pipe)
    : handle_(std::move(handle)), group_(group), pipe_(pipe), capacity_(capacity), weights_(handle_->model().weights()) {
  reset();
}

void oracle_runner::reset() {
  pos_ = 0;
  states_.clear();
  for (const auto& s : handle_->model().schema().states(families::program::step)) {
    std::vector<std::int64_t> dims{s.per_row ? 1 : capacity_};  // one sequence: one state row
    dims.insert(dims.end(), s.slot_shape.begin(), s.slot_shape.end());
    states_.emplace(s.name, tensor(s.element, troupe::shape(std::span<const std::int64_t>(dims))));
  }
}

result<std::vector<float>, std::string> oracle_runner::feed(std::span<const std::int32_t> tokens, bool all_logits) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0) return unexpected(std::string("no tokens to feed"));
  if (pos_ + n > capacity_) return unexpected("the sequence would pass its capacity of " + std::to_string(capacity_));
  const auto key = std::make_pair(n, all_logits);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    families::step_spec spec;
    spec.shape = families::step_shape(1, n, capacity_).with_logits(all_logits ? families::logit_rows::all : families::logit_rows::last);
    auto g = handle_->model().trace(spec);
    if (!g) return unexpected("trace: " + g.error().message());
    it = graphs_.emplace(key, std::move(*g)).first;
  }
  tensor ids(dtype::i32, {n}), pos(dtype::i32, {n}), write(dtype::i32, {n}), read(dtype::i32, {1, capacity_});
  for (std::int64_t i = 0; i < n; ++i) {
    ids.as<std::int32_t>()[i] = tokens[i];
    pos.as<std::int32_t>()[i] = static_cast<std::int32_t>(pos_ + i);
    write.as<std::int32_t>()[i] = static_cast<std::int32_t>(pos_ + i);
  }
  for (std::int64_t j = 0; j < capacity_; ++j) read.as<std::int32_t>()[j] = j < pos_ + n ? static_cast<std::int32_t>(j) : -1;
  eval::eval_inputs in;
  in.weights = &weights_;
  in.slots.emplace("token_ids", ids.view());
  in.slots.emplace("positions", pos.view());
  in.slots.emplace("kv_write_map", write.view());
  in.slots.emplace("kv_read_map", read.view());
  tensor row(dtype::i32, {1});
  row.as<std::int32_t>()[0] = 0;
  in.slots.emplace("state_rows", row.view());
  for (const auto& [name, t] : states_) in.states.emplace(name, t.view());
  eval::eval_options opt;
  opt.group = group_;
  opt.pipe = pipe_;
  auto ev = eval::evaluate(it->second, in, opt);
  if (!ev) return unexpected("oracle: " + ev.error().message());
  for (auto& [name, t] : ev->states) states_[name] = std::move(t);
  pos_ += n;
  const auto found = ev->outputs.find("logits");
  if (found == ev->outputs.end()) return std::vector<float>{};  // a pipeline stage before the last
  const auto& logits = found->second;
  return std::vector<float>(logits.as<float>(), logits.as<float>() + logits.numel());
}

}  // namespace troupe::app
