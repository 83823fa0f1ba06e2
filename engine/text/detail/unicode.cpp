#include "engine/text/detail/unicode.hpp"

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace troupe::text::detail {

char32_t next_scalar(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const std::size_t n = utf8_length(b0);
  char32_t c = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (std::size_t k = 1; k < n && i + k < s.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return c;
}

char32_t prev_scalar(std::string_view s, std::size_t& end) {
  std::size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  std::size_t i = start;
  const char32_t c = next_scalar(s, i);
  end = start;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::size_t utf8_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

utf8_front classify_front(std::string_view s, std::size_t& length) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  length = 1;
  if (b0 < 0x80) return utf8_front::complete;
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return utf8_front::invalid;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (k >= s.size()) {
      length = k;
      return utf8_front::incomplete;
    }
    const auto b = static_cast<unsigned char>(s[k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      length = k;
      return utf8_front::invalid;
    }
  }
  length = need + 1;
  return utf8_front::complete;
}

bool is_ascii(std::string_view s) {
  std::size_t i = 0;
  // Eight bytes at a time: text is mostly ASCII.
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) return false;
  }
  for (; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) >= 0x80) return false;
  return true;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      if (i + 8 <= s.size()) {
        std::uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        if ((w & 0x8080808080808080ull) == 0) {
          i += 8;
          continue;
        }
      }
      ++i;
      continue;
    }
    std::size_t n = 0;
    if (classify_front(s.substr(i), n) != utf8_front::complete) return false;
    i += n;
  }
  return true;
}

std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t n = 0;
    if (classify_front(bytes.substr(i), n) == utf8_front::complete) {
      out.append(bytes.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += n;
  }
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
bool is_letter(utf8proc_category_t k) {
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
bool is_number(utf8proc_category_t k) {
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
}  // namespace

bool is_word_char(char32_t c) {
  const auto k = category(c);
  return is_letter(k) || k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME ||
         k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

bool is_numeric(char32_t c) { return is_number(category(c)); }

namespace {

// Characters that are their own NFC, combine with nothing before them and have canonical combining
// class 0 (checked against Unicode 14's data): a text made only of them is already NFC. They cover
// Latin below the combining diacritics, Cyrillic, kana, CJK ideographs, Hangul syllables and emoji,
// so most text skips the normalization pass.
bool nfc_inert(char32_t c) {
  return c < 0x300 || (c >= 0x400 && c <= 0x482) || (c >= 0x48A && c <= 0x4FF) || (c >= 0x3040 && c <= 0x3098) ||
         (c >= 0x309D && c <= 0x30FF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
         c == 0x200D || c == 0xFE0F || (c >= 0x1F300 && c <= 0x1FAFF);
}

// utf8proc over a whole valid UTF-8 string.
std::string map_utf8proc(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(s);  // not valid UTF-8: callers validate first, so this is unreachable
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
}

// NFC touching only what can change: normalization never crosses the start of an inert character, so
// each run of other characters is normalized together with the character before it, and the rest is
// copied.
std::string nfc(std::string_view s) {
  std::string out;
  std::size_t copied = 0;   // s[0, copied) is in out
  std::size_t previous = 0; // where the character before i starts
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    if (static_cast<unsigned char>(s[i]) < 0x80 || nfc_inert(next_scalar(s, i))) {
      if (i == start) ++i;
      previous = start;
      continue;
    }
    const std::size_t from = start == 0 ? 0 : previous;
    std::size_t end = i;
    while (end < s.size()) {
      std::size_t next = end;
      if (static_cast<unsigned char>(s[end]) < 0x80 || nfc_inert(next_scalar(s, next))) break;
      end = next;
    }
    if (out.empty()) out.reserve(s.size());
    out.append(s.substr(copied, from - copied));
    out += map_utf8proc(s.substr(from, end - from), UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    copied = end;
    previous = end;
    i = end;
  }
  if (copied == 0) return std::string(s);
  out.append(s.substr(copied));
  return out;
}

}  // namespace

std::string normalize(std::string_view s, unicode_form form) {
  switch (form) {
    case unicode_form::nfc: return nfc(s);
    case unicode_form::nfd:
      return is_ascii(s) ? std::string(s) : map_utf8proc(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case unicode_form::nfkc:
      return is_ascii(s) ? std::string(s) : map_utf8proc(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case unicode_form::nfkd:
      return is_ascii(s) ? std::string(s) : map_utf8proc(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  return std::string(s);
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const char32_t c = next_scalar(s, i);
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {
      // The one full lowercase mapping of more than one scalar: I with dot above.
      append_utf8(out, 0x69);
      append_utf8(out, 0x307);
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::size_t leading_white_space(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    if (!is_white_space(next_scalar(s, j))) break;
    i = j;
  }
  return i;
}

std::size_t trailing_white_space(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t j = end;
    if (!is_white_space(prev_scalar(s, j))) break;
    end = j;
  }
  return s.size() - end;
}

}  // namespace troupe::text::detail
