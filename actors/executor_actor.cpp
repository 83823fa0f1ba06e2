// The executor actor: one per device, over the device's Executor. Drivers in the same process step the
// executor directly from their own threads; this actor answers for the device (its name, what it holds).
#include <caf/all.hpp>

#include "actors/actor_internals.hpp"

namespace troupe::actors {

executor_actor_t::behavior_type executor_actor(executor_actor_t::pointer, std::shared_ptr<exec::executor> ex, std::string device) {
  return {
      [ex, device](stats_atom) -> caf::result<std::string, std::int64_t> {
        const auto m = ex->memory();
        return {device, static_cast<std::int64_t>(m.weight_bytes + m.state_bytes + m.scratch_bytes)};
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace troupe::actors
