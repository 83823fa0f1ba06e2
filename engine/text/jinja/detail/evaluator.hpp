#pragma once
// The renderer's state for one render: scopes, limits, the loop-control signal and the namespaces it
// made. Split over interpreter.cpp (statements, expressions, calls), operators.cpp (operators, member
// access and methods) and filters.cpp (filters and tests).
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/jinja/ast.hpp"
#include "engine/text/jinja/interpreter.hpp"
#include "engine/text/jinja/value.hpp"

// Propagates the error of a result-returning expression; otherwise declares `var` with its value.
#define TROUPE_JINJA_CAT2(a, b) a##b
#define TROUPE_JINJA_CAT(a, b) TROUPE_JINJA_CAT2(a, b)
#define TROUPE_JINJA_TRY(var, expr)                                                        \
  auto TROUPE_JINJA_CAT(try_result_, __LINE__) = (expr);                                   \
  if (!TROUPE_JINJA_CAT(try_result_, __LINE__))                                            \
    return ::troupe::unexpected(std::move(TROUPE_JINJA_CAT(try_result_, __LINE__).error())); \
  auto var = std::move(*TROUPE_JINJA_CAT(try_result_, __LINE__))
#define TROUPE_JINJA_CHECK(expr)                                                         \
  do {                                                                                   \
    auto check_result_ = (expr);                                                         \
    if (!check_result_) return ::troupe::unexpected(std::move(check_result_.error()));   \
  } while (0)

namespace troupe::text::jinja {

template <class T>
using fallible = result<T, template_error>;

// A scope: variables set here, and the scope it sits in.
class environment {
 public:
  explicit environment(std::shared_ptr<environment> parent = nullptr) : parent_(std::move(parent)) {}
  const value* lookup(std::string_view name) const;
  void set(std::string_view name, value v);

 private:
  std::shared_ptr<environment> parent_;
  std::vector<std::pair<std::string, value>> vars_;
};
using env_ptr = std::shared_ptr<environment>;

class evaluator;

// What a callable sees of its call: the renderer and the scope it was called from (macros run in a
// scope below their caller's, as in the reference).
class call_context {
 public:
  call_context(evaluator& ev, env_ptr env) : ev_(ev), env_(std::move(env)) {}
  evaluator& ev() const { return ev_; }
  const env_ptr& env() const { return env_; }

 private:
  evaluator& ev_;
  env_ptr env_;
};

class evaluator {
 public:
  explicit evaluator(const render_settings& settings) : settings_(settings) {}
  ~evaluator();
  evaluator(const evaluator&) = delete;
  evaluator& operator=(const evaluator&) = delete;

  fallible<std::string> render(const program& p, const variables& vars);

  // Statements append to `out`; expressions give values.
  fallible<void> exec_block(const node_list& statements, const env_ptr& env, std::string& out);
  fallible<void> exec(const node& n, const env_ptr& env, std::string& out);
  fallible<value> eval(const node& n, const env_ptr& env);
  fallible<value> call(const value& fn, call_args args, const env_ptr& env, const node& at);
  fallible<call_args> eval_arguments(std::span<const node_ptr> args, const env_ptr& env);

  // operators.cpp
  fallible<value> binary(std::string_view op, const value& left, const value& right);
  fallible<value> unary(std::string_view op, const value& operand);
  fallible<value> member(const value& object, const value& property);
  fallible<value> slice(const value& object, const value& start, const value& stop, const value& step);

  // filters.cpp
  fallible<value> filter(std::string_view name, const value& operand, call_args args, bool called,
                         const env_ptr& env);
  fallible<bool> test(std::string_view name, const value& operand, std::span<const value> args);
  // Orders values as the reference's sort does (numbers with numbers, strings with strings).
  fallible<int> compare(const value& a, const value& b, bool case_sensitive);

  // Values with the limits applied.
  fallible<value> make_string(std::string s) const;
  fallible<value> make_list(std::vector<value> items, bool tuple = false) const;
  fallible<value> make_map(ordered_map entries) const;
  value make_namespace(ordered_map entries);
  fallible<std::string> display(const value& v) const;
  fallible<std::string> raw(const value& v) const;
  fallible<std::string> json(const value& v, const json_options& o) const;
  fallible<void> count_iterations(std::size_t n);

  const render_settings& settings() const { return settings_; }
  template_error error(template_error_code code, std::string message) const { return value_error(code, std::move(message)); }
  template_error type_error(std::string message) const { return error(template_error_code::type_error, std::move(message)); }

 private:
  enum class loop_control { none, break_loop, continue_loop };

  fallible<value> eval_node(const node& n, const env_ptr& env);
  fallible<void> exec_node(const node& n, const env_ptr& env, std::string& out);
  fallible<void> exec_set(const node& n, const env_ptr& env);
  fallible<void> exec_for(const node& n, const env_ptr& env, std::string& out);
  fallible<void> bind_target(const node& target, const value& item, const env_ptr& env);
  fallible<value> exec_call_block(const node& n, const env_ptr& env);
  fallible<value> eval_call(const node& n, const env_ptr& env);
  fallible<value> eval_member(const node& n, const env_ptr& env);
  fallible<value> eval_filter(const node& n, const value& operand, const env_ptr& env);
  fallible<value> define_macro(const node& n, const env_ptr& env);
  fallible<void> append(std::string& out, std::string_view text) const;
  fallible<void> enter();
  void leave() { --depth_; }

  friend fallible<value> call_macro(evaluator& ev, int special_args, const char* display_name,
                                    const node_list& params, const node_list& body, call_args args,
                                    const env_ptr& scope);

  const render_settings& settings_;
  int depth_ = 0;
  std::size_t iterations_ = 0;
  loop_control control_ = loop_control::none;
  // Every namespace this render made: emptied when the render ends, which breaks reference cycles
  // (`{% set ns.self = ns %}`) and keeps long chains from being freed recursively.
  std::vector<std::shared_ptr<map_data>> namespaces_;
};

// The globals every render starts with: range, namespace, dict, raise_exception, strftime_now and the
// constants true, false, none (also True, False, None).
void add_globals(environment& env);
bool is_global_name(std::string_view name);

}  // namespace troupe::text::jinja
