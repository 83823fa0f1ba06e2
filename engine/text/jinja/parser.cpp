#include "engine/text/jinja/parser.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace troupe::text::jinja {
namespace {

template <class T>
using parsed = result<T, template_error>;

#define TROUPE_PARSE_TRY(var, expr)                                       \
  auto var##_result = (expr);                                             \
  if (!var##_result) return troupe::unexpected(std::move(var##_result.error())); \
  auto var = std::move(*var##_result)

#define TROUPE_PARSE_CHECK(expr)                                   \
  do {                                                             \
    auto check_result_ = (expr);                                   \
    if (!check_result_) return troupe::unexpected(std::move(check_result_.error())); \
  } while (0)

std::string_view describe(token_kind k) {
  switch (k) {
    case token_kind::text: return "text";
    case token_kind::numeric_literal: return "number";
    case token_kind::string_literal: return "string";
    case token_kind::identifier: return "name";
    case token_kind::equals: return "'='";
    case token_kind::open_paren: return "'('";
    case token_kind::close_paren: return "')'";
    case token_kind::open_statement: return "'{%'";
    case token_kind::close_statement: return "'%}'";
    case token_kind::open_expression: return "'{{'";
    case token_kind::close_expression: return "'}}'";
    case token_kind::open_square: return "'['";
    case token_kind::close_square: return "']'";
    case token_kind::open_curly: return "'{'";
    case token_kind::close_curly: return "'}'";
    case token_kind::comma: return "','";
    case token_kind::dot: return "'.'";
    case token_kind::colon: return "':'";
    case token_kind::pipe: return "'|'";
    case token_kind::additive:
    case token_kind::multiplicative:
    case token_kind::exponent:
    case token_kind::comparison:
    case token_kind::unary: return "operator";
    case token_kind::comment: return "comment";
  }
  return "token";
}

class parser {
 public:
  parser(const std::vector<token>& tokens, const parse_options& options) : tokens_(tokens), options_(options) {}

  parsed<program> run() {
    program p;
    while (current_ < tokens_.size()) {
      TROUPE_PARSE_TRY(statement, parse_any());
      p.body.push_back(std::move(statement));
    }
    return p;
  }

 private:
  // Counts recursion in the parser itself, so `((((...` is refused before it exhausts the stack.
  class nesting_guard {
   public:
    explicit nesting_guard(parser& p) : p_(p) { ++p_.nesting_; }
    ~nesting_guard() { --p_.nesting_; }
    nesting_guard(const nesting_guard&) = delete;
    nesting_guard& operator=(const nesting_guard&) = delete;

   private:
    parser& p_;
  };

  template_error error_at(std::string message, std::size_t index) const {
    template_error e;
    e.code = template_error_code::syntax_error;
    e.message = std::move(message);
    const token* t = index < tokens_.size() ? &tokens_[index] : (tokens_.empty() ? nullptr : &tokens_.back());
    if (t != nullptr) {
      e.line = t->line;
      e.column = t->column;
    }
    return e;
  }
  template_error error(std::string message) const { return error_at(std::move(message), current_); }
  template_error unexpected_end(std::string_view expected) const {
    return error("unexpected end of template, expected " + std::string(expected));
  }

  result<void, template_error> check_nesting() const {
    if (nesting_ > options_.max_depth)
      return troupe::unexpected(error("the template nests deeper than " + std::to_string(options_.max_depth) +
                                      " levels"));
    return {};
  }

  node_ptr make(node_kind kind, std::size_t token_index) const {
    auto n = std::make_unique<node>();
    n->kind = kind;
    const std::size_t i = std::min(token_index, tokens_.empty() ? 0 : tokens_.size() - 1);
    if (!tokens_.empty()) {
      n->line = tokens_[i].line;
      n->column = tokens_[i].column;
    }
    return n;
  }
  // Computes a finished node's depth from its children and refuses trees deeper than the limit.
  parsed<node_ptr> finish(node_ptr n) const {
    int d = 0;
    for (const auto* list : {&n->args, &n->params, &n->body, &n->alternate})
      for (const auto& c : *list)
        if (c) d = std::max(d, c->depth);
    n->depth = d + 1;
    if (n->depth > options_.max_depth)
      return troupe::unexpected(error("the template nests deeper than " + std::to_string(options_.max_depth) +
                                      " levels"));
    return n;
  }

  bool at_end() const { return current_ >= tokens_.size(); }
  bool is(token_kind k, std::size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].kind == k;
  }
  bool is_identifier(std::string_view name, std::size_t ahead = 0) const {
    return is(token_kind::identifier, ahead) && tokens_[current_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(token_kind::open_statement) || !is(token_kind::identifier, 1)) return false;
    const auto& v = tokens_[current_ + 1].value;
    return std::find(names.begin(), names.end(), v) != names.end();
  }
  result<void, template_error> expect(token_kind k, std::string_view what) {
    if (at_end()) return troupe::unexpected(unexpected_end(what));
    if (tokens_[current_].kind != k)
      return troupe::unexpected(
          error("expected " + std::string(what) + ", found " + std::string(describe(tokens_[current_].kind))));
    ++current_;
    return {};
  }
  result<void, template_error> expect_identifier(std::string_view name) {
    if (!is_identifier(name)) return troupe::unexpected(error("expected '" + std::string(name) + "'"));
    ++current_;
    return {};
  }
  // Statements until one of `names` opens; the block tag itself is left for the caller.
  result<void, template_error> parse_block_until(std::initializer_list<std::string_view> names, node_list& out,
                                                 std::string_view expected) {
    while (!is_statement(names)) {
      if (at_end()) return troupe::unexpected(unexpected_end(expected));
      TROUPE_PARSE_TRY(statement, parse_any());
      out.push_back(std::move(statement));
    }
    return {};
  }
  result<void, template_error> expect_end_tag(std::string_view name) {
    TROUPE_PARSE_CHECK(expect(token_kind::open_statement, "'{%'"));
    TROUPE_PARSE_CHECK(expect_identifier(name));
    return expect(token_kind::close_statement, "'%}'");
  }

  parsed<node_ptr> parse_any();
  parsed<node_ptr> parse_statement();
  parsed<node_ptr> parse_set(std::size_t start);
  parsed<node_ptr> parse_if(std::size_t start);
  parsed<node_ptr> parse_macro(std::size_t start);
  parsed<node_ptr> parse_for(std::size_t start);
  parsed<node_ptr> parse_expression_sequence(bool primary);
  parsed<node_ptr> parse_expression();
  parsed<node_ptr> parse_or();
  parsed<node_ptr> parse_and();
  parsed<node_ptr> parse_not();
  parsed<node_ptr> parse_comparison();
  parsed<node_ptr> parse_additive();
  parsed<node_ptr> parse_multiplicative();
  parsed<node_ptr> parse_power();
  parsed<node_ptr> parse_test();
  parsed<node_ptr> parse_filter();
  parsed<node_ptr> parse_unary_sign();
  parsed<node_ptr> parse_call_member();
  parsed<node_ptr> parse_postfix(node_ptr object);
  parsed<node_ptr> parse_call(node_ptr callee);
  result<void, template_error> parse_arguments(node_list& out, bool parameters);
  parsed<node_ptr> parse_subscript();
  parsed<node_ptr> parse_primary();
  parsed<node_ptr> binary(std::string op, node_ptr left, node_ptr right, std::size_t at) {
    auto n = make(node_kind::binary, at);
    n->name = std::move(op);
    n->args.push_back(std::move(left));
    n->args.push_back(std::move(right));
    return finish(std::move(n));
  }

  const std::vector<token>& tokens_;
  parse_options options_;
  std::size_t current_ = 0;
  int nesting_ = 0;
};

parsed<node_ptr> parser::parse_any() {
  nesting_guard guard(*this);
  TROUPE_PARSE_CHECK(check_nesting());
  const token& t = tokens_[current_];
  switch (t.kind) {
    case token_kind::comment:
    case token_kind::text: {
      auto n = make(t.kind == token_kind::text ? node_kind::text : node_kind::comment, current_);
      n->name = t.value;
      ++current_;
      return n;
    }
    case token_kind::open_statement: return parse_statement();
    case token_kind::open_expression: {
      ++current_;
      TROUPE_PARSE_TRY(e, parse_expression());
      TROUPE_PARSE_CHECK(expect(token_kind::close_expression, "'}}'"));
      return e;
    }
    default: return troupe::unexpected(error("unexpected " + std::string(describe(t.kind))));
  }
}

parsed<node_ptr> parser::parse_statement() {
  const std::size_t start = current_;
  ++current_;  // {%
  if (!is(token_kind::identifier)) {
    if (at_end()) return troupe::unexpected(unexpected_end("a statement"));
    return troupe::unexpected(error("expected a statement name, found " + std::string(describe(tokens_[current_].kind))));
  }
  const std::string name = tokens_[current_].value;
  ++current_;
  if (name == "set") return parse_set(start);
  if (name == "if") {
    TROUPE_PARSE_TRY(n, parse_if(start));
    TROUPE_PARSE_CHECK(expect_end_tag("endif"));
    return n;
  }
  if (name == "macro") {
    TROUPE_PARSE_TRY(n, parse_macro(start));
    TROUPE_PARSE_CHECK(expect_end_tag("endmacro"));
    return n;
  }
  if (name == "for") {
    TROUPE_PARSE_TRY(n, parse_for(start));
    TROUPE_PARSE_CHECK(expect_end_tag("endfor"));
    return n;
  }
  if (name == "call") {
    auto n = make(node_kind::call_block, start);
    if (is(token_kind::open_paren)) TROUPE_PARSE_CHECK(parse_arguments(n->params, true));
    const std::size_t callee_at = current_;
    TROUPE_PARSE_TRY(callee, parse_primary());
    if (callee->kind != node_kind::identifier)
      return troupe::unexpected(error_at("expected a macro name after 'call'", callee_at));
    auto call = make(node_kind::call, callee_at);
    call->args.push_back(std::move(callee));
    TROUPE_PARSE_CHECK(parse_arguments(call->args, false));
    TROUPE_PARSE_TRY(finished_call, finish(std::move(call)));
    n->args.push_back(std::move(finished_call));
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
    TROUPE_PARSE_CHECK(parse_block_until({"endcall"}, n->body, "{% endcall %}"));
    TROUPE_PARSE_CHECK(expect_end_tag("endcall"));
    return finish(std::move(n));
  }
  if (name == "break" || name == "continue") {
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
    return make(name == "break" ? node_kind::break_loop : node_kind::continue_loop, start);
  }
  if (name == "filter") {
    auto n = make(node_kind::filter_block, start);
    const std::size_t filter_at = current_;
    if (!is(token_kind::identifier)) return troupe::unexpected(error("expected a filter name"));
    auto f = make(node_kind::filter, filter_at);
    f->name = tokens_[current_++].value;
    f->args.push_back(nullptr);
    if (is(token_kind::open_paren)) {
      f->flag = true;
      TROUPE_PARSE_CHECK(parse_arguments(f->args, false));
    }
    TROUPE_PARSE_TRY(filter, finish(std::move(f)));
    n->args.push_back(std::move(filter));
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
    TROUPE_PARSE_CHECK(parse_block_until({"endfilter"}, n->body, "{% endfilter %}"));
    TROUPE_PARSE_CHECK(expect_end_tag("endfilter"));
    return finish(std::move(n));
  }
  return troupe::unexpected(error_at("unknown statement '" + name + "'", start + 1));
}

parsed<node_ptr> parser::parse_set(std::size_t start) {
  auto n = make(node_kind::set, start);
  TROUPE_PARSE_TRY(target, parse_expression_sequence(false));
  n->args.push_back(std::move(target));
  if (is(token_kind::equals)) {
    ++current_;
    TROUPE_PARSE_TRY(v, parse_expression_sequence(false));
    n->args.push_back(std::move(v));
  } else {
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}' or '='"));
    TROUPE_PARSE_CHECK(parse_block_until({"endset"}, n->body, "{% endset %}"));
    TROUPE_PARSE_CHECK(expect(token_kind::open_statement, "'{%'"));
    TROUPE_PARSE_CHECK(expect_identifier("endset"));
  }
  TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_if(std::size_t start) {
  nesting_guard guard(*this);
  TROUPE_PARSE_CHECK(check_nesting());
  auto n = make(node_kind::if_block, start);
  TROUPE_PARSE_TRY(test, parse_expression());
  n->args.push_back(std::move(test));
  TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
  TROUPE_PARSE_CHECK(parse_block_until({"elif", "else", "endif"}, n->body, "{% endif %}"));
  if (is_statement({"elif"})) {
    const std::size_t elif_at = current_;
    current_ += 2;
    TROUPE_PARSE_TRY(nested, parse_if(elif_at));
    n->alternate.push_back(std::move(nested));
  } else if (is_statement({"else"})) {
    current_ += 2;
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
    TROUPE_PARSE_CHECK(parse_block_until({"endif"}, n->alternate, "{% endif %}"));
  }
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_macro(std::size_t start) {
  auto n = make(node_kind::macro, start);
  const std::size_t name_at = current_;
  if (at_end()) return troupe::unexpected(unexpected_end("a macro name"));
  TROUPE_PARSE_TRY(name, parse_primary());
  if (name->kind != node_kind::identifier)
    return troupe::unexpected(error_at("expected a macro name", name_at));
  n->name = name->name;
  TROUPE_PARSE_CHECK(parse_arguments(n->params, true));
  TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
  TROUPE_PARSE_CHECK(parse_block_until({"endmacro"}, n->body, "{% endmacro %}"));
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_for(std::size_t start) {
  auto n = make(node_kind::for_loop, start);
  const std::size_t target_at = current_;
  TROUPE_PARSE_TRY(target, parse_expression_sequence(true));
  if (target->kind != node_kind::identifier && target->kind != node_kind::tuple_literal)
    return troupe::unexpected(error_at("expected a name or names for the loop variable", target_at));
  if (!is_identifier("in")) return troupe::unexpected(error("expected 'in' after the loop variable"));
  ++current_;
  TROUPE_PARSE_TRY(iterable, parse_expression());
  n->args.push_back(std::move(target));
  n->args.push_back(std::move(iterable));
  TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
  TROUPE_PARSE_CHECK(parse_block_until({"endfor", "else"}, n->body, "{% endfor %}"));
  if (is_statement({"else"})) {
    current_ += 2;
    TROUPE_PARSE_CHECK(expect(token_kind::close_statement, "'%}'"));
    TROUPE_PARSE_CHECK(parse_block_until({"endfor"}, n->alternate, "{% endfor %}"));
  }
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_expression_sequence(bool primary) {
  const std::size_t start = current_;
  TROUPE_PARSE_TRY(first, primary ? parse_primary() : parse_expression());
  if (!is(token_kind::comma)) return first;
  auto tuple = make(node_kind::tuple_literal, start);
  tuple->args.push_back(std::move(first));
  while (is(token_kind::comma)) {
    ++current_;
    TROUPE_PARSE_TRY(next, primary ? parse_primary() : parse_expression());
    tuple->args.push_back(std::move(next));
  }
  return finish(std::move(tuple));
}

parsed<node_ptr> parser::parse_expression() {
  nesting_guard guard(*this);
  TROUPE_PARSE_CHECK(check_nesting());
  const std::size_t start = current_;
  TROUPE_PARSE_TRY(a, parse_or());
  if (!is_identifier("if")) return a;
  ++current_;
  TROUPE_PARSE_TRY(test, parse_or());
  if (is_identifier("else")) {
    ++current_;
    TROUPE_PARSE_TRY(otherwise, parse_expression());
    auto n = make(node_kind::ternary, start);
    n->args.push_back(std::move(test));
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(otherwise));
    return finish(std::move(n));
  }
  auto n = make(node_kind::select, start);
  n->args.push_back(std::move(a));
  n->args.push_back(std::move(test));
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_or() {
  TROUPE_PARSE_TRY(left, parse_and());
  while (is_identifier("or")) {
    const std::size_t at = current_++;
    TROUPE_PARSE_TRY(right, parse_and());
    TROUPE_PARSE_TRY(b, binary("or", std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

parsed<node_ptr> parser::parse_and() {
  TROUPE_PARSE_TRY(left, parse_not());
  while (is_identifier("and")) {
    const std::size_t at = current_++;
    TROUPE_PARSE_TRY(right, parse_not());
    TROUPE_PARSE_TRY(b, binary("and", std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

parsed<node_ptr> parser::parse_not() {
  nesting_guard guard(*this);
  TROUPE_PARSE_CHECK(check_nesting());
  node_ptr result;
  while (is_identifier("not")) {
    const std::size_t at = current_++;
    TROUPE_PARSE_TRY(operand, parse_not());
    auto n = make(node_kind::unary, at);
    n->name = "not";
    n->args.push_back(std::move(operand));
    TROUPE_PARSE_TRY(finished, finish(std::move(n)));
    result = std::move(finished);
  }
  if (result) return result;
  return parse_comparison();
}

parsed<node_ptr> parser::parse_comparison() {
  TROUPE_PARSE_TRY(left, parse_additive());
  while (true) {
    std::string op;
    const std::size_t at = current_;
    if (is_identifier("not") && is_identifier("in", 1)) {
      op = "not in";
      current_ += 2;
    } else if (is_identifier("in")) {
      op = "in";
      ++current_;
    } else if (is(token_kind::comparison)) {
      op = tokens_[current_++].value;
    } else {
      break;
    }
    TROUPE_PARSE_TRY(right, parse_additive());
    TROUPE_PARSE_TRY(b, binary(std::move(op), std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

parsed<node_ptr> parser::parse_additive() {
  TROUPE_PARSE_TRY(left, parse_multiplicative());
  while (is(token_kind::additive)) {
    const std::size_t at = current_;
    std::string op = tokens_[current_++].value;
    TROUPE_PARSE_TRY(right, parse_multiplicative());
    TROUPE_PARSE_TRY(b, binary(std::move(op), std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

parsed<node_ptr> parser::parse_multiplicative() {
  TROUPE_PARSE_TRY(left, parse_power());
  while (is(token_kind::multiplicative)) {
    const std::size_t at = current_;
    std::string op = tokens_[current_++].value;
    TROUPE_PARSE_TRY(right, parse_power());
    TROUPE_PARSE_TRY(b, binary(std::move(op), std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

parsed<node_ptr> parser::parse_power() {
  // Left-associative, as in Jinja: 2 ** 3 ** 2 == (2 ** 3) ** 2.
  TROUPE_PARSE_TRY(left, parse_test());
  while (is(token_kind::exponent)) {
    const std::size_t at = current_++;
    TROUPE_PARSE_TRY(right, parse_test());
    TROUPE_PARSE_TRY(b, binary("**", std::move(left), std::move(right), at));
    left = std::move(b);
  }
  return left;
}

bool starts_test_argument(const std::vector<token>& tokens, std::size_t i) {
  if (i >= tokens.size()) return false;
  const token& t = tokens[i];
  if (t.kind == token_kind::numeric_literal || t.kind == token_kind::string_literal ||
      t.kind == token_kind::open_square || t.kind == token_kind::open_curly)
    return true;
  if (t.kind != token_kind::identifier) return false;
  static constexpr std::string_view keywords[] = {"if", "else", "and", "or", "is", "in", "not"};
  return std::find(std::begin(keywords), std::end(keywords), t.value) == std::end(keywords);
}

parsed<node_ptr> parser::parse_test() {
  TROUPE_PARSE_TRY(operand, parse_filter());
  while (is_identifier("is")) {
    const std::size_t at = current_++;
    const bool negate = is_identifier("not");
    if (negate) ++current_;
    if (!is(token_kind::identifier)) return troupe::unexpected(error("expected a test name after 'is'"));
    auto n = make(node_kind::test, at);
    n->name = tokens_[current_++].value;
    n->flag = negate;
    n->args.push_back(std::move(operand));
    if (is(token_kind::open_paren)) {
      TROUPE_PARSE_CHECK(parse_arguments(n->args, false));
    } else if (starts_test_argument(tokens_, current_)) {
      // `x is divisibleby 3`: one argument without parentheses, as Jinja allows.
      TROUPE_PARSE_TRY(arg, parse_primary());
      n->args.push_back(std::move(arg));
    }
    TROUPE_PARSE_TRY(finished, finish(std::move(n)));
    operand = std::move(finished);
  }
  return operand;
}

parsed<node_ptr> parser::parse_filter() {
  TROUPE_PARSE_TRY(operand, parse_unary_sign());
  while (is(token_kind::pipe)) {
    const std::size_t at = ++current_;
    if (!is(token_kind::identifier)) return troupe::unexpected(error("expected a filter name after '|'"));
    auto n = make(node_kind::filter, at);
    n->name = tokens_[current_++].value;
    n->args.push_back(std::move(operand));
    if (is(token_kind::open_paren)) {
      n->flag = true;
      TROUPE_PARSE_CHECK(parse_arguments(n->args, false));
    }
    TROUPE_PARSE_TRY(finished, finish(std::move(n)));
    if (is(token_kind::dot) || is(token_kind::open_square) || is(token_kind::open_paren)) {
      TROUPE_PARSE_TRY(post, parse_postfix(std::move(finished)));
      operand = std::move(post);
    } else {
      operand = std::move(finished);
    }
  }
  return operand;
}

parsed<node_ptr> parser::parse_unary_sign() {
  nesting_guard guard(*this);
  TROUPE_PARSE_CHECK(check_nesting());
  if ((is(token_kind::unary) || is(token_kind::additive)) &&
      (tokens_[current_].value == "-" || tokens_[current_].value == "+")) {
    const std::size_t at = current_;
    auto n = make(node_kind::unary, at);
    n->name = tokens_[current_++].value;
    TROUPE_PARSE_TRY(operand, parse_unary_sign());
    n->args.push_back(std::move(operand));
    return finish(std::move(n));
  }
  return parse_call_member();
}

parsed<node_ptr> parser::parse_call_member() {
  TROUPE_PARSE_TRY(primary, parse_primary());
  return parse_postfix(std::move(primary));
}

// Member access, subscripts and calls after an operand, in any order: a.b[0](x).c
parsed<node_ptr> parser::parse_postfix(node_ptr object) {
  while (true) {
    if (is(token_kind::open_paren)) {
      TROUPE_PARSE_TRY(called, parse_call(std::move(object)));
      object = std::move(called);
      continue;
    }
    if (!is(token_kind::dot) && !is(token_kind::open_square)) return object;
    const std::size_t at = current_;
    const bool computed = is(token_kind::open_square);
    ++current_;
    node_ptr property;
    if (computed) {
      TROUPE_PARSE_TRY(p, parse_subscript());
      property = std::move(p);
      TROUPE_PARSE_CHECK(expect(token_kind::close_square, "']'"));
    } else {
      if (at_end()) return troupe::unexpected(unexpected_end("a name after '.'"));
      const std::size_t prop_at = current_;
      TROUPE_PARSE_TRY(p, parse_primary());
      if (p->kind != node_kind::identifier && p->kind != node_kind::integer_literal)
        return troupe::unexpected(error_at("expected a name or an integer after '.'", prop_at));
      property = std::move(p);
    }
    auto n = make(node_kind::member, at);
    n->flag = computed;
    n->args.push_back(std::move(object));
    n->args.push_back(std::move(property));
    TROUPE_PARSE_TRY(finished, finish(std::move(n)));
    object = std::move(finished);
  }
}

parsed<node_ptr> parser::parse_call(node_ptr callee) {
  auto n = make(node_kind::call, current_);
  n->line = callee->line;
  n->column = callee->column;
  n->args.push_back(std::move(callee));
  TROUPE_PARSE_CHECK(parse_arguments(n->args, false));
  return finish(std::move(n));
}

result<void, template_error> parser::parse_arguments(node_list& out, bool parameters) {
  TROUPE_PARSE_CHECK(expect(token_kind::open_paren, "'('"));
  std::vector<std::string> names;
  bool saw_keyword = false, saw_spread = false;
  while (!is(token_kind::close_paren)) {
    if (at_end()) return troupe::unexpected(unexpected_end("')'"));
    const std::size_t at = current_;
    const bool keyword_spread = is(token_kind::exponent);
    const bool positional_spread = is(token_kind::multiplicative) && tokens_[current_].value == "*";
    if (parameters && (keyword_spread || positional_spread))
      return troupe::unexpected(error("argument unpacking is not allowed in parameter declarations"));
    if (keyword_spread) {
      ++current_;
      TROUPE_PARSE_TRY(e, parse_expression());
      auto n = make(node_kind::keyword_spread, at);
      n->args.push_back(std::move(e));
      TROUPE_PARSE_TRY(finished, finish(std::move(n)));
      out.push_back(std::move(finished));
      if (is(token_kind::comma)) ++current_;
      if (!is(token_kind::close_paren)) return troupe::unexpected(error("'**' must be applied to the last argument"));
      break;
    }
    node_ptr argument;
    if (positional_spread) {
      if (saw_spread) return troupe::unexpected(error("only one '*' argument unpacking is allowed"));
      saw_spread = true;
      ++current_;
      TROUPE_PARSE_TRY(e, parse_expression());
      auto n = make(node_kind::spread, at);
      n->args.push_back(std::move(e));
      TROUPE_PARSE_TRY(finished, finish(std::move(n)));
      argument = std::move(finished);
    } else {
      TROUPE_PARSE_TRY(e, parse_expression());
      argument = std::move(e);
      if (is(token_kind::equals)) {
        ++current_;
        if (argument->kind != node_kind::identifier)
          return troupe::unexpected(error_at(parameters ? "expected a parameter name" : "expected a keyword name", at));
        TROUPE_PARSE_TRY(v, parse_expression());
        auto kw = make(node_kind::keyword_argument, at);
        kw->name = argument->name;
        kw->args.push_back(std::move(v));
        TROUPE_PARSE_TRY(finished, finish(std::move(kw)));
        argument = std::move(finished);
      }
      if (parameters) {
        if (argument->kind != node_kind::identifier && argument->kind != node_kind::keyword_argument)
          return troupe::unexpected(error_at("expected a parameter name", at));
        if (std::find(names.begin(), names.end(), argument->name) != names.end())
          return troupe::unexpected(error_at("duplicate parameter '" + argument->name + "'", at));
        names.push_back(argument->name);
      }
      if (argument->kind == node_kind::keyword_argument) {
        saw_keyword = true;
      } else if (saw_keyword) {
        return troupe::unexpected(error_at(parameters ? "a parameter without default follows one with a default"
                                                      : "a positional argument follows a keyword argument",
                                           at));
      } else if (saw_spread) {
        return troupe::unexpected(error_at("a positional argument follows '*' unpacking", at));
      }
    }
    out.push_back(std::move(argument));
    if (is(token_kind::comma)) ++current_;
  }
  ++current_;  // )
  return {};
}

parsed<node_ptr> parser::parse_subscript() {
  const std::size_t start = current_;
  node_list parts;
  bool is_slice = false;
  while (!is(token_kind::close_square)) {
    if (at_end()) return troupe::unexpected(unexpected_end("']'"));
    if (is(token_kind::colon)) {
      parts.push_back(nullptr);
      ++current_;
      is_slice = true;
    } else {
      TROUPE_PARSE_TRY(e, parse_expression());
      parts.push_back(std::move(e));
      if (is(token_kind::colon)) {
        ++current_;
        is_slice = true;
      }
    }
  }
  if (parts.empty()) return troupe::unexpected(error("expected an index or a slice inside '[]'"));
  if (!is_slice) return std::move(parts.front());
  if (parts.size() > 3) return troupe::unexpected(error_at("a slice takes at most three parts", start));
  auto n = make(node_kind::slice, start);
  n->args = std::move(parts);
  n->args.resize(3);
  return finish(std::move(n));
}

parsed<node_ptr> parser::parse_primary() {
  if (at_end()) return troupe::unexpected(unexpected_end("an expression"));
  const std::size_t at = current_;
  const token& t = tokens_[current_++];
  switch (t.kind) {
    case token_kind::numeric_literal: {
      const double v = std::strtod(t.value.c_str(), nullptr);
      const bool is_float = t.value.find('.') != std::string::npos;
      if (!is_float && std::fabs(v) < 9.2e18) {
        auto n = make(node_kind::integer_literal, at);
        n->int_value = static_cast<std::int64_t>(v);
        return n;
      }
      auto n = make(node_kind::float_literal, at);
      n->float_value = v;
      return n;
    }
    case token_kind::string_literal: {
      auto n = make(node_kind::string_literal, at);
      n->name = t.value;
      while (is(token_kind::string_literal)) n->name += tokens_[current_++].value;
      return n;
    }
    case token_kind::identifier: {
      auto n = make(node_kind::identifier, at);
      n->name = t.value;
      return n;
    }
    case token_kind::open_paren: {
      TROUPE_PARSE_TRY(e, parse_expression_sequence(false));
      TROUPE_PARSE_CHECK(expect(token_kind::close_paren, "')'"));
      return e;
    }
    case token_kind::open_square: {
      auto n = make(node_kind::list_literal, at);
      while (!is(token_kind::close_square)) {
        if (at_end()) return troupe::unexpected(unexpected_end("']'"));
        TROUPE_PARSE_TRY(e, parse_expression());
        n->args.push_back(std::move(e));
        if (is(token_kind::comma)) ++current_;
      }
      ++current_;
      return finish(std::move(n));
    }
    case token_kind::open_curly: {
      auto n = make(node_kind::map_literal, at);
      while (!is(token_kind::close_curly)) {
        if (at_end()) return troupe::unexpected(unexpected_end("'}'"));
        TROUPE_PARSE_TRY(k, parse_expression());
        TROUPE_PARSE_CHECK(expect(token_kind::colon, "':'"));
        TROUPE_PARSE_TRY(v, parse_expression());
        n->args.push_back(std::move(k));
        n->args.push_back(std::move(v));
        if (is(token_kind::comma)) ++current_;
      }
      ++current_;
      return finish(std::move(n));
    }
    default:
      return troupe::unexpected(error_at("unexpected " + std::string(describe(t.kind)), at));
  }
}

}  // namespace

result<program, template_error> parse(const std::vector<token>& tokens, const parse_options& options) {
  parser p(tokens, options);
  return p.run();
}

result<program, template_error> parse_source(std::string_view source, const parse_options& options) {
  auto tokens = tokenize(source);
  if (!tokens) return troupe::unexpected(std::move(tokens.error()));
  return parse(*tokens, options);
}

}  // namespace troupe::text::jinja
