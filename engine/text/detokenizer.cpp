#include "engine/text/detokenizer.hpp"

#include <algorithm>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text {

detokenizer::detokenizer(const text_codec& codec, detokenizer_options options)
    : tok_(codec.tokens()), options_(std::move(options)), start_rule_(tok_.parts().dec.stream_start()) {
  std::erase_if(options_.stop, [](const std::string& s) { return s.empty(); });
}

detokenizer_output detokenizer::push(token_id id) {
  if (stopped_) return {};
  const auto piece = tok_.stream_piece(id, index_, options_.skip_special);
  if (!piece) return {};
  ++index_;
  bytes_ += *piece;
  return release(false);
}

detokenizer_output detokenizer::finish() {
  if (stopped_) return {};
  return release(true);
}

detokenizer_output detokenizer::release(bool final) {
  std::string text;
  std::size_t i = 0;
  while (i < bytes_.size()) {
    std::size_t n = 0;
    const auto front = detail::classify_front(std::string_view(bytes_).substr(i), n);
    if (front == detail::utf8_front::incomplete && !final) break;
    if (front == detail::utf8_front::complete) {
      text.append(bytes_, i, n);
    } else {
      text += "\xEF\xBF\xBD";
    }
    i += n;
  }
  bytes_.erase(0, i);

  // The start rule holds until the first character of the stream is known.
  while (start_rule_.count > 0 && !text.empty()) {
    if (text.compare(0, start_rule_.content.size(), start_rule_.content) != 0) {
      start_rule_.count = 0;
      break;
    }
    text.erase(0, start_rule_.content.size());
    --start_rule_.count;
  }

  detokenizer_output out;
  held_ += text;
  // The earliest stop string wins; at one position, the first listed.
  std::size_t best = std::string::npos;
  for (std::size_t k = 0; k < options_.stop.size(); ++k) {
    const auto at = held_.find(options_.stop[k]);
    if (at != std::string::npos && at < best) {
      best = at;
      out.stop = k;
    }
  }
  if (out.stop) {
    out.text = held_.substr(0, best);
    held_.clear();
    bytes_.clear();
    stopped_ = true;
    return out;
  }
  // Hold the longest tail that begins some stop string.
  std::size_t keep = 0;
  if (!final) {
    for (const auto& s : options_.stop) {
      for (std::size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
        if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace troupe::text
