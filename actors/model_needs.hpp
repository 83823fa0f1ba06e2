#pragma once
// What a deployment of a checkpoint needs, in plain C++ (no CAF): the registry's answer (family, bytes,
// the placement planner's requirements), the served name a checkpoint gets by default, and a replica's
// driver options from its load request. The coordinator plans with the same numbers the node admits
// with (one memory model: placement/planner.hpp's).
#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"
#include "placement/planner.hpp"
#include "transport/messages.hpp"

namespace troupe::families {
class model_handle;
}

namespace troupe::actors {

// Positions per sequence when a deployment leaves the capacity to the node (and the model has more).
inline constexpr std::int64_t default_capacity = 2048;

// One replica's needs from its weights as stored: the heaviest layer (the planner takes one size for
// all), the embedding, the final norm and head (a tied head counts the embedding again, as the planner
// asks), f32 KV, and the scratch of a 256-token prefill chunk and a 16-row decode.
result<placement::requirements, std::string> requirements_of(const families::model_handle& h);

// The registry's answer for a checkpoint: its family and needs, or `error` set (never throws).
transport::resolved_model resolve_checkpoint(const std::filesystem::path& path);
placement::requirements requirements_of(const transport::resolved_model& r);

// The name a checkpoint is served under by default: its file's stem (`troupe-kjv` for
// `troupe-kjv.gguf`), a directory's own name (a trailing slash ignored).
std::string served_name(const std::filesystem::path& checkpoint);

// A replica's driver options from its deployment: what the deployment leaves 0 follows from the
// model's positions (the capacity, at most default_capacity, in whole KV blocks) and from the capacity
// (the prefill chunk and the token budget).
driver::driver_options replica_options(const transport::load_request& l, std::int64_t max_positions);
// The KV cache element type a load asks for: its kv_type by name, f16 when empty (llama.cpp's default),
// or why not.
result<dtype, std::string> kv_type_of(const transport::load_request& l);
// KV bytes counted at f32 (a resolved checkpoint's), at the cache type `t`: f16 and bf16 half, q8_0 34
// bytes per 32 values (rounded up).
std::uint64_t kv_bytes_at(std::uint64_t f32_bytes, dtype t);
// A driver's speculation as a load request carries it: the policy's name, its window, and the draft
// checkpoint's absolute path (the node loads it).
void put_speculation(transport::load_request& l, const driver::speculation_options& s);

}  // namespace troupe::actors
