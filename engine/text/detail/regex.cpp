#include "engine/text/detail/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/text/detail/unicode.hpp"

namespace troupe::text::detail {

namespace {

// Unicode White_Space, as a character-class body.
constexpr std::string_view white_space_items =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Per-thread match state: PCRE2 match data and a JIT stack larger than the 32 KiB default, so long
// runs of one character class never exhaust it.
struct match_state {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  match_state() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 4 * 1024 * 1024, nullptr);
    if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~match_state() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  match_state(const match_state&) = delete;
  match_state& operator=(const match_state&) = delete;
};

match_state& thread_state() {
  thread_local match_state s;
  return s;
}

}  // namespace

struct regex::impl {
  std::string pattern;
  pcre2_code* code = nullptr;
  bool jit = false;
  ~impl() { pcre2_code_free(code); }
};

std::string oniguruma_compatible(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += white_space_items;
        } else {
          out += '[';
          out += white_space_items;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += white_space_items;
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // A POSIX class such as [:alpha:] inside a bracket expression.
      const auto close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

result<regex, std::string> regex::compile(std::string_view pattern) {
  const std::string rewritten = oniguruma_compatible(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error, buf, sizeof buf);
    return troupe::unexpected(std::string(reinterpret_cast<const char*>(buf)) + " at offset " +
                              std::to_string(offset));
  }
  auto i = std::make_shared<impl>();
  i->pattern = std::string(pattern);
  i->code = code;
  i->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex(std::move(i));
}

const std::string& regex::pattern() const { return impl_->pattern; }

void regex::find_all(std::string_view text, std::vector<regex_match>& out) const {
  auto& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos <= text.size()) {
    int rc = 0;
    if (impl_->jit) {
      rc = pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, st.data, st.context);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // JIT stack or other limits: let the interpreter try
        rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, nullptr);
    } else {
      rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data, nullptr);
    }
    if (rc < 0) return;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const std::size_t s = ov[0], e = ov[1];
    out.push_back({s, e});
    if (e > s) {
      pos = e;
    } else {
      if (e >= text.size()) return;
      pos = e + utf8_length(static_cast<unsigned char>(text[e]));
    }
  }
}

}  // namespace troupe::text::detail
