// Request inputs checked against the model's schema at admission (driver.hpp: check_inputs).
#include <set>

#include <cstring>

#include "engine/driver/driver_state.hpp"

namespace troupe::driver {

std::string_view name(input_error_code c) {
  switch (c) {
    case input_error_code::undeclared: return "undeclared";
    case input_error_code::missing_required: return "missing_required";
    case input_error_code::wrong_type: return "wrong_type";
    case input_error_code::wrong_width: return "wrong_width";
    case input_error_code::not_covering_prompt: return "not_covering_prompt";
    case input_error_code::position_outside: return "position_outside";
  }
  return "unknown";
}

std::string input_error::message() const {
  return "request input '" + input + "': " + reason + " (" + std::string(name(code)) + ")";
}

// ---- request inputs ---------------------------------------------------------------------------------

result<void, input_error> check_inputs(const families::model_schema& schema, std::int64_t prompt_tokens, const request_inputs& inputs) {
  for (const auto& [name, v] : inputs)
    if (!schema.find_input(name)) return unexpected(input_error{input_error_code::undeclared, name, "the model declares no such input"});
  for (const auto& d : schema.request_inputs()) {
    auto it = inputs.find(d.name);
    if (it == inputs.end()) {
      if (d.presence == families::input_presence::required)
        return unexpected(input_error{input_error_code::missing_required, d.name, "required by the model and not given"});
      continue;
    }
    const auto& v = it->second;
    if (v.values.type() != d.element)
      return unexpected(input_error{input_error_code::wrong_type, d.name,
                                    "values are " + std::string(name(v.values.type())) + ", the model declares " +
                                        std::string(name(d.element))});
    const auto dims = v.values.shape().dims();
    const bool width_ok = dims.size() == d.width.size() + 1 && std::equal(d.width.begin(), d.width.end(), dims.begin() + 1);
    if (!width_ok) return unexpected(input_error{input_error_code::wrong_width, d.name, "values are " + v.values.shape().str() + ", not [n, width...]"});
    const std::int64_t n = dims[0];
    if (v.positions.empty()) {
      const std::int64_t want = d.extent == families::input_extent::per_position ? prompt_tokens : 1;
      if (n != want)
        return unexpected(input_error{input_error_code::not_covering_prompt, d.name,
                                      "a dense value needs " + std::to_string(want) + " rows, got " + std::to_string(n)});
      continue;
    }
    if (d.extent == families::input_extent::per_row)
      return unexpected(input_error{input_error_code::position_outside, d.name, "a per-row input takes no positions"});
    if (static_cast<std::int64_t>(v.positions.size()) != n)
      return unexpected(input_error{input_error_code::not_covering_prompt, d.name, "one position per values row is needed"});
    std::set<std::int64_t> seen;
    for (auto p : v.positions) {
      if (p < 0 || p >= prompt_tokens)
        return unexpected(input_error{input_error_code::position_outside, d.name,
                                      "position " + std::to_string(p) + " is outside the prompt of " + std::to_string(prompt_tokens) + " tokens"});
      if (!seen.insert(p).second)
        return unexpected(input_error{input_error_code::position_outside, d.name, "position " + std::to_string(p) + " repeats"});
    }
  }
  return {};
}

// ---- binding ------------------------------------------------------------------------------------------
// The seed's carried inputs: a step's entry carries the inputs its rows give over the positions they
// feed (entry_key::carried); each is bound by one routine, from each row's sequence's values sliced by
// the positions the row feeds, padded (the declaration's pad) elsewhere.

void driver_state::index_inputs(sequence& s) const {
  const auto& schema = handle->model().schema();
  for (const auto& [name, v] : s.req.inputs) {
    const auto* d = schema.find_input(name);
    if (!d) continue;  // refused at admission
    auto& rows = s.input_rows[name];
    if (d->extent == families::input_extent::per_row) {
      rows = {0};
      continue;
    }
    rows.assign(static_cast<std::size_t>(s.prompt_len), -1);
    if (v.positions.empty()) {
      for (std::int64_t i = 0; i < s.prompt_len; ++i) rows[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    } else {
      for (std::size_t i = 0; i < v.positions.size(); ++i) rows[static_cast<std::size_t>(v.positions[i])] = static_cast<std::int32_t>(i);
    }
  }
}

std::vector<std::string> driver_state::carried_for(const sequence& s, std::int64_t first, std::int64_t n) const {
  std::vector<std::string> out;
  if (s.input_rows.empty()) return out;
  const auto& schema = handle->model().schema();
  for (const auto& d : schema.request_inputs()) {  // in the schema's order: one key per combination
    const auto it = s.input_rows.find(d.name);
    if (it == s.input_rows.end()) continue;
    if (d.extent == families::input_extent::per_row) {
      out.push_back(d.name);
      continue;
    }
    const auto& rows = it->second;
    for (std::int64_t p = std::max<std::int64_t>(first, 0); p < first + n && p < static_cast<std::int64_t>(rows.size()); ++p)
      if (rows[static_cast<std::size_t>(p)] >= 0) {
        out.push_back(d.name);
        break;
      }
  }
  return out;
}

// attend_until lets a position see keys after it: every such key must be written in the same step.
std::int64_t driver_state::whole_spans(const sequence& s, std::int64_t n) const {
  const auto it = s.input_rows.find("attend_until");
  const auto iv = s.req.inputs.find("attend_until");
  if (it == s.input_rows.end() || iv == s.req.inputs.end()) return n;
  const auto* until = iv->second.values.as<std::int32_t>();
  const std::int64_t end = s.computed + n;
  for (std::int64_t q = s.computed; q < end && q < static_cast<std::int64_t>(it->second.size()); ++q) {
    const auto row = it->second[static_cast<std::size_t>(q)];
    if (row < 0 || until[row] < end) continue;
    // The span reaching past the chunk starts here: end the chunk before it, or take it whole.
    return q > s.computed ? q - s.computed : std::max<std::int64_t>(n, until[row] + 1 - s.computed);
  }
  return n;
}

std::shared_ptr<const tensor> driver_state::carried_value(const std::string& name, std::int64_t rows, std::int64_t tokens,
                                                          const step_values& v) const {
  const auto* d = handle->model().schema().find_input(name);
  if (!d) return nullptr;
  const bool per_row = d->extent == families::input_extent::per_row;
  std::vector<std::int64_t> dims{per_row ? rows : rows * tokens};
  dims.insert(dims.end(), d->width.begin(), d->width.end());
  auto out = std::make_shared<tensor>(d->element, troupe::shape(std::span<const std::int64_t>(dims)));
  const std::int64_t width = out->numel() / dims[0];
  const auto esize = static_cast<std::int64_t>(info(d->element).block_bytes);
  const std::int64_t row_bytes = width * esize;
  // The pad, in the element type, for one row.
  std::vector<std::uint8_t> pad(static_cast<std::size_t>(row_bytes));
  for (std::int64_t i = 0; i < width; ++i) {
    auto* at = pad.data() + i * esize;
    switch (d->element) {
      case dtype::f32: { const float f = static_cast<float>(d->pad); std::memcpy(at, &f, 4); break; }
      case dtype::i32: { const std::int32_t x = static_cast<std::int32_t>(d->pad); std::memcpy(at, &x, 4); break; }
      case dtype::i64: { const std::int64_t x = static_cast<std::int64_t>(d->pad); std::memcpy(at, &x, 8); break; }
      default: std::memset(at, 0, static_cast<std::size_t>(esize)); break;
    }
  }
  auto* dst = reinterpret_cast<std::uint8_t*>(out->data());
  for (std::int64_t i = 0; i < dims[0]; ++i) std::memcpy(dst + i * row_bytes, pad.data(), static_cast<std::size_t>(row_bytes));
  const auto* pos = v.positions.data() ? reinterpret_cast<const std::int32_t*>(v.positions.data()) : nullptr;
  const auto* write = v.kv_write_map.data() ? reinterpret_cast<const std::int32_t*>(v.kv_write_map.data()) : nullptr;
  for (std::int64_t r = 0; r < rows && r < static_cast<std::int64_t>(v.row_seqs.size()); ++r) {
    const auto* s = v.row_seqs[static_cast<std::size_t>(r)];
    if (!s) continue;
    const auto rit = s->input_rows.find(name);
    const auto vit = s->req.inputs.find(name);
    if (rit == s->input_rows.end() || vit == s->req.inputs.end()) continue;
    const auto* src = reinterpret_cast<const std::uint8_t*>(vit->second.values.data());
    if (per_row) {
      std::memcpy(dst + r * row_bytes, src, static_cast<std::size_t>(row_bytes));
      continue;
    }
    for (std::int64_t t = 0; t < tokens && pos && write; ++t) {
      const auto i = r * tokens + t;
      if (write[i] < 0) continue;  // padding
      const std::int64_t p = pos[i];
      if (p < 0 || p >= static_cast<std::int64_t>(rit->second.size())) continue;
      const auto row = rit->second[static_cast<std::size_t>(p)];
      if (row >= 0) std::memcpy(dst + i * row_bytes, src + row * row_bytes, static_cast<std::size_t>(row_bytes));
    }
  }
  return out;
}

}  // namespace troupe::driver
