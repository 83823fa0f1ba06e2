// Differential tests of the Jinja layer against @huggingface/jinja 0.5.11: random expressions over
// every operator, filter, test, method and literal kind, and random statement trees (loops with their
// variables, conditions, namespaces, macros, break and continue, block sets) under every mix of `-`
// whitespace markers. Where the reference renders, troupe must print the same bytes; where it raises,
// troupe raises too or renders as Jinja would (a feature the reference lacks).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine/text/parity_support.hpp"

namespace troupe::text {
namespace {

using namespace testing;

// Variables every random template can read: each kind of value, and values that are often wrong.
json sample_variables() {
  return json::parse(R"json({
    "s": "Hello World", "e": "", "u": "h\u00e9llo \ud83d\ude00 w\u00f6rld", "ws": "  \n pad \t ",
    "n": 5, "f": 2.5, "z": 0, "neg": -3, "big": 12345678901, "b": true, "nb": false, "nn": null,
    "l": [3, 1, 2], "ls": ["b", "A", "c"], "el": [], "d": {"b": 1, "a": 2, "10": 3}, "ed": {},
    "objs": [{"t": "a", "v": 1}, {"t": "b", "v": 0}, {"t": "a"}],
    "nested": {"x": {"y": [1, {"z": "deep"}]}},
    "msgs": [{"role": "system", "content": " sys "}, {"role": "user", "content": "hi\n"},
             {"role": "assistant", "content": "yo"}]
  })json");
}

class expression_generator {
 public:
  explicit expression_generator(rng& r) : r_(r) {}

  std::string expr(int depth = 0) {
    if (depth > 3) return atom(depth);
    switch (r_.below(20)) {
      case 0: case 1: case 2: case 3: case 4: return atom(depth);
      case 5: case 6: case 7: case 8: return expr(depth + 1) + " | " + r_.pick(filters_);
      case 9: case 10: return expr(depth + 1) + " is " + (r_.chance(30) ? "not " : "") + r_.pick(tests_);
      case 11: case 12: case 13: case 14: return expr(depth + 1) + " " + r_.pick(binary_) + " " + expr(depth + 1);
      case 15: return (r_.chance(50) ? "not " : "-") + atom(depth + 1);
      case 16: return atom(depth) + "." + r_.pick(methods_);
      case 17: return atom(depth) + "[" + r_.pick(subscripts_) + "]";
      case 18: return expr(depth + 1) + " if " + expr(depth + 1) + " else " + expr(depth + 1);
      default: return "[" + expr(depth + 1) + ", " + expr(depth + 1) + "]";
    }
  }

 private:
  std::string atom(int depth) {
    const auto k = r_.below(20);
    if (k < 7) return r_.pick(literals_);
    if (k < 16) return r_.pick(names_);
    return "(" + expr(depth + 1) + ")";
  }

  rng& r_;
  const std::vector<std::string> literals_ = {"1",    "0",    "-2",   "2.5",     "1.0",  "'abc'", "''", "\"x y\"",
                                              "true", "false", "none", "[1, 2]", "[]",   "{'k': 1}", "{}", "(1, 2)",
                                              "'\\u00e9\\n'", "0.1", "-0.0"};
  const std::vector<std::string> names_ = {"s", "e", "u", "ws", "n", "f", "z", "neg", "big", "b", "nb", "nn",
                                           "l", "ls", "el", "d", "ed", "objs", "nested", "missing", "msgs"};
  const std::vector<std::string> filters_ = {
      "tojson", "safe", "length", "first", "last", "list", "reverse", "sort", "join", "join(', ')", "string",
      "unique", "upper", "lower", "title", "capitalize", "trim", "indent", "indent(2)", "indent(2, true)", "int",
      "float", "int()", "float()", "abs", "items", "default('D')", "default('D', true)", "tojson(indent=2)",
      "tojson(indent=1, sort_keys=true)", "tojson(ensure_ascii=true)", "map(attribute='t')", "selectattr('t')",
      "rejectattr('v')", "selectattr('t', 'equalto', 'a')", "replace('l', 'L')", "dictsort", "sort(reverse=true)",
      "sort(attribute='v')", "dictsort(by='value')", "bool"};
  const std::vector<std::string> tests_ = {"defined", "undefined", "none",    "string", "number", "integer",
                                           "iterable", "mapping", "sequence", "boolean", "true",  "false",
                                           "odd",      "even",    "lower",    "upper",   "callable"};
  const std::vector<std::string> binary_ = {"+",  "-",  "*",  "/",  "//", "%",   "**", "~",  "==",
                                            "!=", "<",  ">",  "<=", ">=", "and", "or", "in", "not in"};
  const std::vector<std::string> methods_ = {
      "upper()", "lower()", "strip()", "lstrip()", "rstrip('x')", "title()", "capitalize()", "split()",
      "split(' ')", "split('l', 1)", "startswith('H')", "endswith('d')", "replace('o', '0')",
      "replace('', '-', 2)", "items()", "keys()", "values()", "get('a')", "get('q', 9)", "length"};
  const std::vector<std::string> subscripts_ = {"0", "-1", "1:", ":2", "::-1", "'a'", "'t'", "5", "1:-1:2"};
};

class statement_generator {
 public:
  explicit statement_generator(rng& r) : r_(r) {}

  std::string program() {
    return "{% set ns = namespace(a=0) %}{% macro mac(p, q='Q') %}<{{ p }}|{{ q }}>{% endmacro %}" +
           r_.pick(std::vector<std::string>{"", "\n", "  "}) + block(0) +
           r_.pick(std::vector<std::string>{"", "\n", "\n\n"});
  }

 private:
  std::string dash() { return r_.chance(40) ? "-" : ""; }
  std::string tag(const std::string& body) { return "{%" + dash() + " " + body + " " + dash() + "%}"; }
  std::string out(const std::string& e) { return "{{" + dash() + " " + e + " " + dash() + "}}"; }
  std::string text() { return r_.pick(texts_); }

  std::string block(int depth) {
    std::string s;
    const std::size_t parts = 1 + r_.below(4);
    for (std::size_t i = 0; i < parts; ++i) {
      s += text();
      const auto k = r_.below(100);
      if (depth > 2 || k < 35) {
        s += out(r_.pick(exprs_));
      } else if (k < 50) {
        s += tag("if " + r_.pick(conditions_)) + block(depth + 1);
        if (r_.chance(40)) s += tag("else") + block(depth + 1);
        s += tag("endif");
      } else if (k < 70) {
        const std::string iterable = r_.pick(iterables_);
        const std::string var = iterable == "d.items()" ? "k, v"
                                : iterable.find("msgs") != std::string::npos
                                    ? "m"
                                    : r_.pick(std::vector<std::string>{"x", "k", "i"});
        const std::string cond = r_.chance(20) ? " if " + r_.pick(conditions_) : "";
        s += tag("for " + var + " in " + iterable + cond) + block(depth + 1);
        if (r_.chance(20)) s += tag("else") + block(depth + 1);
        s += tag("endfor");
      } else if (k < 78) {
        s += tag("set ns.a = " + r_.pick(std::vector<std::string>{"ns.a + 1", "n", "loop.index", "0"}));
      } else if (k < 84) {
        s += tag("set x = " + r_.pick(exprs_));
      } else if (k < 88) {
        s += tag(r_.chance(50) ? "break" : "continue");
      } else if (k < 92) {
        s += "{#" + dash() + " c " + dash() + "#}";
      } else if (k < 96) {
        s += out("mac(" + r_.pick(exprs_) + ")");
      } else {
        s += tag("set blk") + block(depth + 1) + tag("endset") + out("blk|length");
      }
    }
    return s + text();
  }

  rng& r_;
  const std::vector<std::string> texts_ = {"", " ", "\n", "  \n  ", "a", "b\n", "\n  x  \n", "\t", "\u00a0"};
  const std::vector<std::string> exprs_ = {
      "s", "n", "l", "x", "loop.index", "loop.index0", "loop.first", "loop.last", "loop.length", "loop.revindex",
      "loop.previtem", "loop.nextitem", "m.role", "m.content|trim", "ns.a", "ns.a + 1", "x ~ '!'", "k", "v",
      "l|length", "(l|length) - 1", "n * 2", "'lit'", "d.a", "missing", "i"};
  const std::vector<std::string> conditions_ = {"true",  "false",        "loop.first", "loop.last", "x == 2",
                                                "x is odd", "m.role == 'user'", "ns.a > 2", "n",   "el",
                                                "not loop.last", "x in l", "k == 'a'", "i > 1"};
  const std::vector<std::string> iterables_ = {"l",        "ls",       "el",     "msgs", "range(3)", "range(1, 4)",
                                               "d",        "d.items()", "l|sort", "msgs[1:]", "msgs[::-1]",
                                               "l if true"};
};

TEST(jinja_parity, random_expressions) {
  TROUPE_REQUIRE_REFERENCES();
  rng r(seed_of("expressions"));
  expression_generator gen(r);
  const json vars = sample_variables();
  std::vector<json> cases;
  for (int i = 0; i < 1500; ++i)
    cases.push_back({{"template", "{{ " + gen.expr() + " }}"}, {"kwargs", vars}, {"label", "expression"}});
  const parity_stats stats = expect_parity(root, cases, false);
  EXPECT_GE(stats.rendered, 500);
}

TEST(jinja_parity, random_statements) {
  TROUPE_REQUIRE_REFERENCES();
  rng r(seed_of("statements"));
  statement_generator gen(r);
  const json vars = sample_variables();
  std::vector<json> cases;
  for (int i = 0; i < 600; ++i) cases.push_back({{"template", gen.program()}, {"kwargs", vars}, {"label", "statements"}});
  const parity_stats stats = expect_parity(root, cases, false);
  EXPECT_GE(stats.rendered, 300);
}

TEST(jinja_parity, whitespace_settings_on_template_layouts) {
  TROUPE_REQUIRE_REFERENCES();
  // Layouts real templates use: indented blocks, trailing newlines, CRLF line ends, comments on their own
  // lines, generation tags, Unicode spaces before tags.
  const std::vector<std::string> layouts = {
      "{% for m in msgs %}\n    {% if m.role == 'user' %}\n        U: {{ m.content }}\n    {% else %}\n"
      "        {{- m.role }}: {{ m.content -}}\n    {% endif %}\n{% endfor %}\n",
      "{%- for m in msgs -%}\r\n  {{ m.content }}\r\n  {%- if not loop.last %}\r\n---\r\n{% endif -%}\r\n{%- endfor %}\r\n",
      "  {# leading comment #}\n\t{% set x = 1 %}\n{{ x }}\n  {#- dashed -#}  \n  end\n\n",
      "{% for m in msgs %}{% generation %}{{ m.content }}{% endgeneration %}\n{%- generation %} g {% endgeneration -%}\n{% endfor %}",
      "\u00a0{%- if true %}nbsp{% endif %}\u3000{{- 'ideographic' }}\u2028{% if true %}\nsep{% endif %}",
      "{% macro render(m) -%}\n  [{{ m.role }}]\n{%- endmacro %}\n{% for m in msgs %}{{ render(m) }}\n{% endfor %}",
  };
  std::vector<json> cases;
  for (const auto& l : layouts) cases.push_back({{"template", l}, {"kwargs", sample_variables()}, {"label", "layout"}});
  const parity_stats stats = expect_parity(root, cases, true);
  EXPECT_EQ(stats.rendered, static_cast<int>(layouts.size()));
}

}  // namespace
}  // namespace troupe::text
