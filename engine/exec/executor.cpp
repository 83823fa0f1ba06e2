#include "engine/exec/executor.hpp"

#include <future>

namespace troupe::exec {

std::string_view name(exec_error_code c) {
  switch (c) {
    case exec_error_code::unsupported: return "unsupported";
    case exec_error_code::missing_weight: return "missing_weight";
    case exec_error_code::bad_binding: return "bad_binding";
    case exec_error_code::index_out_of_range: return "index_out_of_range";
    case exec_error_code::unknown_id: return "unknown_id";
    case exec_error_code::state_conflict: return "state_conflict";
    case exec_error_code::device_error: return "device_error";
    case exec_error_code::bad_sampling: return "bad_sampling";
    case exec_error_code::invalid_witness: return "invalid_witness";
  }
  return "unknown";
}

std::string exec_error::message() const { return where + ": " + reason + " (" + std::string(name(code)) + ")"; }

result<void, exec_error> executor::open_history(std::uint64_t sequence, std::int64_t vocab, std::span<const std::int32_t> prompt,
                                                std::span<const std::pair<std::int32_t, float>> bias) {
  auto h = token_history::create(vocab, prompt, bias);
  if (!h) return unexpected(exec_error{exec_error_code::bad_sampling, "history of sequence " + std::to_string(sequence), h.error().message()});
  histories_[sequence] = std::move(*h);
  return {};
}

void executor::close_history(std::uint64_t sequence) { histories_.erase(sequence); }

void executor::record_history(std::uint64_t sequence, std::span<const std::int32_t> tokens) {
  auto it = histories_.find(sequence);
  if (it == histories_.end()) return;
  for (auto t : tokens) it->second.record(t);
}

const token_history* executor::history(std::uint64_t sequence) const {
  auto it = histories_.find(sequence);
  return it == histories_.end() ? nullptr : &it->second;
}

result<void, exec_error> executor::copy_state_rows(executable_id, std::span<const std::pair<std::int64_t, std::int64_t>>) {
  return unexpected(exec_error{exec_error_code::unsupported, "copy_state_rows", "this executor does not copy state rows"});
}

result<std::vector<sampled_row>, exec_error> executor::step_sample(entry_id entry, const step_inputs& in,
                                                                   std::span<const sample_row_request> rows, const mask_hook& masks) {
  // The host fills the masks while the forward pass runs.
  std::vector<std::vector<std::uint32_t>> mask_words(rows.size());
  std::future<void> filling;
  if (masks) filling = std::async(std::launch::async, [&] { masks(mask_words); });
  auto out = step(entry, in);
  if (filling.valid()) filling.get();
  if (!out) return unexpected(out.error());
  auto it = out->outputs.find("logits");
  if (it == out->outputs.end()) return unexpected(exec_error{exec_error_code::bad_binding, "head", "the entry returns no logits to sample"});
  const tensor& logits = it->second;
  const auto& dims = logits.shape().dims();
  if (dims.size() != 2 || logits.type() != dtype::f32 || dims[0] < static_cast<std::int64_t>(rows.size()))
    return unexpected(exec_error{exec_error_code::bad_binding, "head", "logits are not f32 [rows, vocab] covering every sampled row"});
  const std::int64_t vocab = dims[1];
  std::vector<sampled_row> picks(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::span<const float> row(logits.as<float>() + static_cast<std::int64_t>(r) * vocab, static_cast<std::size_t>(vocab));
    auto h = histories_.find(rows[r].sequence);
    token_history* hist = h == histories_.end() ? nullptr : &h->second;
    auto pick = sample_row(row, rows[r].params, hist, rows[r].draw, mask_words[r], scratch_);
    if (!pick) return unexpected(exec_error{exec_error_code::bad_sampling, "row " + std::to_string(r), pick.error().message()});
    if (hist) hist->record(pick->token);
    picks[r].pick = std::move(*pick);
    if (rows[r].want_logits) picks[r].logits.assign(row.begin(), row.end());
  }
  return picks;
}

}  // namespace troupe::exec
