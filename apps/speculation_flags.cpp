#include "apps/speculation_flags.hpp"

#include <charconv>
#include <filesystem>

#include "families/registry.hpp"

namespace troupe::app {

result<driver::speculation_options, std::string> speculation_of(const speculation_flags& f, bool load_draft) {
  driver::speculation_options o;
  if (!f.speculative.empty() && !f.draft_model.empty()) return unexpected(std::string("--speculative and --draft-model are one policy or the other"));
  o.tokens = f.draft_tokens;
  if (!f.speculative.empty()) {
    const auto colon = f.speculative.find(':');
    const auto kind = f.speculative.substr(0, colon);
    if (kind != "ngram" && kind != "mtp") return unexpected("--speculative: unknown policy '" + kind + "' (ngram[:K] or mtp[:K])");
    o.kind = kind == "mtp" ? driver::draft_kind::mtp : driver::draft_kind::ngram;
    if (colon != std::string::npos) {
      const auto k = f.speculative.substr(colon + 1);
      std::int64_t v = 0;
      const auto [p, ec] = std::from_chars(k.data(), k.data() + k.size(), v);
      if (ec != std::errc{} || p != k.data() + k.size() || v < 1 || v > 16) return unexpected("--speculative " + kind + ":K takes K in [1, 16]");
      o.tokens = v;
    }
  }
  if (!f.draft_model.empty() && !load_draft) {
    o.kind = driver::draft_kind::model;
    o.draft_path = std::filesystem::absolute(f.draft_model).lexically_normal().string();
  } else if (!f.draft_model.empty()) {
    auto h = families::model_handle::load(f.draft_model, families::registry::builtin());
    if (!h) return unexpected("--draft-model: " + families::message(h.error()));
    o.kind = driver::draft_kind::model;
    o.draft_model = std::move(*h);
  }
  if (o.tokens < 1 || o.tokens > 16) return unexpected(std::string("--draft-tokens takes K in [1, 16]"));
  return o;
}

}  // namespace troupe::app
