#pragma once
// result<T, E>: the one way troupe returns a value or a typed error. It is std::expected; a minimal
// stand-in with the same surface exists only for compilers whose library lacks <expected> (clang 14
// against libstdc++ 12, used for the libFuzzer builds).
#include <utility>
#include <version>

#if defined(__cpp_lib_expected)
#include <expected>
namespace troupe {
template <class T, class E>
using result = std::expected<T, E>;
template <class E>
using unexpected = std::unexpected<E>;
}  // namespace troupe
#else
#include <type_traits>
#include <variant>
namespace troupe {
template <class E>
class unexpected {
 public:
  explicit unexpected(E e) : e_(std::move(e)) {}
  E& error() & { return e_; }
  const E& error() const& { return e_; }
  E&& error() && { return std::move(e_); }

 private:
  E e_;
};
template <class E>
unexpected(E) -> unexpected<E>;

template <class T, class E>
class [[nodiscard]] result {
 public:
  using value_type = T;
  using error_type = E;
  result() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  template <class U = T>
    requires std::is_constructible_v<T, U&&> && (!std::is_same_v<std::remove_cvref_t<U>, result>)
  result(U&& u) : v_(std::in_place_index<0>, std::forward<U>(u)) {}
  template <class G>
  result(unexpected<G> u) : v_(std::in_place_index<1>, std::move(u.error())) {}
  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  E& error() & { return std::get<1>(v_); }
  const E& error() const& { return std::get<1>(v_); }
  E&& error() && { return std::get<1>(std::move(v_)); }
  template <class U>
  T value_or(U&& u) const& { return has_value() ? **this : static_cast<T>(std::forward<U>(u)); }

 private:
  std::variant<T, E> v_;
};

template <class E>
class [[nodiscard]] result<void, E> {
 public:
  result() = default;
  template <class G>
  result(unexpected<G> u) : e_(std::in_place_index<1>, std::move(u.error())) {}
  bool has_value() const { return e_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  void operator*() const {}
  void value() const {}
  E& error() & { return std::get<1>(e_); }
  const E& error() const& { return std::get<1>(e_); }

 private:
  std::variant<std::monostate, E> e_;
};
}  // namespace troupe
#endif
