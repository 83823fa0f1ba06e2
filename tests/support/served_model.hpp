#pragma once
// The model a deployment serves when it names no KV cache type: the checkpoint with an f16 cache
// (families::with_kv_type; the default of --kv-type and LoadRequest.kvType). Tests that hold a
// cluster's tokens to a driver of their own, or its memory to the planner's, build that driver over it.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "families/model_handle.hpp"
#include "families/registry.hpp"

namespace troupe::test {

inline std::shared_ptr<const families::model_handle> served_model(const std::filesystem::path& path) {
  auto h = families::model_handle::load(path, families::registry::builtin());
  EXPECT_TRUE(h) << (h ? "" : families::message(h.error()));
  if (!h) return nullptr;
  auto typed = families::with_kv_type(*h, dtype::f16);
  EXPECT_TRUE(typed) << (typed ? "" : families::message(typed.error()));
  return typed ? *typed : nullptr;
}

}  // namespace troupe::test
