#pragma once
// An executor's weight source over a model's weight map: each weight role to its stored tensor.
#include <map>
#include <optional>
#include <string>

#include "engine/exec/executor.hpp"
#include "families/weight_map.hpp"

namespace troupe::driver {

// Besides the model's weights it serves tensors the driver owns under roles the checkpoint lacks (the
// LoRA adapter pools, written in place when an adapter is loaded into a slot).
class weight_map_source final : public exec::weight_source {
 public:
  explicit weight_map_source(const families::weight_map& w) : w_(w) {}
  std::optional<tensor_view> find(const graph::weight_role& role) const override {
    if (const auto it = own_.find(role.str()); it != own_.end()) return it->second.view();
    return w_.view(role);
  }
  void release(const tensor_view& bytes, bool covering = false) const override { w_.store().release_pages(bytes, covering); }
  bool file_backed(const tensor_view& bytes) const override { return w_.store().file_backed(bytes); }
  // A tensor of the driver's under `role` (replacing any earlier one); it lives as long as the source.
  tensor& own(const graph::weight_role& role, tensor t) { return own_.insert_or_assign(role.str(), std::move(t)).first->second; }
  tensor* owned(const graph::weight_role& role) {
    const auto it = own_.find(role.str());
    return it == own_.end() ? nullptr : &it->second;
  }

 private:
  const families::weight_map& w_;
  std::map<std::string, tensor> own_;
};

}  // namespace troupe::driver
