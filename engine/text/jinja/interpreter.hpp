#pragma once
// Renders a parsed template. The semantics are @huggingface/jinja's (the JavaScript implementation
// transformers.js and most serving stacks render chat templates with), so output matches it byte for
// byte: `true` prints "true", 1.0 prints "1.0", `s.strip('x')` strips whitespace, undefined prints
// nothing. Where the reference refuses something Jinja allows (divisibleby, select, round, string
// comparison, ...), the renderer follows Jinja. Runaway templates end in typed errors, never in
// unbounded memory or stack: see render_limits.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/result.hpp"
#include "engine/text/jinja/ast.hpp"
#include "engine/text/jinja/value.hpp"
#include "engine/text/template_error.hpp"

namespace troupe::text::jinja {

struct render_limits {
  std::size_t max_output_bytes = std::size_t{16} << 20;  // the output, and any one string or JSON text
  std::size_t max_loop_iterations = 1'000'000;           // for-loop items in a render; also any list's length
  int max_recursion_depth = 500;                         // nested evaluation: macro calls and expressions
};

// The wall-clock date strftime_now formats, supplied by the caller so rendering stays deterministic.
struct calendar_time {
  int year = 1970;
  int month = 1;  // 1-12
  int day = 1;    // 1-31
  int hour = 0;
  int minute = 0;
};

struct render_settings {
  render_limits limits;
  calendar_time now;
};

// The variables a render starts with, in order. Names of the globals (range, namespace, true, ...)
// are refused, as the reference refuses to redeclare them.
using variables = std::vector<std::pair<std::string, value>>;

result<std::string, template_error> render(const program& p, const variables& vars, const render_settings& settings);

}  // namespace troupe::text::jinja
