// The registry actor: the families this build ships and the checkpoints resolved through them. It
// answers with a transport::resolved_model (family, bytes, the placement planner's requirements, or why
// the checkpoint is refused). It reads a checkpoint's configuration and its tensor table (mmapped, no
// tensor data), so it runs detached: a slow disk never stalls the coordinator's thread.
#include <caf/all.hpp>

#include "actors/actor_internals.hpp"
#include "actors/model_needs.hpp"
#include "transport/codec.hpp"

namespace troupe::actors {
namespace {

// `name` only labels the actor: CAF 0.17 dereferences a null argument tuple when an actor function takes
// no arguments besides self (UBSan reports it), so every actor here takes at least one.
registry_actor::behavior_type registry(registry_actor::pointer, std::string /*name*/) {
  return {
      [](resolve_atom, const std::string& path) { return transport::encode(resolve_checkpoint(path)); },
      [](ping_atom) { return ping_atom::value; },
  };
}

}  // namespace

registry_actor spawn_registry(caf::actor_system& sys) { return sys.spawn<caf::detached>(registry, std::string("registry")); }

}  // namespace troupe::actors
