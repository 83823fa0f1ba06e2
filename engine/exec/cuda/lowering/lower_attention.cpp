// The KV cache and attention: scatter_rows (state writes) and attention over a KV map.
#include "engine/exec/cuda/cuda_internal.hpp"

namespace troupe::exec::cuda {

std::optional<exec_error> cuda_executor::lower_attention(lower_ctx& c) {
  TROUPE_CUDA_LOWERING_LOCALS(c);
  switch (e.code) {
    case op::scatter_rows: {
      const auto& dt = T(e.inputs[0]);
      const auto* dst = P(e.inputs[0]);
      const auto* ids = P(e.inputs[1]);
      const auto* src = P(e.inputs[2]);
      const auto id_type = T(e.inputs[1]).type;
      if (id_type != dtype::i32 && id_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "ids of type " + std::string(troupe::name(id_type))};
      const std::int64_t count = T(e.inputs[1]).dims.numel(), R = dt.dims[0];
      const std::size_t total = *storage_bytes(dt.type, static_cast<std::uint64_t>(dt.dims.numel()));
      const std::int64_t row_bytes = R ? static_cast<std::int64_t>(total) / R : 0;
      const bool in_place = dst == out;
      if (!in_place)
        en.program.push_back({[=, this]() -> std::optional<exec_error> {
          return check(cudaMemcpyAsync(out, dst, total, cudaMemcpyDeviceToDevice, st), where, true);
        }});
      return device([=] { launch_scatter_rows(id_type, ids, count, R, row_bytes, src, out, flag, eqn, st); });
    }
    case op::attention: {
      attention_launch a;
      if (e.inputs.size() == 7) {  // ALiBi: slopes [Hq] and key-minus-query distances [R, T, C]
        if (T(e.inputs[5]).type != dtype::f32 || T(e.inputs[6]).type != dtype::f32)
          return exec_error{exec_error_code::unsupported, where, "ALiBi slopes and distances must be f32"};
        a.alibi_slopes = reinterpret_cast<const float*>(P(e.inputs[5]));
        a.alibi_dist = reinterpret_cast<const float*>(P(e.inputs[6]));
      } else if (e.inputs.size() > 5) {
        if (T(e.inputs[5]).type != dtype::f32) return exec_error{exec_error_code::unsupported, where, "attention sinks must be f32"};
        a.sinks = reinterpret_cast<const float*>(P(e.inputs[5]));
      }
      a.q = reinterpret_cast<const float*>(P(e.inputs[0]));
      a.k = P(e.inputs[1]);
      a.v = P(e.inputs[2]);
      a.kv_type = T(e.inputs[1]).type;
      if (T(e.inputs[2]).type != a.kv_type || T(e.inputs[0]).type != dtype::f32)
        return exec_error{exec_error_code::unsupported, where, "attention reads f32 queries over keys and values of one element type"};
      if (a.kv_type != dtype::f32 && a.kv_type != dtype::f16 && a.kv_type != dtype::bf16 && a.kv_type != dtype::q8_0)
        return exec_error{exec_error_code::unsupported, where, "keys and values of type " + std::string(troupe::name(a.kv_type))};
      a.index = P(e.inputs[3]);
      a.index_type = T(e.inputs[3]).type;
      a.allow = reinterpret_cast<const std::uint8_t*>(P(e.inputs[4]));
      a.out = reinterpret_cast<float*>(out);
      const auto geo = attention_geometry_of(g, e);
      a.Hq = geo.Hq, a.D = geo.D, a.Hkv = geo.Hkv, a.S = geo.S, a.Dv = geo.Dv, a.Vw = geo.Vw;
      a.R = geo.R, a.T = geo.T, a.C = geo.C;
      a.scale = geo.scale;
      a.softcap = geo.softcap;
      if (a.D > max_attention_dim || a.Dv > max_attention_dim)
        return exec_error{exec_error_code::unsupported, where, "head dimensions above " + std::to_string(max_attention_dim)};
      if (a.index_type != dtype::i32 && a.index_type != dtype::i64)
        return exec_error{exec_error_code::unsupported, where, "an index of type " + std::string(troupe::name(a.index_type))};
      if (a.Hkv == 0 || a.Hq % a.Hkv != 0) return exec_error{exec_error_code::unsupported, where, "query heads not a multiple of kv heads"};
      if (a.R > 65535 || a.Hq > 65535) return exec_error{exec_error_code::unsupported, where, "more than 65535 KV-map rows or query heads"};
      auto ix = arena_.take(static_cast<std::size_t>(std::max<std::int64_t>(a.R * a.C, 1)) * 4);
      if (!ix) return device_fault(where, ix.error());
      scratch_bytes_ += static_cast<std::size_t>(std::max<std::int64_t>(a.R * a.C, 1)) * 4;
      a.ix32 = reinterpret_cast<std::int32_t*>(*ix);
      // Decode over a long cache: split the keys so the device's multiprocessors all get work
      // (flash-decoding), the partial states in scratch of their own.
      int dev = 0, sms = 1;
      if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        sms = 1;
      }
      a.splits = attention_splits(a.T, a.C, a.R, a.Hq, sms);
      if (a.splits > 1) {
        const auto part_bytes = static_cast<std::size_t>(a.R * a.Hq * a.splits * (a.Dv + 2)) * sizeof(float);
        auto part = arena_.take(part_bytes);
        if (!part) return device_fault(where, part.error());
        scratch_bytes_ += part_bytes;
        a.part = reinterpret_cast<float*>(*part);
      }
      return device([=] { launch_attention(a, flag, eqn, st); });
    }
    default: break;
  }
  return exec_error{exec_error_code::unsupported, where, "no CUDA lowering"};
}

}  // namespace troupe::exec::cuda
