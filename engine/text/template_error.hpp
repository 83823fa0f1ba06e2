#pragma once
// The one error type of chat templates: a template that does not parse, or a render that fails. The
// code is the failure class a caller may branch on; message says what went wrong, in the words of the
// template for raise_exception; line and column point into the template source where that helps.
#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::text {

enum class template_error_code {
  syntax_error,     // the source does not parse
  unknown_filter,   // `x | name` with a filter troupe does not know
  unknown_test,     // `x is name` with a test troupe does not know
  type_error,       // an operation, filter, test or method applied to values it does not take
  undefined_call,   // a call of something undefined: a misspelled function or a missing method
  raise_exception,  // the template refused its input via raise_exception(message)
  output_limit,     // the rendered text (or a string built on the way) grew past the output limit
  loop_limit,       // more loop iterations (or list items) than the loop limit
  recursion_limit,  // nesting deeper than the recursion limit: macro calls, expressions, values
  invalid_input,    // the messages, tools or extra variables given to render are not usable JSON
};

std::string_view name(template_error_code code);

struct template_error {
  template_error_code code = template_error_code::syntax_error;
  std::string message;
  std::size_t line = 0;    // 1-based; 0 when the error is not tied to a place in the source
  std::size_t column = 0;  // 1-based, in code points

  // "3:14: unknown filter 'shout' (unknown_filter)", or "message (code)" without a place.
  std::string describe() const;
};

}  // namespace troupe::text
