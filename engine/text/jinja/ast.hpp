#pragma once
// The syntax tree of a parsed template. One node type with a kind tag keeps the tree plain data: the
// parser builds it once, the interpreter walks it for every render, nothing else changes it. What each
// field holds depends on the kind (listed at each kind); unused fields stay empty.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe::text::jinja {

enum class node_kind : std::uint8_t {
  // Statements.
  text,          // name: the text
  comment,       // name: the comment
  set,           // args: [target, value?]; body: the block of {% set x %}...{% endset %} when no value
  if_block,      // args: [test]; body; alternate (an elif is an if_block alone in alternate)
  for_loop,      // args: [target, iterable]; body; alternate: the else block
  macro,         // name; params; body
  call_block,    // args: [call]; params: the caller's parameters; body
  filter_block,  // args: [filter], a filter node with no operand; body
  break_loop,
  continue_loop,
  // Expressions.
  integer_literal,  // int_value
  float_literal,    // float_value
  string_literal,   // name: the string
  identifier,       // name
  list_literal,     // args: the items
  tuple_literal,    // args: the items
  map_literal,      // args: key, value, key, value, ...
  member,           // args: [object, property]; flag: computed (obj[expr] rather than obj.name)
  slice,            // args: [start?, stop?, step?], each absent one a null pointer
  call,             // args: [callee, arguments...]
  keyword_argument, // name; args: [value]
  spread,           // args: [list]           (*list in a call)
  keyword_spread,   // args: [map]            (**map in a call)
  unary,            // name: "not", "-" or "+"; args: [operand]
  binary,           // name: the operator ("and", "in", "not in", "+", "==", ...); args: [left, right]
  filter,           // name; args: [operand (null inside a filter_block), arguments...]; flag: written with ()
  test,             // name; args: [operand, arguments...]; flag: negated (is not)
  select,           // args: [value, condition]   (`a if b` without else)
  ternary,          // args: [condition, if_true, if_false]
};

struct node;
using node_ptr = std::unique_ptr<node>;
using node_list = std::vector<node_ptr>;

struct node {
  node_kind kind = node_kind::text;
  std::uint32_t line = 0;  // where the node starts in the source, for runtime errors
  std::uint32_t column = 0;
  int depth = 1;  // 1 + the depth of the deepest child; the parser bounds it
  bool flag = false;
  std::int64_t int_value = 0;
  double float_value = 0;
  std::string name;
  node_list args;
  node_list params;
  node_list body;
  node_list alternate;
};

// A parsed template: its top-level statements.
struct program {
  node_list body;
};

}  // namespace troupe::text::jinja
