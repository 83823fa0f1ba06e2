#pragma once
// The Unicode case mappings of JavaScript's toUpperCase and toLowerCase, as compact tables: runs of
// code points that move by one delta, and the few code points that map to several (German sharp s
// upper-cases to "SS"). The generated data lives in case_table.cpp.
#include <cstdint>
#include <span>

namespace troupe::text::jinja::detail {

struct case_range {
  char32_t first;       // the first code point of the run
  std::uint16_t count;  // how many code points the run maps
  std::uint8_t stride;  // 1: consecutive code points; 2: every other one
  std::int32_t delta;   // what each mapped code point moves by
};

struct case_expansion {
  char32_t from;
  char32_t to[3];  // unused trailing entries are 0
};

struct case_table {
  std::span<const case_range> ranges;          // sorted by first, extents disjoint
  std::span<const case_expansion> expansions;  // sorted by from
};

case_table upper_case_table();
case_table lower_case_table();

}  // namespace troupe::text::jinja::detail
