#include "engine/core/tensor.hpp"

#include <gtest/gtest.h>

#include "engine/core/result.hpp"

namespace troupe {
namespace {

TEST(shape, numel_and_overflow) {
  EXPECT_EQ(shape({}).numel(), 1);
  EXPECT_EQ(shape({3, 5, 7}).numel(), 105);
  EXPECT_EQ(shape({3, 0}).checked_numel(), 0);
  EXPECT_FALSE(shape({1LL << 40, 1LL << 40}).checked_numel());
  EXPECT_FALSE(shape({-1, 2}).checked_numel());
  EXPECT_EQ(shape({2, 3}).str(), "[2, 3]");
}

TEST(tensor, owns_aligned_zeroed_storage) {
  tensor t(dtype::f32, {3, 5});
  EXPECT_EQ(t.bytes(), 60u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.as<float>()[i], 0.0f);
  tensor q(dtype::q8_0, {2, 64});
  EXPECT_EQ(q.bytes(), 4u * 34u);
  EXPECT_EQ(q.view().row_bytes(), 68u);
  EXPECT_THROW(tensor(dtype::q8_0, {2, 33}), std::invalid_argument);
}

TEST(tensor, element_access_round_trips) {
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64, dtype::i32, dtype::i16, dtype::i8,
                  dtype::u8}) {
    tensor x(t, {4});
    store_element(t, x.data(), 2, 3.0);
    EXPECT_EQ(load_element(t, x.data(), 2), 3.0) << name(t);
    EXPECT_EQ(load_element(t, x.data(), 1), 0.0);
  }
  tensor i8(dtype::i8, {1});
  store_element(dtype::i8, i8.data(), 0, 300.0);
  EXPECT_EQ(load_element(dtype::i8, i8.data(), 0), 127.0);  // saturates
}

result<int, std::string> half_of(int x) {
  if (x % 2) return unexpected(std::string("odd"));
  return x / 2;
}

TEST(result, carries_value_or_error) {
  EXPECT_EQ(*half_of(4), 2);
  EXPECT_EQ(half_of(3).error(), "odd");
}

}  // namespace
}  // namespace troupe
