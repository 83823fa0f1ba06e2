// Request inputs checked against the model's schema at admission (driver.hpp: check_inputs).
#include <set>

#include "engine/driver/driver.hpp"

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

}  // namespace troupe::driver
