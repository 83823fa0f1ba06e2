#include "engine/text/jinja/interpreter.hpp"

#include <algorithm>
#include <cmath>

#include "engine/text/jinja/detail/evaluator.hpp"

namespace troupe::text::jinja {
namespace {

// Which of the special macro arguments a macro body reads.
constexpr int reads_kwargs = 1;
constexpr int reads_varargs = 2;

void scan_special_args(const node& n, int& found) {
  if (n.kind == node_kind::identifier) {
    if (n.name == "kwargs") found |= reads_kwargs;
    if (n.name == "varargs") found |= reads_varargs;
  }
  for (const auto* list : {&n.args, &n.params, &n.body, &n.alternate})
    for (const auto& c : *list)
      if (c) scan_special_args(*c, found);
}

int special_args_of(const node_list& params, const node_list& body) {
  int found = 0;
  for (const auto& s : body) scan_special_args(*s, found);
  for (const auto& p : params) {
    if (p->name == "kwargs") found &= ~reads_kwargs;
    if (p->name == "varargs") found &= ~reads_varargs;
  }
  return found;
}

// Fills in the place of an error that does not have one yet: the innermost node it passed.
template <class T>
fallible<T> located(fallible<T> r, const node& n) {
  if (!r && r.error().line == 0) {
    r.error().line = n.line;
    r.error().column = n.column;
  }
  return r;
}

// A readable name for what a call tried to call: `foo`, `x.strip`, or "the expression".
std::string callee_label(const node& callee) {
  if (callee.kind == node_kind::identifier) return "'" + callee.name + "'";
  if (callee.kind == node_kind::member && !callee.flag && callee.args[1]->kind == node_kind::identifier)
    return "method '" + callee.args[1]->name + "'";
  return "the called expression";
}

}  // namespace

const value* environment::lookup(std::string_view name) const {
  for (const environment* e = this; e != nullptr; e = e->parent_.get())
    for (const auto& [k, v] : e->vars_)
      if (k == name) return &v;
  return nullptr;
}

void environment::set(std::string_view name, value v) {
  for (auto& [k, existing] : vars_)
    if (k == name) {
      existing = std::move(v);
      return;
    }
  vars_.emplace_back(std::string(name), std::move(v));
}

evaluator::~evaluator() {
  std::vector<ordered_map> contents;
  contents.reserve(namespaces_.size());
  for (auto& ns : namespaces_) {
    contents.push_back(std::move(ns->entries));
    ns->entries = ordered_map{};
  }
  contents.clear();
  namespaces_.clear();
}

fallible<std::string> evaluator::render(const program& p, const variables& vars) {
  auto globals = std::make_shared<environment>();
  add_globals(*globals);
  for (const auto& [k, v] : vars) {
    if (is_global_name(k))
      return troupe::unexpected(error(template_error_code::invalid_input, "variable '" + k + "' is already declared"));
    globals->set(k, v);
  }
  std::string out;
  auto r = exec_block(p.body, globals, out);
  if (!r) return troupe::unexpected(std::move(r.error()));
  return out;
}

fallible<void> evaluator::enter() {
  if (++depth_ > settings_.limits.max_recursion_depth) {
    --depth_;
    return troupe::unexpected(error(template_error_code::recursion_limit,
                                    "evaluation nests deeper than the recursion limit of " +
                                        std::to_string(settings_.limits.max_recursion_depth)));
  }
  return {};
}

fallible<void> evaluator::append(std::string& out, std::string_view text) const {
  if (out.size() + text.size() > settings_.limits.max_output_bytes)
    return troupe::unexpected(error(template_error_code::output_limit,
                                    "the output grew past the limit of " +
                                        std::to_string(settings_.limits.max_output_bytes) + " bytes"));
  out.append(text);
  return {};
}

fallible<void> evaluator::count_iterations(std::size_t n) {
  iterations_ += n;
  if (iterations_ > settings_.limits.max_loop_iterations)
    return troupe::unexpected(error(template_error_code::loop_limit,
                                    "more than " + std::to_string(settings_.limits.max_loop_iterations) +
                                        " loop iterations"));
  return {};
}

fallible<value> evaluator::make_string(std::string s) const {
  if (s.size() > settings_.limits.max_output_bytes)
    return troupe::unexpected(error(template_error_code::output_limit,
                                    "a string grew past the limit of " +
                                        std::to_string(settings_.limits.max_output_bytes) + " bytes"));
  return value::string(std::move(s));
}

fallible<value> evaluator::make_list(std::vector<value> items, bool tuple) const {
  if (items.size() > settings_.limits.max_loop_iterations)
    return troupe::unexpected(error(template_error_code::loop_limit,
                                    "a list grew past the limit of " +
                                        std::to_string(settings_.limits.max_loop_iterations) + " items"));
  auto v = value::list(std::move(items), tuple);
  if (v.depth() > settings_.limits.max_recursion_depth)
    return troupe::unexpected(error(template_error_code::recursion_limit, "lists nest deeper than the recursion limit"));
  return v;
}

fallible<value> evaluator::make_map(ordered_map entries) const {
  auto v = value::map(jinja::make_map(std::move(entries)));
  if (v.depth() > settings_.limits.max_recursion_depth)
    return troupe::unexpected(error(template_error_code::recursion_limit, "maps nest deeper than the recursion limit"));
  return v;
}

value evaluator::make_namespace(ordered_map entries) {
  auto m = std::make_shared<map_data>();
  m->entries = std::move(entries);
  namespaces_.push_back(m);
  return value::name_space(std::move(m));
}

fallible<std::string> evaluator::display(const value& v) const {
  return display_string(v, settings_.limits.max_output_bytes, settings_.limits.max_recursion_depth);
}
fallible<std::string> evaluator::raw(const value& v) const {
  return raw_string(v, settings_.limits.max_output_bytes, settings_.limits.max_recursion_depth);
}
fallible<std::string> evaluator::json(const value& v, const json_options& o) const {
  return to_json(v, o, settings_.limits.max_output_bytes, settings_.limits.max_recursion_depth);
}

fallible<void> evaluator::exec_block(const node_list& statements, const env_ptr& env, std::string& out) {
  for (const auto& s : statements) TROUPE_JINJA_CHECK(exec(*s, env, out));
  return {};
}

fallible<void> evaluator::exec(const node& n, const env_ptr& env, std::string& out) {
  TROUPE_JINJA_CHECK(enter());
  auto r = located(exec_node(n, env, out), n);
  leave();
  return r;
}

fallible<void> evaluator::exec_node(const node& n, const env_ptr& env, std::string& out) {
  switch (n.kind) {
    case node_kind::text: return append(out, n.name);
    case node_kind::comment: return {};
    case node_kind::set: return exec_set(n, env);
    case node_kind::if_block: {
      TROUPE_JINJA_TRY(test, eval(*n.args[0], env));
      return exec_block(test.truthy() ? n.body : n.alternate, env, out);
    }
    case node_kind::for_loop: return exec_for(n, env, out);
    case node_kind::macro: {
      TROUPE_JINJA_TRY(m, define_macro(n, env));
      env->set(n.name, std::move(m));
      return {};
    }
    case node_kind::break_loop:
    case node_kind::continue_loop:
      // The nearest enclosing loop (in the call chain, as in the reference) catches this.
      control_ = n.kind == node_kind::break_loop ? loop_control::break_loop : loop_control::continue_loop;
      return troupe::unexpected(
          type_error(std::string(n.kind == node_kind::break_loop ? "'break'" : "'continue'") + " outside a for loop"));
    case node_kind::call_block:
    case node_kind::filter_block:
    default: {
      value v;
      if (n.kind == node_kind::call_block) {
        TROUPE_JINJA_TRY(r, exec_call_block(n, env));
        v = std::move(r);
      } else if (n.kind == node_kind::filter_block) {
        std::string body;
        TROUPE_JINJA_CHECK(exec_block(n.body, env, body));
        TROUPE_JINJA_TRY(text, make_string(std::move(body)));
        TROUPE_JINJA_TRY(r, eval_filter(*n.args[0], text, env));
        v = std::move(r);
      } else {
        TROUPE_JINJA_TRY(r, eval(n, env));
        v = std::move(r);
      }
      if (v.is_none() || v.is_undefined()) return {};
      TROUPE_JINJA_TRY(text, display(v));
      return append(out, text);
    }
  }
}

fallible<void> evaluator::exec_set(const node& n, const env_ptr& env) {
  value rhs;
  if (n.args.size() > 1) {
    TROUPE_JINJA_TRY(v, eval(*n.args[1], env));
    rhs = std::move(v);
  } else {
    std::string body;
    TROUPE_JINJA_CHECK(exec_block(n.body, env, body));
    TROUPE_JINJA_TRY(v, make_string(std::move(body)));
    rhs = std::move(v);
  }
  const node& target = *n.args[0];
  switch (target.kind) {
    case node_kind::identifier: env->set(target.name, std::move(rhs)); return {};
    case node_kind::tuple_literal: {
      if (!rhs.is_list()) return troupe::unexpected(type_error("cannot unpack " + a_kind(rhs.kind()) + " in set"));
      const auto& items = rhs.as_list().items;
      if (items.size() != target.args.size())
        return troupe::unexpected(type_error(std::string("too ") + (target.args.size() > items.size() ? "few" : "many") +
                                             " items to unpack in set"));
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (target.args[i]->kind != node_kind::identifier)
          return troupe::unexpected(type_error("cannot unpack into something that is not a name in set"));
        env->set(target.args[i]->name, items[i]);
      }
      return {};
    }
    case node_kind::member: {
      TROUPE_JINJA_TRY(object, eval(*target.args[0], env));
      if (!object.is_namespace())
        return troupe::unexpected(type_error("cannot assign an attribute of " + a_kind(object.kind()) +
                                             "; only of a namespace"));
      if (target.args[1]->kind != node_kind::identifier)
        return troupe::unexpected(type_error("cannot assign to a member that is not a name"));
      object.mutable_map().entries.set(target.args[1]->name, std::move(rhs));
      return {};
    }
    default: return troupe::unexpected(type_error("cannot assign to this expression"));
  }
}

fallible<void> evaluator::bind_target(const node& target, const value& item, const env_ptr& env) {
  if (target.kind == node_kind::identifier) {
    env->set(target.name, item);
    return {};
  }
  const auto& items = item.as_list().items;
  for (std::size_t j = 0; j < target.args.size(); ++j) {
    if (target.args[j]->kind != node_kind::identifier)
      return troupe::unexpected(type_error("cannot unpack into something that is not a name"));
    env->set(target.args[j]->name, items[j]);
  }
  return {};
}

fallible<void> evaluator::exec_for(const node& n, const env_ptr& env, std::string& out) {
  auto scope = std::make_shared<environment>(env);
  const node& target = *n.args[0];
  const node& iter_node = *n.args[1];
  const node* condition = nullptr;
  value iterable;
  if (iter_node.kind == node_kind::select) {
    TROUPE_JINJA_TRY(v, eval(*iter_node.args[0], scope));
    iterable = std::move(v);
    condition = iter_node.args[1].get();
  } else {
    TROUPE_JINJA_TRY(v, eval(iter_node, scope));
    iterable = std::move(v);
  }
  std::vector<value> keys;
  const std::vector<value>* items = nullptr;
  if (iterable.is_list()) {
    items = &iterable.as_list().items;
  } else if (iterable.is_map()) {
    for (const auto& [k, v] : iterable.as_map().entries) keys.push_back(value::string(k));
    items = &keys;
  } else {
    return troupe::unexpected(type_error("cannot loop over " + a_kind(iterable.kind())));
  }

  std::vector<value> selected;
  for (const auto& item : *items) {
    TROUPE_JINJA_CHECK(count_iterations(1));
    if (target.kind == node_kind::tuple_literal) {
      if (!item.is_list() || item.as_list().tuple)
        return troupe::unexpected(type_error("cannot unpack " + (item.is_list() ? std::string("a tuple") : a_kind(item.kind())) + " into loop variables"));
      const auto size = item.as_list().items.size();
      if (size != target.args.size())
        return troupe::unexpected(type_error(std::string("too ") + (target.args.size() > size ? "few" : "many") +
                                             " items to unpack"));
    }
    if (condition != nullptr) {
      auto loop_scope = std::make_shared<environment>(scope);
      TROUPE_JINJA_CHECK(bind_target(target, item, loop_scope));
      TROUPE_JINJA_TRY(keep, eval(*condition, loop_scope));
      if (!keep.truthy()) continue;
    }
    selected.push_back(item);
  }

  bool no_iteration = true;
  const auto count = static_cast<std::int64_t>(selected.size());
  for (std::int64_t i = 0; i < count; ++i) {
    const auto u = static_cast<std::size_t>(i);
    ordered_map loop;
    loop.set("index", value::integer(i + 1));
    loop.set("index0", value::integer(i));
    loop.set("revindex", value::integer(count - i));
    loop.set("revindex0", value::integer(count - i - 1));
    loop.set("first", value::boolean(i == 0));
    loop.set("last", value::boolean(i == count - 1));
    loop.set("length", value::integer(count));
    loop.set("previtem", i > 0 ? selected[u - 1] : value());
    loop.set("nextitem", i < count - 1 ? selected[u + 1] : value());
    scope->set("loop", value::map(jinja::make_map(std::move(loop))));
    TROUPE_JINJA_CHECK(bind_target(target, selected[u], scope));
    const std::size_t mark = out.size();
    auto r = exec_block(n.body, scope, out);
    if (!r) {
      if (control_ == loop_control::none) return r;
      // An iteration cut short by break or continue contributes nothing, as in the reference.
      const bool stop = control_ == loop_control::break_loop;
      control_ = loop_control::none;
      out.resize(mark);
      if (stop) break;
      continue;
    }
    no_iteration = false;
  }
  if (no_iteration) TROUPE_JINJA_CHECK(exec_block(n.alternate, scope, out));
  return {};
}

fallible<value> call_macro(evaluator& ev, int special_args, const char* display_name,
                           const node_list& params, const node_list& body, call_args args, const env_ptr& scope) {
  TROUPE_JINJA_CHECK(ev.enter());
  struct leave_guard {
    evaluator& e;
    ~leave_guard() { e.leave(); }
  } guard{ev};
  auto& positional = args.positional;
  ordered_map remaining;
  std::vector<std::pair<std::string, const node*>> pending_defaults;
  std::vector<std::string> taken;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const node& p = *params[i];
    value v;
    bool given = i < positional.size();
    if (given) {
      v = positional[i];
    } else if (const value* kw = args.keyword.find(p.name)) {
      v = *kw;
      given = true;
      taken.push_back(p.name);
    }
    if (!given && p.kind == node_kind::keyword_argument) pending_defaults.emplace_back(p.name, p.args[0].get());
    scope->set(p.name, given ? std::move(v) : value());
  }
  for (const auto& [k, v] : args.keyword)
    if (std::find(taken.begin(), taken.end(), k) == taken.end()) remaining.set(k, v);
  if (special_args & reads_kwargs) {
    TROUPE_JINJA_TRY(m, ev.make_map(std::move(remaining)));
    scope->set("kwargs", std::move(m));
  } else if (!remaining.empty()) {
    return troupe::unexpected(
        ev.type_error("macro " + std::string(display_name) + " takes no keyword argument '" + remaining.begin()->first + "'"));
  }
  if (special_args & reads_varargs) {
    std::vector<value> extra;
    for (std::size_t i = params.size(); i < positional.size(); ++i) extra.push_back(positional[i]);
    TROUPE_JINJA_TRY(l, ev.make_list(std::move(extra)));
    scope->set("varargs", std::move(l));
  } else if (positional.size() > params.size()) {
    return troupe::unexpected(ev.type_error("macro " + std::string(display_name) + " takes not more than " +
                                            std::to_string(params.size()) + " argument(s)"));
  }
  for (const auto& [pname, def] : pending_defaults) {
    TROUPE_JINJA_TRY(v, ev.eval(*def, scope));
    scope->set(pname, std::move(v));
  }
  std::string out;
  TROUPE_JINJA_CHECK(ev.exec_block(body, scope, out));
  return ev.make_string(std::move(out));
}

fallible<value> evaluator::define_macro(const node& n, const env_ptr&) {
  const int special = special_args_of(n.params, n.body);
  auto fn = std::make_shared<callable_data>();
  fn->name = n.name;
  const node* macro = &n;
  fn->fn = [macro, special](call_context& ctx, call_args args) -> fallible<value> {
    auto scope = std::make_shared<environment>(ctx.env());
    const std::string label = "'" + macro->name + "'";
    return call_macro(ctx.ev(), special, label.c_str(), macro->params, macro->body, std::move(args), scope);
  };
  return value::function(std::move(fn));
}

fallible<value> evaluator::exec_call_block(const node& n, const env_ptr& env) {
  const int special = special_args_of(n.params, n.body);
  auto caller = std::make_shared<callable_data>();
  caller->name = "caller";
  const node* block = &n;
  env_ptr defining = env;
  caller->fn = [block, special, defining](call_context& ctx, call_args args) -> fallible<value> {
    auto scope = std::make_shared<environment>(defining);
    return call_macro(ctx.ev(), special, "None", block->params, block->body, std::move(args), scope);
  };
  const node& call_node = *n.args[0];
  TROUPE_JINJA_TRY(args, eval_arguments(std::span<const node_ptr>(call_node.args).subspan(1), env));
  TROUPE_JINJA_TRY(fn, eval(*call_node.args[0], env));
  if (!fn.is_callable())
    return troupe::unexpected(error(fn.is_undefined() ? template_error_code::undefined_call : template_error_code::type_error,
                                    "'" + call_node.args[0]->name + "' is not a macro"));
  auto call_env = std::make_shared<environment>(env);
  call_env->set("caller", value::function(std::move(caller)));
  return call(fn, std::move(args), call_env, n);
}

fallible<value> evaluator::eval(const node& n, const env_ptr& env) {
  TROUPE_JINJA_CHECK(enter());
  auto r = located(eval_node(n, env), n);
  leave();
  return r;
}

fallible<value> evaluator::eval_node(const node& n, const env_ptr& env) {
  switch (n.kind) {
    case node_kind::integer_literal: return value::integer(n.int_value);
    case node_kind::float_literal: return value::floating(n.float_value);
    case node_kind::string_literal:
    case node_kind::text: return value::string(n.name);
    case node_kind::identifier: {
      const value* v = env->lookup(n.name);
      return v != nullptr ? *v : value();
    }
    case node_kind::list_literal:
    case node_kind::tuple_literal: {
      std::vector<value> items;
      items.reserve(n.args.size());
      for (const auto& a : n.args) {
        TROUPE_JINJA_TRY(v, eval(*a, env));
        items.push_back(std::move(v));
      }
      return make_list(std::move(items), n.kind == node_kind::tuple_literal);
    }
    case node_kind::map_literal: {
      ordered_map m;
      for (std::size_t i = 0; i + 1 < n.args.size(); i += 2) {
        TROUPE_JINJA_TRY(k, eval(*n.args[i], env));
        if (!k.is_string())
          return troupe::unexpected(type_error("map keys must be strings, not " + a_kind(k.kind())));
        TROUPE_JINJA_TRY(v, eval(*n.args[i + 1], env));
        m.set(k.as_string(), std::move(v));
      }
      return make_map(std::move(m));
    }
    case node_kind::call: return eval_call(n, env);
    case node_kind::member: return eval_member(n, env);
    case node_kind::unary: {
      TROUPE_JINJA_TRY(operand, eval(*n.args[0], env));
      return unary(n.name, operand);
    }
    case node_kind::binary: {
      TROUPE_JINJA_TRY(left, eval(*n.args[0], env));
      if (n.name == "and") return left.truthy() ? eval(*n.args[1], env) : left;
      if (n.name == "or") return left.truthy() ? left : eval(*n.args[1], env);
      TROUPE_JINJA_TRY(right, eval(*n.args[1], env));
      return binary(n.name, left, right);
    }
    case node_kind::filter: {
      TROUPE_JINJA_TRY(operand, eval(*n.args[0], env));
      return eval_filter(n, operand, env);
    }
    case node_kind::test: {
      TROUPE_JINJA_TRY(operand, eval(*n.args[0], env));
      std::vector<value> args;
      for (std::size_t i = 1; i < n.args.size(); ++i) {
        TROUPE_JINJA_TRY(v, eval(*n.args[i], env));
        args.push_back(std::move(v));
      }
      TROUPE_JINJA_TRY(ok, test(n.name, operand, args));
      return value::boolean(n.flag ? !ok : ok);
    }
    case node_kind::select: {
      TROUPE_JINJA_TRY(cond, eval(*n.args[1], env));
      if (!cond.truthy()) return value();
      return eval(*n.args[0], env);
    }
    case node_kind::ternary: {
      TROUPE_JINJA_TRY(cond, eval(*n.args[0], env));
      return eval(*n.args[cond.truthy() ? 1 : 2], env);
    }
    default: return troupe::unexpected(type_error("this expression cannot be evaluated here"));
  }
}

fallible<call_args> evaluator::eval_arguments(std::span<const node_ptr> args, const env_ptr& env) {
  call_args out;
  // The positional part first (spreads included), then the keyword part, as Python evaluates them.
  for (const auto& a : args) {
    if (a->kind == node_kind::spread) {
      TROUPE_JINJA_TRY(v, eval(*a->args[0], env));
      if (!v.is_list()) return troupe::unexpected(type_error("cannot unpack " + a_kind(v.kind()) + " with *"));
      for (const auto& item : v.as_list().items) out.positional.push_back(item);
    } else if (a->kind != node_kind::keyword_argument && a->kind != node_kind::keyword_spread) {
      TROUPE_JINJA_TRY(v, eval(*a, env));
      out.positional.push_back(std::move(v));
    }
  }
  for (const auto& a : args) {
    if (a->kind == node_kind::keyword_argument) {
      if (out.keyword.find(a->name) != nullptr)
        return troupe::unexpected(type_error("got multiple values for keyword argument '" + a->name + "'"));
      TROUPE_JINJA_TRY(v, eval(*a->args[0], env));
      out.keyword.set(a->name, std::move(v));
    } else if (a->kind == node_kind::keyword_spread) {
      TROUPE_JINJA_TRY(v, eval(*a->args[0], env));
      if (!v.is_map())
        return troupe::unexpected(type_error("the argument after ** must be a mapping, not " + a_kind(v.kind())));
      for (const auto& [k, item] : v.as_map().entries) {
        if (out.keyword.find(k) != nullptr)
          return troupe::unexpected(type_error("got multiple values for keyword argument '" + k + "'"));
        out.keyword.set(k, item);
      }
    }
  }
  return out;
}

fallible<value> evaluator::eval_call(const node& n, const env_ptr& env) {
  TROUPE_JINJA_TRY(args, eval_arguments(std::span<const node_ptr>(n.args).subspan(1), env));
  TROUPE_JINJA_TRY(fn, eval(*n.args[0], env));
  if (!fn.is_callable()) {
    if (fn.is_undefined())
      return troupe::unexpected(error(template_error_code::undefined_call, callee_label(*n.args[0]) + " is undefined"));
    return troupe::unexpected(
        type_error(callee_label(*n.args[0]) + " is " + a_kind(fn.kind()) + ", not a function"));
  }
  return call(fn, std::move(args), env, n);
}

fallible<value> evaluator::call(const value& fn, call_args args, const env_ptr& env, const node& at) {
  call_context ctx(*this, env);
  return located(fn.as_callable().fn(ctx, std::move(args)), at);
}

fallible<value> evaluator::eval_member(const node& n, const env_ptr& env) {
  TROUPE_JINJA_TRY(object, eval(*n.args[0], env));
  const node& prop = *n.args[1];
  if (n.flag && prop.kind == node_kind::slice) {
    value parts[3];
    for (int i = 0; i < 3; ++i)
      if (prop.args[static_cast<std::size_t>(i)]) {
        TROUPE_JINJA_TRY(v, eval(*prop.args[static_cast<std::size_t>(i)], env));
        parts[i] = std::move(v);
      }
    return slice(object, parts[0], parts[1], parts[2]);
  }
  value property;
  if (n.flag) {
    TROUPE_JINJA_TRY(v, eval(prop, env));
    property = std::move(v);
  } else if (prop.kind == node_kind::integer_literal) {
    property = value::integer(prop.int_value);
  } else {
    property = value::string(prop.name);
  }
  return member(object, property);
}

fallible<value> evaluator::eval_filter(const node& n, const value& operand, const env_ptr& env) {
  TROUPE_JINJA_TRY(args, eval_arguments(std::span<const node_ptr>(n.args).subspan(1), env));
  return filter(n.name, operand, std::move(args), n.flag, env);
}

result<std::string, template_error> render(const program& p, const variables& vars, const render_settings& settings) {
  evaluator ev(settings);
  return ev.render(p, vars);
}

}  // namespace troupe::text::jinja
