// The KV cache and attention: scatter_rows (state writes) and attention over a KV map.
#include "engine/exec/cpu/lowering/lower.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::exec::cpu::lowering {

instr lower_attention(lower_ctx& c) {
  TROUPE_CPU_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::scatter_rows: {
      const auto& dt = T(e.inputs[0]);
      const auto* dst = P(e.inputs[0]);
      const auto* ids = P(e.inputs[1]);
      const auto* src = P(e.inputs[2]);
      const auto id_type = T(e.inputs[1]).type;
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = dt.dims[0];
      const std::size_t total = *storage_bytes(dt.type, static_cast<std::uint64_t>(dt.dims.numel()));
      const std::size_t row_bytes = R ? total / static_cast<std::size_t>(R) : 0;
      const bool in_place = dst == out;
      std::vector<char> seen(static_cast<std::size_t>(R), 0);
      return [=]() mutable -> std::optional<exec_error> {
        // Check every id before writing, so a refused step leaves the state as it was.
        std::fill(seen.begin(), seen.end(), 0);
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id < 0) continue;
          if (id >= static_cast<double>(R))
            return fail(exec_error_code::index_out_of_range, where, "slot " + std::to_string(static_cast<std::int64_t>(id)) + " outside [0, " + std::to_string(R) + ")");
          if (seen[static_cast<std::size_t>(id)]++)
            return fail(exec_error_code::index_out_of_range, where, "slot " + std::to_string(static_cast<std::int64_t>(id)) + " written twice");
        }
        if (!in_place) std::memcpy(out, dst, total);
        for (std::int64_t j = 0; j < count; ++j) {
          const double id = load_any(id_type, ids, j);
          if (id >= 0) std::memcpy(out + static_cast<std::int64_t>(id) * row_bytes, src + j * row_bytes, row_bytes);
        }
        return std::nullopt;
      };
    }
    case op::attention: {
      attention_args a;
      a.q = reinterpret_cast<const float*>(P(e.inputs[0]));
      a.k = P(e.inputs[1]);
      a.v = P(e.inputs[2]);
      const auto kt = T(e.inputs[1]).type;
      if (T(e.inputs[2]).type != kt || T(e.inputs[0]).type != dtype::f32) {
        err = exec_error{exec_error_code::unsupported, where, "attention reads f32 queries over keys and values of one element type"};
        return nullptr;
      }
      switch (kt) {
        case dtype::f32: a.kv = kv_elem::f32; break;
        case dtype::f16: a.kv = kv_elem::f16; break;
        case dtype::bf16: a.kv = kv_elem::bf16; break;
        case dtype::q8_0: a.kv = kv_elem::q8_0; break;
        default:
          err = exec_error{exec_error_code::unsupported, where, "keys and values of type " + std::string(troupe::name(kt))};
          return nullptr;
      }
      a.out = reinterpret_cast<float*>(out);
      const auto geo = attention_geometry_of(g, e);
      a.Hq = geo.Hq, a.D = geo.D, a.Hkv = geo.Hkv, a.Dv = geo.Dv, a.Vw = geo.Vw;
      a.R = geo.R, a.T = geo.T, a.C = geo.C;
      a.scale = geo.scale;
      a.softcap = geo.softcap;
      // An entry with every token's logits (a verify window; Head::Logits) computes each token as decode
      // does (attention_args::per_token).
      for (const auto& o : g.outputs())
        if (o.name == "logits" && a.T > 1 && g.info(o.value).type.dims.rank() == 2 && g.info(o.value).type.dims[0] == a.R * a.T) a.per_token = true;
      const std::int64_t S = geo.S;
      const auto* index = P(e.inputs[3]);
      const auto index_type = T(e.inputs[3]).type;
      a.allow = reinterpret_cast<const std::uint8_t*>(P(e.inputs[4]));
      if (e.inputs.size() == 6) a.sinks = reinterpret_cast<const float*>(P(e.inputs[5]));
      if (e.inputs.size() == 7) {
        a.alibi_slopes = reinterpret_cast<const float*>(P(e.inputs[5]));
        a.alibi_dist = reinterpret_cast<const float*>(P(e.inputs[6]));
      }
      std::vector<std::int32_t> ix(static_cast<std::size_t>(a.R * a.C));
      std::vector<std::uint8_t> used(static_cast<std::size_t>(a.R * a.C));
      return [=]() mutable -> std::optional<exec_error> {
        // An index is checked where some query may read it; elsewhere it is replaced by row 0. Which keys
        // some token reads: the OR of the row's T mask rows, taken row by row (contiguous: a prefill's
        // mask is T x C bytes), over column ranges split across the pool.
        split_range(*pool_ptr, a.C, 4096, 64, [&](std::int64_t c0, std::int64_t c1) {
          for (std::int64_t r = 0; r < a.R; ++r) {
            std::uint8_t* u = used.data() + r * a.C;
            std::memcpy(u + c0, a.allow + r * a.T * a.C + c0, static_cast<std::size_t>(c1 - c0));
            for (std::int64_t t = 1; t < a.T; ++t) {
              const std::uint8_t* row = a.allow + (r * a.T + t) * a.C;
              for (std::int64_t c = c0; c < c1; ++c) u[c] |= row[c];
            }
          }
        });
        for (std::int64_t r = 0; r < a.R; ++r)
          for (std::int64_t c = 0; c < a.C; ++c) {
            const double v = load_any(index_type, index, r * a.C + c);
            const bool u = used[static_cast<std::size_t>(r * a.C + c)] != 0;
            if (u && (v < 0 || v >= static_cast<double>(S)))
              return fail(exec_error_code::index_out_of_range, where, "kv row " + std::to_string(static_cast<std::int64_t>(v)) + " outside [0, " + std::to_string(S) + ")");
            ix[static_cast<std::size_t>(r * a.C + c)] = u ? static_cast<std::int32_t>(v) : 0;
          }
        attention_args b = a;
        b.index = ix.data();
        attention(b, *pool_ptr, lv);
        return std::nullopt;
      };
    }
    default: break;
  }
  err = exec_error{exec_error_code::unsupported, where, "no CPU lowering"};
  return nullptr;
}

}  // namespace troupe::exec::cpu::lowering
