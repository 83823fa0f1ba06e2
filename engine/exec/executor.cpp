#include "engine/exec/executor.hpp"

#include <algorithm>
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

result<std::vector<std::vector<sampled_row>>, exec_error> executor::step_chain(entry_id entry, const step_inputs& first,
                                                                               std::span<const sample_row_request> rows, const chain_request& chain) {
  const auto ids_it = first.slots.find("token_ids");
  const auto pos_it = first.slots.find("positions");
  const auto write_it = first.slots.find("kv_write_map");
  if (ids_it == first.slots.end() || pos_it == first.slots.end() || write_it == first.slots.end())
    return unexpected(exec_error{exec_error_code::bad_binding, "chain", "a chain needs token_ids, positions and kv_write_map slots"});
  const auto R = ids_it->second.shape().numel();
  if (chain.steps < 1 || static_cast<std::int64_t>(chain.positions.size()) != chain.steps * R ||
      static_cast<std::int64_t>(chain.write_slots.size()) != chain.steps * R || static_cast<std::int64_t>(rows.size()) > R)
    return unexpected(exec_error{exec_error_code::bad_binding, "chain", "positions and write slots must hold steps x rows values"});
  tensor ids = tensor::copy_of(ids_it->second), pos = tensor::copy_of(pos_it->second), write = tensor::copy_of(write_it->second);  // rebound each step
  if (ids.type() != dtype::i32 || pos.type() != dtype::i32 || write.type() != dtype::i32)
    return unexpected(exec_error{exec_error_code::bad_binding, "chain", "token_ids, positions and kv_write_map must be i32"});
  step_inputs in = first;
  in.slots["token_ids"] = ids.view();
  in.slots["positions"] = pos.view();
  in.slots["kv_write_map"] = write.view();
  std::vector<sample_row_request> req(rows.begin(), rows.end());
  std::vector<bool> live(rows.size(), true);
  std::vector<std::vector<sampled_row>> out;
  for (std::int64_t i = 0; i < chain.steps; ++i) {
    if (i > 0) {
      for (std::int64_t r = 0; r < R; ++r) {
        const bool on = static_cast<std::size_t>(r) < rows.size() && live[static_cast<std::size_t>(r)];
        ids.as<std::int32_t>()[r] = on ? out.back()[static_cast<std::size_t>(r)].pick.token : 0;
        pos.as<std::int32_t>()[r] = chain.positions[static_cast<std::size_t>(i * R + r)];
        write.as<std::int32_t>()[r] = on ? chain.write_slots[static_cast<std::size_t>(i * R + r)] : -1;
      }
      for (auto& q : req) ++q.draw;
    }
    auto picks = step_sample(entry, in, req);
    if (!picks) return unexpected(picks.error());
    out.push_back(std::move(*picks));
    bool any = false;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (!live[r]) continue;
      const auto t = out.back()[r].pick.token;
      const auto& stops = r < chain.stop_ids.size() ? chain.stop_ids[r] : std::vector<std::int32_t>{};
      if (std::find(stops.begin(), stops.end(), t) != stops.end()) live[r] = false;
      any = any || live[r];
    }
    if (!any) break;
  }
  return out;
}

result<void, exec_error> executor::copy_state_rows(executable_id, std::span<const std::pair<std::int64_t, std::int64_t>>, std::span<const std::string>) {
  return unexpected(exec_error{exec_error_code::unsupported, "copy_state_rows", "this executor does not copy state rows"});
}

result<void, exec_error> executor::reload_expert(executable_id, const graph::weight_role& role, std::int64_t) {
  return unexpected(exec_error{exec_error_code::unsupported, "weight " + role.str(), "this executor does not reload weights"});
}

result<std::vector<sampled_row>, exec_error> executor::step_sample(entry_id entry, const step_inputs& in,
                                                                   std::span<const sample_row_request> rows, const mask_hook& masks,
                                                                   step_outputs* rest) {
  // The host fills the masks while the forward pass runs.
  std::vector<std::vector<std::uint32_t>> mask_words(rows.size());
  std::future<void> filling;
  if (masks) filling = std::async(std::launch::async, [&] { masks(mask_words); });
  auto out = step_in_place(entry, in);
  if (filling.valid()) filling.get();
  if (!out) return unexpected(out.error());
  const tensor_view* found = out->find("logits");
  if (!found) return unexpected(exec_error{exec_error_code::bad_binding, "head", "the entry returns no logits to sample"});
  const tensor_view& logits = *found;
  const auto& dims = logits.shape().dims();
  if (dims.size() != 2 || logits.type() != dtype::f32 || dims[0] < static_cast<std::int64_t>(rows.size()))
    return unexpected(exec_error{exec_error_code::bad_binding, "head", "logits are not f32 [rows, vocab] covering every sampled row"});
  const std::int64_t vocab = dims[1];
  std::vector<sampled_row> picks(rows.size());
  std::vector<std::optional<exec_error>> failed(rows.size());
  // Rows are independent unless two name one sequence (its history takes both picks, in order).
  std::vector<std::uint64_t> ids;
  for (const auto& r : rows) ids.push_back(r.sequence);
  std::sort(ids.begin(), ids.end());
  const bool apart = std::adjacent_find(ids.begin(), ids.end()) == ids.end();
  const int workers = apart ? std::max(1, row_workers()) : 1;
  if (scratch_.size() < static_cast<std::size_t>(workers)) scratch_.resize(static_cast<std::size_t>(workers));
  auto one = [&](std::size_t r, int worker) {
    const std::span<const float> row(logits.as<float>() + static_cast<std::int64_t>(r) * vocab, static_cast<std::size_t>(vocab));
    auto h = histories_.find(rows[r].sequence);
    token_history* hist = h == histories_.end() ? nullptr : &h->second;
    auto pick = sample_row(row, rows[r].params, hist, rows[r].draw, mask_words[r], scratch_[static_cast<std::size_t>(worker)]);
    if (!pick) {
      failed[r] = exec_error{exec_error_code::bad_sampling, "row " + std::to_string(r), pick.error().message()};
      return;
    }
    if (hist) hist->record(pick->token);
    picks[r].pick = std::move(*pick);
    if (rows[r].want_logits) picks[r].logits.assign(row.begin(), row.end());
  };
  if (workers > 1 && rows.size() > 1) {
    for_each_row(rows.size(), one);
  } else {
    for (std::size_t r = 0; r < rows.size(); ++r) one(r, 0);
  }
  for (auto& f : failed)
    if (f) return unexpected(std::move(*f));
  if (rest) {
    rest->outputs.clear();
    for (const auto& [name, v] : out->outputs)
      if (name != "logits") rest->outputs.emplace(name, tensor::copy_of(v));
  }
  return picks;
}

void executor::for_each_row(std::size_t n, const std::function<void(std::size_t row, int worker)>& fn) {
  for (std::size_t r = 0; r < n; ++r) fn(r, 0);
}

result<step_views, exec_error> executor::step_in_place(entry_id entry, const step_inputs& in) {
  auto out = step(entry, in);
  if (!out) return unexpected(out.error());
  held_ = std::move(*out);
  step_views v;
  for (const auto& [name, t] : held_.outputs) v.outputs.emplace_back(name, t.view());
  return v;
}

}  // namespace troupe::exec
