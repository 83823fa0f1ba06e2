#include "engine/load/detail/json_document.hpp"

#include <optional>
#include <unordered_set>
#include <vector>

#include "engine/load/detail/utf8.hpp"

namespace troupe::load::detail {
namespace {

using json = nlohmann::json;

// A SAX handler that builds nothing: it only looks for what the document parser would hide.
class checker {
 public:
  explicit checker(std::string file) : file_(std::move(file)) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return push(true); }
  bool start_array(std::size_t) { return push(false); }
  bool end_object() { return pop(); }
  bool end_array() { return pop(); }

  bool key(json::string_t& k) {
    frame& f = stack_.back();
    f.expect_key = false;
    if (!f.keys.insert(k).second) return fail(load_error_code::duplicate_name, path_to(k), "key given twice");
    f.key = k;
    return true;
  }

  bool parse_error(std::size_t, const std::string& last_token, const json::exception& ex) {
    const bool at_key = !stack_.empty() && stack_.back().object && stack_.back().expect_key;
    // The lexer stops at the first bad byte, so an ill-formed key shows as a token that is not UTF-8.
    if (at_key && !valid_utf8(last_token)) {
      std::string_view k = last_token;
      if (!k.empty() && k.front() == '"') k.remove_prefix(1);
      return fail(load_error_code::non_utf8_key, path_to(std::string(k)), "key is not valid UTF-8");
    }
    // Inside an object after its key, the value at fault belongs to that key.
    const bool at_value = !stack_.empty() && stack_.back().object && !stack_.back().expect_key;
    return fail(load_error_code::bad_header, path_to(at_value ? stack_.back().key : ""),
                "invalid JSON: " + printable(ex.what()));
  }

  std::optional<load_error>& error() { return error_; }

 private:
  struct frame {
    bool object = false;
    bool expect_key = false;
    std::size_t index = 0;  // completed elements of an array
    std::string key;        // the current key of an object
    std::unordered_set<std::string> keys;
  };

  bool push(bool object) {
    if (stack_.size() >= max_json_depth)
      return fail(load_error_code::bad_header, path_to(""),
                  "JSON nested deeper than " + std::to_string(max_json_depth) + " levels");
    stack_.push_back(frame{object, object, 0, {}, {}});
    return true;
  }
  bool pop() {
    stack_.pop_back();
    return value();
  }
  bool value() {
    if (!stack_.empty()) {
      if (stack_.back().object)
        stack_.back().expect_key = true;
      else
        ++stack_.back().index;
    }
    return true;
  }
  // The path of the enclosing containers, then `leaf` inside the innermost one.
  std::string path_to(const std::string& leaf) const {
    std::string p;
    for (std::size_t i = 0; i + 1 < stack_.size(); ++i) {
      const frame& f = stack_[i];
      if (f.object) {
        if (!p.empty()) p += '.';
        p += printable(f.key);
      } else {
        p += '[' + std::to_string(f.index) + ']';
      }
    }
    if (!stack_.empty() && !stack_.back().object) {
      p += '[' + std::to_string(stack_.back().index) + ']';
    } else if (!leaf.empty()) {
      if (!p.empty()) p += '.';
      p += printable(leaf);
    }
    return p;
  }
  bool fail(load_error_code code, std::string item, std::string reason) {
    if (!error_) error_ = load_error{code, file_, std::move(item), std::move(reason)};
    return false;
  }

  std::string file_;
  std::vector<frame> stack_;
  std::optional<load_error> error_;
};

}  // namespace

result<nlohmann::json, load_error> parse_json(std::string_view text, const std::string& file) {
  try {
    checker c(file);
    const bool ok = json::sax_parse(text.data(), text.data() + text.size(), &c);
    if (c.error()) return troupe::unexpected(std::move(*c.error()));
    if (!ok) return troupe::unexpected(load_error{load_error_code::bad_header, file, "", "invalid JSON"});
    return json::parse(text.data(), text.data() + text.size());
  } catch (const json::exception& e) {
    return troupe::unexpected(load_error{load_error_code::bad_header, file, "", "invalid JSON: " + printable(e.what())});
  }
}

std::string_view json_kind(const nlohmann::json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "bool";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "float";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

}  // namespace troupe::load::detail
