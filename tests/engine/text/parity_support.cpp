#include "tests/engine/text/parity_support.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "engine/text/chat_template.hpp"

namespace troupe::text::testing {

std::uint64_t seed_of(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

fs::path repo_root() {
  for (fs::path p = fs::current_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p / "tests" / "reference" / "render_template.mjs")) return p;
    if (p == p.parent_path()) break;
  }
  return {};
}

bool references_installed(const fs::path& root) {
  return !root.empty() && fs::exists(root / ".reference" / "node_modules" / "@huggingface" / "jinja" / "dist" / "index.js");
}

namespace {

// Renders every case with the reference, in one node process.
std::vector<json> run_reference(const fs::path& root, const std::vector<json>& cases) {
  const fs::path dir = fs::temp_directory_path();
  std::string stem = "troupe-parity-" + std::to_string(::getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  const fs::path in = dir / (stem + ".jsonl"), out = dir / (stem + ".out"), err = dir / (stem + ".err");
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& c : cases) f << c.dump() << "\n";
  }
  const std::string cmd = "node \"" + (root / "tests" / "reference" / "render_template.mjs").string() + "\" \"" +
                          in.string() + "\" > \"" + out.string() + "\" 2> \"" + err.string() + "\"";
  const int rc = std::system(cmd.c_str());
  std::vector<json> results;
  std::ifstream f(out, std::ios::binary);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) results.push_back(json::parse(line));
  if (rc != 0 || results.size() != cases.size()) {
    std::ifstream e(err);
    std::stringstream s;
    s << e.rdbuf();
    ADD_FAILURE() << "the reference renderer failed (exit " << rc << ", " << results.size() << " of " << cases.size()
                  << " results): " << s.str();
  }
  fs::remove(in);
  fs::remove(out);
  fs::remove(err);
  return results;
}

struct troupe_result {
  bool ok = false;
  std::string text;  // the output, or the error message
  template_error_code code = template_error_code::syntax_error;
};

troupe_result render_with_troupe(const json& c) {
  troupe_result r;
  auto t = chat_template::parse(c["template"].get<std::string>());
  if (!t) {
    r.text = t.error().describe();
    return r;
  }
  chat_render_options o;
  o.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("tools") && !c["tools"].is_null()) o.tools_json = c["tools"].dump();
  if (c.contains("bos_token") && c["bos_token"].is_string()) o.bos_token = c["bos_token"].get<std::string>();
  if (c.contains("eos_token") && c["eos_token"].is_string()) o.eos_token = c["eos_token"].get<std::string>();
  if (c.contains("kwargs")) o.extra_json = c["kwargs"].dump();
  o.date = jinja::calendar_time{2024, 7, 26, 14, 5};  // the mjs default date
  auto out = t->render(c.contains("messages") ? c["messages"].dump() : "[]", o);
  if (out) {
    r.ok = true;
    r.text = std::move(*out);
  } else {
    r.text = out.error().message;
    r.code = out.error().code;
  }
  return r;
}

std::string visible(const std::string& line) {
  std::string out;
  for (const char c : line) {
    if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (static_cast<unsigned char>(c) < 0x20) out += "\\x" + std::to_string(static_cast<int>(c));
    else out.push_back(c);
  }
  return out;
}

// The lines around the first difference, `-` for the reference and `+` for troupe.
std::string readable_diff(const std::string& expected, const std::string& actual) {
  auto lines = [](const std::string& s) {
    std::vector<std::string> v;
    std::size_t start = 0;
    while (true) {
      const auto nl = s.find('\n', start);
      v.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
      if (nl == std::string::npos) return v;
      start = nl + 1;
    }
  };
  const auto a = lines(expected), b = lines(actual);
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  std::size_t offset = 0;
  while (offset < expected.size() && offset < actual.size() && expected[offset] == actual[offset]) ++offset;
  std::ostringstream s;
  s << "    first difference at byte " << offset << ", line " << i + 1 << "\n";
  for (std::size_t k = i >= 2 ? i - 2 : 0; k < i; ++k) s << "      " << visible(a[k]) << "\n";
  for (std::size_t k = i; k < a.size() && k < i + 3; ++k) s << "    - " << visible(a[k]) << "\n";
  for (std::size_t k = i; k < b.size() && k < i + 3; ++k) s << "    + " << visible(b[k]) << "\n";
  return s.str();
}

}  // namespace

parity_stats expect_parity(const fs::path& root, const std::vector<json>& cases, bool strict) {
  parity_stats stats;
  const auto reference = run_reference(root, cases);
  if (reference.size() != cases.size()) return stats;
  int failures = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const json& ref = reference[i];
    const troupe_result ours = render_with_troupe(c);
    std::string problem;
    if (ref.contains("output")) {
      const std::string expected = ref["output"].get<std::string>();
      if (!ours.ok) problem = "the reference rendered, troupe raised: " + ours.text + "\n";
      else if (ours.text != expected) problem = "outputs differ\n" + readable_diff(expected, ours.text);
      else ++stats.rendered;
    } else {
      const std::string message = ref["error"].get<std::string>();
      if (ours.ok) {
        if (strict) problem = "the reference raised '" + message + "', troupe rendered\n";
        else ++stats.beyond_reference;
      } else if (ours.code == template_error_code::raise_exception && ours.text != message) {
        problem = "raise_exception messages differ: reference '" + message + "', troupe '" + ours.text + "'\n";
      } else {
        ++stats.raised;
      }
    }
    if (!problem.empty() && ++failures <= 8) {
      const std::string messages = c.contains("messages") ? c["messages"].dump() : "[]";
      ADD_FAILURE() << "case " << i << " (" << c.value("label", "") << "): " << problem << "    template: "
                    << visible(c["template"].get<std::string>().substr(0, 300)) << "\n    messages: "
                    << messages.substr(0, 600) << "\n    kwargs: " << c.value("kwargs", json::object()).dump()
                    << " add_generation_prompt: " << c.value("add_generation_prompt", false);
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << cases.size() << " cases differ";
  std::cout << "[ parity   ] " << cases.size() << " cases: " << stats.rendered << " rendered alike, " << stats.raised
            << " raised alike, " << stats.beyond_reference << " rendered where the reference raises\n";
  return stats;
}


}  // namespace troupe::text::testing
