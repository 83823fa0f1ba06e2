// The one table of what composes (docs/driver.md): every composition check of the driver, the
// request's features against the driver's, goes through check_compatible.
#include <algorithm>

#include "engine/driver/driver.hpp"

namespace troupe::driver {

std::string_view name(feature f) {
  switch (f) {
    case feature::paged_pool: return "paged_pool";
    case feature::prefix_cache: return "prefix_cache";
    case feature::placement: return "placement";
    case feature::draft_policy: return "draft_policy";
    case feature::recurrent_state: return "recurrent_state";
    case feature::adapter: return "adapter";
    case feature::beam_search: return "beam_search";
    case feature::request_inputs: return "request_inputs";
    case feature::resume: return "resume";
  }
  return "unknown";
}

// ---- the compatibility table ------------------------------------------------------------------------

namespace {

struct refused_pair {
  feature a;
  feature b;
  const char* reason;
};

// The one table. Order matters only for which refusal is reported first.
constexpr refused_pair compatibility_table[] = {
    {feature::request_inputs, feature::resume, "a resumed sequence does not keep the request inputs its cached state was computed with"},
    {feature::beam_search, feature::draft_policy, "drafts are verified per sequence, not per beam"},
    {feature::request_inputs, feature::draft_policy, "a draft (and a verify window) cannot read the target's request inputs"},
    {feature::beam_search, feature::request_inputs, "beams would have to copy per-row request inputs on every fork"},
    {feature::recurrent_state, feature::prefix_cache, "recurrent state is not a function of a block of tokens, so it cannot be shared by prefix"},
    {feature::adapter, feature::placement, "adapters are loaded per executable, not split across a placement"},
    {feature::adapter, feature::beam_search, "beams fork rows of one adapter slot; not offered together yet"},
    {feature::adapter, feature::recurrent_state, "adapters target attention and feed-forward linears; recurrent models are not offered with them yet"},
    {feature::resume, feature::placement, "a saved sequence is tied to the executable that computed it"},
};

bool feature_active(std::span<const feature> active, feature f) { return std::find(active.begin(), active.end(), f) != active.end(); }

}  // namespace

std::optional<incompatible> check_compatible(std::span<const feature> active) {
  for (const auto& p : compatibility_table)
    if (feature_active(active, p.a) && feature_active(active, p.b)) return incompatible{p.a, p.b, p.reason};
  return std::nullopt;
}

bool implemented(feature f) {
  switch (f) {
    case feature::paged_pool:
    case feature::prefix_cache:
    case feature::request_inputs:
    case feature::draft_policy:
    case feature::beam_search:
    case feature::recurrent_state:
    case feature::adapter:
      return true;
    default:
      return false;
  }
}

}  // namespace troupe::driver
