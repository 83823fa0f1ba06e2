#include "engine/driver/cpu_replica.hpp"

#include <algorithm>
#include <thread>

namespace troupe::driver {

result<std::unique_ptr<cpu_replica>, std::string> cpu_replica::make(const std::shared_ptr<const families::model_handle>& model,
                                                                   int tp, int pp, int threads) {
  if (!model) return unexpected(std::string("no model"));
  if (tp < 1 || pp < 1) return unexpected("a split of " + std::to_string(tp) + " x " + std::to_string(pp) + " ranks");
  const int world = tp * pp;
  std::unique_ptr<cpu_replica> r(new cpu_replica());
  // Every part first: a split the model refuses makes nothing.
  for (int s = 0; s < pp; ++s)
    for (int t = 0; t < tp; ++t) {
      if (world == 1) {
        r->parts_.push_back(model);
        continue;
      }
      auto p = model->part(t, tp, s, pp);
      if (!p) {
        std::string what = tp > 1 && pp > 1 ? "tensor parallel " + std::to_string(tp) + " x pipeline parallel " + std::to_string(pp)
                           : tp > 1         ? "tensor parallel " + std::to_string(tp)
                                            : "pipeline parallel " + std::to_string(pp);
        return unexpected(what + ": " + families::message(p.error()));
      }
      r->parts_.push_back(*p);
    }
  std::vector<std::vector<std::unique_ptr<collective>>> groups, pipes;
  for (int s = 0; s < pp; ++s) groups.push_back(tp > 1 ? local_group(tp) : std::vector<std::unique_ptr<collective>>{});
  for (int t = 0; t < tp; ++t) pipes.push_back(pp > 1 ? local_group(pp) : std::vector<std::unique_ptr<collective>>{});
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int per = threads > 0 ? threads : (world == 1 ? 0 : std::max(1, cores / world));
  for (int s = 0; s < pp; ++s)
    for (int t = 0; t < tp; ++t) {
      collective* g = tp > 1 ? groups[static_cast<std::size_t>(s)][static_cast<std::size_t>(t)].get() : nullptr;
      collective* p = pp > 1 ? pipes[static_cast<std::size_t>(t)][static_cast<std::size_t>(s)].get() : nullptr;
      r->executors_.push_back(std::make_unique<exec::cpu::cpu_executor>(exec::cpu::cpu_options{per, std::nullopt, g, p}));
    }
  for (auto& v : groups)
    for (auto& c : v) r->groups_.push_back(std::move(c));
  for (auto& v : pipes)
    for (auto& c : v) r->pipes_.push_back(std::move(c));
  r->head_ = static_cast<std::size_t>((pp - 1) * tp);
  return r;
}

void cpu_replica::attach(driver_options& o) const {
  for (std::size_t w = 0; w < executors_.size(); ++w)
    if (w != head_) o.other_ranks.push_back({parts_[w], executors_[w].get()});
}

}  // namespace troupe::driver
