#pragma once
// An executor's weight source over a model's weight map: each weight role to its stored tensor.
#include <optional>

#include "engine/exec/executor.hpp"
#include "families/weight_map.hpp"

namespace troupe::driver {

class weight_map_source final : public exec::weight_source {
 public:
  explicit weight_map_source(const families::weight_map& w) : w_(w) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override { return w_.view(role); }
  void release(const tensor_view& bytes) const override { w_.store().release_pages(bytes); }

 private:
  const families::weight_map& w_;
};

}  // namespace troupe::driver
