#include "engine/text/post_processor.hpp"

namespace troupe::text {

std::vector<token_id> post_processor::apply(std::vector<token_id> ids) const {
  for (const auto& t : templates_) {
    std::vector<token_id> out;
    out.reserve(ids.size() + t.size());
    for (const auto& p : t) {
      if (p.sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), p.ids.begin(), p.ids.end());
      }
    }
    ids = std::move(out);
  }
  return ids;
}

std::vector<token_id> post_processor::prefix() const {
  std::vector<token_id> out;
  for (auto it = templates_.begin(); it != templates_.end(); ++it) {
    std::vector<token_id> mine;
    for (const auto& p : *it) {
      if (p.sequence) break;
      mine.insert(mine.end(), p.ids.begin(), p.ids.end());
    }
    out.insert(out.begin(), mine.begin(), mine.end());
  }
  return out;
}

std::vector<token_id> post_processor::suffix() const {
  std::vector<token_id> out;
  for (auto it = templates_.begin(); it != templates_.end(); ++it) {
    std::vector<token_id> mine;
    bool after = false;
    for (const auto& p : *it) {
      if (p.sequence) {
        after = true;
      } else if (after) {
        mine.insert(mine.end(), p.ids.begin(), p.ids.end());
      }
    }
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

}  // namespace troupe::text
