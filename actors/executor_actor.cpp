// The executor actor: one per device, over the device's Executor. Drivers in the same process step the
// executor directly from their own threads; this actor answers for the device (its name, what it holds).
#include <caf/all.hpp>

#include "actors/actor_internals.hpp"

namespace troupe::actors {

caf::behavior executor_actor(caf::event_based_actor*, std::shared_ptr<exec::executor> ex, std::string device) {
  return {
      [ex, device](stats_atom) {
        const auto m = ex->memory();
        return caf::make_message(device, static_cast<std::int64_t>(m.weight_bytes + m.state_bytes + m.scratch_bytes));
      },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace troupe::actors
