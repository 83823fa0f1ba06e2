#pragma once
// Numeric bounds of the JSON schema converter, exactly: numbers as decimal digit strings (never rounded
// through floating point), compared and moved to the nearest integer inside a bound, and GBNF
// expressions for the canonical integers in a range and for the numbers between two bounds (decimal and
// exclusive bounds included; numbers written without an exponent). Private to the guide layer.
#include <cstdint>
#include <optional>
#include <string>

namespace troupe::guide::detail {

// An exact decimal number; zero is never negative.
struct decimal {
  bool neg = false;
  std::string ip = "0";  // integer digits, no leading zeros
  std::string fp;        // fraction digits, no trailing zeros
};

// The integer `magnitude` (negated when `negative`) exactly.
decimal decimal_from_integer(bool negative, std::uint64_t magnitude);
// A double as its shortest round-trip digits.
decimal decimal_from_double(double v);

// -1, 0 or 1 as a is less than, equal to or greater than b.
int compare(const decimal& a, const decimal& b);

// The least integer >= x (up) or the greatest <= x; `strict`: > x or < x.
decimal to_integer(const decimal& x, bool up, bool strict);

// One side of a range: minimum/maximum, or exclusiveMinimum/exclusiveMaximum.
struct bound {
  decimal v;
  bool exclusive = false;
};

// Canonical integers (no leading zeros, no "-0") in [lo, hi]: both integers, lo <= hi; nullopt is
// unbounded. A GBNF expression.
std::string integer_range(const std::optional<decimal>& lo, const std::optional<decimal>& hi);

// Numbers within the bounds (at least one given), written as "-"? digits ("." digits)?: a GBNF
// expression, nullopt when none fits.
std::optional<std::string> number_range(const std::optional<bound>& lo, const std::optional<bound>& hi);

}  // namespace troupe::guide::detail
