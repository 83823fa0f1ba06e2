// The CUDA executor (see cuda_executor.hpp). Host code: compiles entries with the shared passes and
// lowers each equation to launches of kernels.cu / linear_kernels.cu / cuBLASLt on the executor's
// stream, over device pointers fixed at prepare.
#include "engine/exec/cuda/cuda_executor.hpp"
#include "engine/exec/cuda/cuda_internal.hpp"

#include <algorithm>

namespace troupe::exec::cuda {


cuda_executor::~cuda_executor() {
  cudaSetDevice(opt_.device);
  if (stream_) cudaStreamSynchronize(stream_);
  entries_.clear();
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

result<void, exec_error> cuda_executor::init() {
  if (auto e = check(cudaSetDevice(opt_.device), "cudaSetDevice(" + std::to_string(opt_.device) + ")", false)) return unexpected(*e);
  if (auto e = check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", false)) return unexpected(*e);
  if (auto s = cublasLtCreate(&lt_); s != CUBLAS_STATUS_SUCCESS) return unexpected(device_fault("cublasLtCreate", lt_why(s)));
  auto ws = arena_.take(workspace_bytes);
  if (!ws) return unexpected(device_fault("cuda workspace", ws.error()));
  workspace_ = *ws;
  auto fl = arena_.take(sizeof(step_flag));
  if (!fl) return unexpected(device_fault("cuda flag", fl.error()));
  flag_ = reinterpret_cast<step_flag*>(*fl);
  if (!flag_host_.reserve(sizeof(step_flag))) return unexpected(device_fault("cudaMallocHost", "pinned memory for the step flag"));
  return {};
}

result<dev_tensor, exec_error> cuda_executor::upload(const tensor_view& t, const std::string& where) {
  dev_tensor d;
  d.type = t.type();
  d.dims = t.shape();
  d.bytes = t.bytes();
  auto p = arena_.take(d.bytes);
  if (!p) return unexpected(device_fault(where, p.error()));
  d.ptr = *p;
  if (d.bytes)
    if (auto e = check(cudaMemcpy(d.ptr, t.data(), d.bytes, cudaMemcpyHostToDevice), where + " upload", false)) return unexpected(*e);
  return d;
}

// A weight on the device, uploaded on first use. Linear and embedding tables keep their stored format
// when a kernel reads it; other block formats are decoded to f16 here, once.
result<const dev_tensor*, exec_error> cuda_executor::weight(executable& ex, const graph::weight_role& role, bool table) {
  const auto key = role.str();
  if (auto it = ex.uploaded.find(key); it != ex.uploaded.end()) return &it->second;
  auto view = ex.weights->find(role);
  if (!view) return unexpected(exec_error{exec_error_code::missing_weight, key, "the weight source has no tensor for it"});
  dev_tensor d;
  if (table && is_quantized(view->type()) && !weight_format_supported(view->type())) {
    const std::int64_t n = view->shape().numel();
    std::vector<float> f(static_cast<std::size_t>(n));
    if (auto r = dequantize_row(view->type(), view->data(), f.data(), n); !r)
      return unexpected(exec_error{exec_error_code::unsupported, key, r.error().message()});
    std::vector<std::uint16_t> h(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
    auto up = upload(tensor_view(dtype::f16, view->shape(), reinterpret_cast<const std::byte*>(h.data())), key);
    if (!up) return unexpected(up.error());
    d = *up;
  } else {
    auto up = upload(*view, key);
    if (!up) return unexpected(up.error());
    d = *up;
  }
  weight_bytes_ += d.bytes;
  return &ex.uploaded.emplace(key, std::move(d)).first->second;
}

result<executable_id, exec_error> cuda_executor::load(const weight_source& weights) {
  const std::lock_guard lock(structure_);
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  auto ex = std::make_unique<executable>();
  ex->weights = &weights;
  exes_.push_back(std::move(ex));
  return executable_id{static_cast<std::uint32_t>(exes_.size() - 1)};
}

result<void, exec_error> cuda_executor::reset_states(executable_id exe) {
  if (exe.value >= exes_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  for (auto& [name, t] : exes_[exe.value]->states)
    if (auto e = check(cudaMemsetAsync(t.ptr, 0, t.bytes, stream_), "reset state " + name, true)) return unexpected(*e);
  if (auto e = check(cudaStreamSynchronize(stream_), "reset states", true)) return unexpected(*e);
  return {};
}

result<void, exec_error> cuda_executor::copy_state_rows(executable_id exe, std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                                        std::span<const std::string> only) {
  if (exe.value >= exes_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  auto& st = exes_[exe.value]->states;
  auto chosen = [&](const std::string& name) { return only.empty() || std::find(only.begin(), only.end(), name) != only.end(); };
  for (const auto& [name, t] : st)
    if (chosen(name))
      if (auto e = check_state_rows(name, t.dims.rank() > 0 ? t.dims[0] : 0, rows)) return unexpected(*e);
  for (auto& [name, t] : st) {
    if (!chosen(name)) continue;
    const auto n = t.dims[0];
    const auto row = n > 0 ? t.bytes / static_cast<std::size_t>(n) : 0;
    auto* base = t.ptr;
    for (const auto& [from, to] : rows)
      if (auto e = check(cudaMemcpyAsync(base + static_cast<std::size_t>(to) * row, base + static_cast<std::size_t>(from) * row, row, cudaMemcpyDeviceToDevice, stream_),
                         "copy state " + name, true))
        return unexpected(*e);
  }
  return {};  // on the executor's stream: ordered before the next step
}

// A LoRA adapter written into slot `index` of a pool: that expert's rows of the uploaded weight are
// copied again from the source (decoded to f16 as at upload when the device holds it so). Nothing to
// do for a weight no entry has uploaded yet: its first upload reads the new bytes. Ordered after every
// step already enqueued (the stream is drained first) and before the next.
result<void, exec_error> cuda_executor::reload_expert(executable_id exe, const graph::weight_role& role, std::int64_t index) {
  if (exe.value >= exes_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  const std::lock_guard lock(structure_);
  auto& ex = *exes_[exe.value];
  const auto key = role.str();
  const auto it = ex.uploaded.find(key);
  if (it == ex.uploaded.end()) return {};
  const auto full = ex.weights->find(role);
  const auto& d = it->second;
  if (!full || full->shape().rank() != 3 || full->shape() != d.dims || index < 0 || index >= full->shape()[0])
    return unexpected(exec_error{exec_error_code::bad_binding, "weight " + key, "expert " + std::to_string(index) + " is not in the source's stack"});
  const std::int64_t NK = full->shape()[1] * full->shape()[2];
  const auto src_bytes = *storage_bytes(full->type(), static_cast<std::uint64_t>(NK));
  const std::byte* src = full->data() + static_cast<std::size_t>(index) * src_bytes;
  std::vector<std::uint16_t> half;
  std::size_t bytes = src_bytes;
  if (d.type != full->type()) {  // decoded to f16 at upload
    std::vector<float> f(static_cast<std::size_t>(NK));
    if (auto r = dequantize_row(full->type(), src, f.data(), NK); !r) return unexpected(exec_error{exec_error_code::unsupported, key, r.error().message()});
    half.resize(f.size());
    for (std::size_t j = 0; j < f.size(); ++j) half[j] = f32_to_f16(f[j]);
    src = reinterpret_cast<const std::byte*>(half.data());
    bytes = half.size() * sizeof(std::uint16_t);
  }
  if (auto e = check(cudaStreamSynchronize(stream_), "reload " + key, true)) return unexpected(*e);
  if (auto e = check(cudaMemcpy(d.ptr + static_cast<std::size_t>(index) * bytes, src, bytes, cudaMemcpyHostToDevice), "reload " + key, true))
    return unexpected(*e);
  return {};
}

result<tensor, exec_error> cuda_executor::read_state(executable_id exe, const std::string& name) const {
  if (exe.value >= exes_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  const auto& st = exes_[exe.value]->states;
  const auto it = st.find(name);
  if (it == st.end()) return unexpected(exec_error{exec_error_code::unknown_id, "state " + name, "no entry declares it"});
  tensor t(it->second.type, it->second.dims);
  if (t.bytes()) {
    if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess) return unexpected(device_fault("read state " + name, cuda_why(e)));
    if (auto e = cudaMemcpy(t.data(), it->second.ptr, t.bytes(), cudaMemcpyDeviceToHost); e != cudaSuccess)
      return unexpected(device_fault("read state " + name, cuda_why(e)));
  }
  return t;
}

memory_report cuda_executor::memory() const {
  const std::lock_guard lock(structure_);
  memory_report m;
  m.weight_bytes = weight_bytes_;
  m.state_bytes = state_bytes_;
  m.scratch_bytes = scratch_bytes_;
  return m;
}

result<entry_id, exec_error> cuda_executor::add_entry(executable_id exe, const graph::graph& g) {
  const std::lock_guard lock(structure_);
  if (exe.value >= exes_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  auto& ex = *exes_[exe.value];
  auto en = std::make_unique<entry>();
  en->exe = exe;
  en->g = g;
  const auto& gg = en->g;

  auto planned = compile::plan_for_target(gg, [&](const graph::weight_role& r) { return ex.weights->find(r); });
  if (!planned) {
    const bool missing = planned.error().reason.find("no tensor") != std::string::npos;
    return unexpected(exec_error{missing ? exec_error_code::missing_weight : exec_error_code::unsupported, planned.error().where,
                                 planned.error().reason});
  }
  en->tp = std::move(*planned);

  // Every value a running equation computes or reads must be a type the kernels handle, checked before
  // anything is allocated.
  if (auto e = check_value_types(gg, en->tp.pruned.runs, "CUDA")) return unexpected(*e);

  // States: one device buffer per name per executable, zeroed, shared by the entries that declare it.
  for (const auto& s : gg.states()) {
    const auto& t = gg.info(s.in).type;
    if (!computable_type(t.type) && !kv_storage_type(t.type))
      return unexpected(exec_error{exec_error_code::unsupported, "state " + s.name, "dtype " + std::string(troupe::name(t.type))});
    auto it = ex.states.find(s.name);
    if (it == ex.states.end()) {
      dev_tensor d;
      d.type = t.type;
      d.dims = t.dims;
      d.bytes = *storage_bytes(t.type, static_cast<std::uint64_t>(t.dims.numel()));
      auto p = arena_.take(d.bytes);
      if (!p) return unexpected(device_fault("state " + s.name, p.error()));
      d.ptr = *p;
      if (auto e = check(cudaMemset(d.ptr, 0, d.bytes), "state " + s.name, false)) return unexpected(*e);
      state_bytes_ += d.bytes;
      ex.states.emplace(s.name, std::move(d));
    } else if (it->second.type != t.type || it->second.dims != t.dims) {
      return unexpected(exec_error{exec_error_code::state_conflict, "state " + s.name,
                                   "declared " + t.str() + " here and " + graph::tensor_type{it->second.type, it->second.dims}.str() + " before"});
    }
  }

  en->arena_bytes = static_cast<std::size_t>(std::max<std::int64_t>(en->tp.plan.arena_bytes, 64));
  auto ar = arena_.take(en->arena_bytes);
  if (!ar) return unexpected(device_fault("entry arena", ar.error()));
  en->arena = *ar;
  scratch_bytes_ += en->arena_bytes;

  // Device addresses: literals and folded constants uploaded for this entry, weights once per
  // executable, states, the arena.
  en->ptr.assign(gg.values().size(), nullptr);
  std::vector<bool> read(gg.values().size(), false);
  for (std::size_t i = 0; i < gg.equations().size(); ++i)
    if (en->tp.pruned.runs[i])
      for (auto v : gg.equations()[i].inputs) read[v.index] = true;
  for (const auto& o : gg.outputs()) read[o.value.index] = true;
  for (const auto& s : gg.states()) read[s.out.index] = true;
  for (const auto& l : gg.literals()) {
    if (!read[l.value.index]) continue;
    auto d = upload(l.data.view(), "literal " + gg.info(l.value).label);
    if (!d) return unexpected(d.error());
    en->ptr[l.value.index] = d->ptr;
    en->own_bytes += d->bytes;
  }
  for (const auto& w : gg.weights()) {
    if (!read[w.value.index] || en->tp.pruned.folded.count(w.value.index)) continue;
    bool table = false;
    for (std::size_t i = 0; i < gg.equations().size() && !table; ++i) {
      const auto& e = gg.equations()[i];
      table = en->tp.pruned.runs[i] && (((e.code == op::linear || e.code == op::linear_id) && e.inputs[1] == w.value) ||
                                        (e.code == op::gather_rows && e.inputs[0] == w.value));
    }
    auto d = weight(ex, w.role, table);
    if (!d) return unexpected(d.error());
    en->ptr[w.value.index] = (*d)->ptr;
  }
  for (auto& [v, t] : en->tp.pruned.folded) {
    if (!read[v]) continue;
    auto d = upload(t.view(), "constant " + gg.info(graph::value_id{v}).label);
    if (!d) return unexpected(d.error());
    en->ptr[v] = d->ptr;
    en->own_bytes += d->bytes;
  }
  weight_bytes_ += en->own_bytes;
  for (const auto& s : gg.states()) en->ptr[s.in.index] = ex.states.at(s.name).ptr;
  for (std::uint32_t v = 0; v < gg.values().size(); ++v) {
    if (en->tp.plan.kind[v] == compile::storage::arena) en->ptr[v] = en->arena + en->tp.plan.offset[v];
    if (en->tp.plan.kind[v] == compile::storage::alias) en->ptr[v] = en->ptr[en->tp.plan.alias_of[v]];
  }

  // Pinned staging for the slots and the outputs.
  std::size_t stage = 0;
  for (const auto& s : gg.slots()) stage += *storage_bytes(gg.info(s.value).type.type, static_cast<std::uint64_t>(gg.info(s.value).type.dims.numel()));
  std::size_t outs = 0;
  for (const auto& o : gg.outputs()) outs += *storage_bytes(gg.info(o.value).type.type, static_cast<std::uint64_t>(gg.info(o.value).type.dims.numel()));
  if (!en->staging.reserve(std::max(stage, outs) + 64)) return unexpected(device_fault("cudaMallocHost", "pinned staging of an entry"));

  if (auto r = lower(*en); !r) return unexpected(r.error());
  for (const auto& o : gg.outputs())
    if (o.name == "logits" && gg.info(o.value).type.dims.rank() == 2 && gg.info(o.value).type.type == dtype::f32) {
      const auto& d = gg.info(o.value).type.dims;
      if (d[1] != hist_vocab_ || d[0] > sample_rows_cap_)
        if (auto e = ensure_sampler(static_cast<int>(std::max<std::int64_t>(d[0], sample_rows_cap_)), d[1])) return unexpected(*e);
    }
  // Uploads and state zeroing went on the default stream; the executor's stream does not wait for it.
  if (auto e = check(cudaDeviceSynchronize(), "add_entry", false)) return unexpected(*e);
  entries_.push_back(std::move(en));
  return entry_id{static_cast<std::uint32_t>(entries_.size() - 1)};
}

result<void, exec_error> cuda_executor::lower(entry& en) {
  const auto& g = en.g;
  const auto choice = compile::choose_fusions(g, en.tp, en.ptr);
  const auto& fused = choice.fused;
  const auto& residual_of = choice.residual_side;
  const auto& gated_of = choice.gated_of;
  for (std::size_t i = 0; i < g.equations().size(); ++i) {
    if (!en.tp.pruned.runs[i] || fused[i]) continue;
    if (auto err = lower_eqn(en, i, residual_of, gated_of)) return unexpected(*err);
  }
  for (const auto& in : en.program) en.host_work = en.host_work || in.host;
  return {};
}

// The format a linear or linear_id weight operand has on the device, or why no GEMV reads it. A folded
// or literal weight is f32 (the fold computes in f32); a stored one has its own format, or f16 when it
// was decoded at upload.
result<dtype, exec_error> cuda_executor::weight_type(const entry& en, graph::value_id wv, const std::string& where) const {
  const auto& g = en.g;
  dtype wtype = g.info(wv).type.type;
  if (const auto b = std::find_if(g.weights().begin(), g.weights().end(), [&](const auto& x) { return x.value == wv; });
      b != g.weights().end() && !en.tp.pruned.folded.count(wv.index)) {
    wtype = exes_[en.exe.value]->uploaded.at(b->role.str()).type;
  } else if (!en.tp.pruned.constant[wv.index]) {
    return unexpected(exec_error{exec_error_code::unsupported, where, "a weight operand must be known at prepare"});
  }
  if (!weight_format_supported(wtype))
    return unexpected(exec_error{exec_error_code::unsupported, where, "no CUDA kernel reads weights stored as " + std::string(troupe::name(wtype))});
  return wtype;
}

std::optional<exec_error> cuda_executor::lower_linear(entry& en, const graph::equation& le, float* y, const float* r,
                                                      const std::string& where) {
  const auto& g = en.g;
  const auto wv = le.inputs[1];
  const auto& wt = g.info(wv).type;
  const std::byte* w = en.ptr[wv.index];
  auto stored = weight_type(en, wv, where);
  if (!stored) return stored.error();
  const dtype wtype = *stored;
  const std::int64_t K = wt.dims[1], N = wt.dims[0];
  const std::int64_t M = K == 0 ? 0 : g.info(le.inputs[0]).type.dims.numel() / K;
  const auto* x = reinterpret_cast<const float*>(en.ptr[le.inputs[0].index]);
  cudaStream_t st = stream_;
  if (M <= opt_.gemv_max_rows) {
    en.program.push_back({[=]() -> std::optional<exec_error> {
      launch_gemv(wtype, w, N, K, x, M, y, r, st);
      return std::nullopt;
    }});
    return std::nullopt;
  }
  // cuBLASLt: y^T [N, M] = W [N, K] x^T, column-major views of the row-major buffers; the residual
  // is C with beta = 1 (C may be y itself).
  const bool half_in = wtype != dtype::f32;
  const auto elem = wtype == dtype::bf16 ? CUDA_R_16BF : wtype == dtype::f32 ? CUDA_R_32F : CUDA_R_16F;
  const bool decode = is_quantized(wtype);
  if (half_in && static_cast<std::size_t>(M * K) * 2 > half_bytes_) {
    auto p = arena_.take(static_cast<std::size_t>(M * K) * 2);
    if (!p) return device_fault(where, p.error());
    half_buf_ = *p;
    half_bytes_ = static_cast<std::size_t>(M * K) * 2;
    scratch_bytes_ += half_bytes_;
    ++epoch_;
  }
  if (decode && static_cast<std::size_t>(N * K) * 2 > decode_bytes_) {
    auto p = arena_.take(static_cast<std::size_t>(N * K) * 2);
    if (!p) return device_fault(where, p.error());
    decode_buf_ = *p;
    decode_bytes_ = static_cast<std::size_t>(N * K) * 2;
    scratch_bytes_ += decode_bytes_;
    ++epoch_;  // graphs captured with the old buffer are captured again
  }
  auto prod = std::make_unique<lt_product>();
  auto lt_check = [&](cublasStatus_t s, const char* what) -> std::optional<exec_error> {
    if (s == CUBLAS_STATUS_SUCCESS) return std::nullopt;
    return exec_error{exec_error_code::unsupported, where, std::string(what) + ": " + lt_why(s)};
  };
  if (auto e = lt_check(cublasLtMatmulDescCreate(&prod->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate")) return e;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (auto e = lt_check(cublasLtMatmulDescSetAttribute(prod->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA")) return e;
  if (auto e = lt_check(cublasLtMatmulDescSetAttribute(prod->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB")) return e;
  if (auto e = lt_check(cublasLtMatrixLayoutCreate(&prod->a, elem, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(N), K), "layout A")) return e;
  if (auto e = lt_check(cublasLtMatrixLayoutCreate(&prod->b, elem, static_cast<std::uint64_t>(K), static_cast<std::uint64_t>(M), K), "layout B")) return e;
  if (auto e = lt_check(cublasLtMatrixLayoutCreate(&prod->c, CUDA_R_32F, static_cast<std::uint64_t>(N), static_cast<std::uint64_t>(M), N), "layout C")) return e;
  cublasLtMatmulPreference_t pref = nullptr;
  if (auto e = lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference")) return e;
  const std::uint64_t ws = workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // The heuristic assumes 256-byte operands unless told: the arena's values are 64-byte aligned (the
  // weights, the decode and half buffers 256).
  auto align_of = [](const void* p) {
    std::uint32_t a = 256;
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const std::uint32_t align_a = decode ? 256u : align_of(w), align_b = half_in ? 256u : align_of(x);
  const std::uint32_t align_c = std::min(align_of(y), r ? align_of(r) : 256u), align_d = align_of(y);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const auto hs = cublasLtMatmulAlgoGetHeuristic(lt_, prod->desc, prod->a, prod->b, prod->c, prod->c, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    return exec_error{exec_error_code::unsupported, where, "cuBLASLt has no algorithm for " + std::string(troupe::name(wtype)) + " [" +
                                                               std::to_string(M) + " x " + std::to_string(K) + "] x [" + std::to_string(N) + "]"};
  prod->algo = heur.algo;
  const lt_product* pp = prod.get();
  en.products.push_back(std::move(prod));
  cublasLtHandle_t lt = lt_;
  std::byte* wsp = workspace_;
  std::byte* const* dbuf = &decode_buf_;
  std::byte* const* hbuf = &half_buf_;
  en.program.push_back({[=, this]() -> std::optional<exec_error> {
    const void* a = w;
    if (decode) {
      launch_decode_f16(wtype, w, N, K, *dbuf, st);
      a = *dbuf;
    }
    const void* b = x;
    if (wtype == dtype::bf16) launch_to_bf16(x, M * K, *hbuf, st), b = *hbuf;
    else if (half_in) launch_to_f16(x, M * K, *hbuf, st), b = *hbuf;
    const float alpha = 1.0f, beta = r ? 1.0f : 0.0f;
    const void* c = r ? static_cast<const void*>(r) : static_cast<const void*>(y);
    if (auto s = cublasLtMatmul(lt, pp->desc, &alpha, a, pp->a, b, pp->b, &beta, c, pp->c, y, pp->c, &pp->algo, wsp, workspace_bytes, st);
        s != CUBLAS_STATUS_SUCCESS) {
      auto err = device_fault(where, "cublasLtMatmul: " + lt_why(s));
      poison(err);
      return err;
    }
    return std::nullopt;
  }});
  return std::nullopt;
}

std::optional<exec_error> cuda_executor::lower_eqn(entry& en, std::size_t i, const std::vector<std::int64_t>& residual_of,
                                                   const std::vector<std::int64_t>& gated_of) {
  lower_ctx c{en, i, residual_of, gated_of};
  switch (lowering_family_of(en.g.equations()[i].code)) {
    using enum lowering_family;
    case elementwise: return lower_elementwise(c);
    case reduce: return lower_reduce(c);
    case movement: return lower_movement(c);
    case linear: return lower_linear(c);
    case moe: return lower_moe(c);
    case collective: return lower_collective(c);
    case norm_rope: return lower_norm_rope(c);
    case attention: return lower_attention(c);
    case recurrent: return lower_recurrent(c);
  }
  return exec_error{exec_error_code::unsupported, "eqn " + std::to_string(i), "no CUDA lowering"};
}

std::optional<exec_error> cuda_executor::run(entry& en, const step_inputs& in) {
  const auto& g = en.g;
  // Slots: checked, staged in pinned memory, copied in.
  if (auto e = check_slots(g, in)) return e;
  std::size_t at = 0;
  for (const auto& s : g.slots()) {
    const auto& v = in.slots.at(s.slot.name);
    if (!en.ptr[s.value.index] || en.tp.plan.kind[s.value.index] != compile::storage::arena || v.bytes() == 0) continue;
    std::memcpy(en.staging.p + at, v.data(), v.bytes());
    if (auto e = check(cudaMemcpyAsync(en.ptr[s.value.index], en.staging.p + at, v.bytes(), cudaMemcpyHostToDevice, stream_), "slot " + s.slot.name, true))
      return e;
    at += v.bytes();
  }
  if (auto e = check(cudaMemsetAsync(flag_, 0, sizeof(step_flag), stream_), "step flag", true)) return e;

  ++en.steps;
  const bool capture = opt_.graphs && !en.host_work && en.steps >= 2;
  if (capture && en.graph && en.graph_epoch != epoch_) {
    cudaGraphExecDestroy(en.graph);
    en.graph = nullptr;
  }
  if (capture && !en.graph) {
    if (auto e = check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture", true)) return e;
    for (auto& f : en.program)
      if (auto e = f.run()) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream_, &broken);
        if (broken) cudaGraphDestroy(broken);
        return e;
      }
    cudaGraph_t graph = nullptr;
    if (auto e = check(cudaStreamEndCapture(stream_, &graph), "graph capture", true)) return e;
    auto inst = cudaGraphInstantiate(&en.graph, graph, 0);
    cudaGraphDestroy(graph);
    if (auto e = check(inst, "graph instantiate", true)) return e;
    en.graph_epoch = epoch_;
  }
  if (capture) {
    if (auto e = check(cudaGraphLaunch(en.graph, stream_), "graph launch", true)) return e;
  } else {
    for (auto& f : en.program)
      if (auto e = f.run()) return e;
  }
  if (auto e = check(cudaGetLastError(), "kernel launch", true)) return e;
  // States computed elsewhere than their buffer are copied into it, unless the step was refused.
  auto& states = exes_[en.exe.value]->states;
  for (const auto& s : g.states()) {
    auto& buf = states.at(s.name);
    if (en.ptr[s.out.index] != buf.ptr) launch_commit(en.ptr[s.out.index], static_cast<std::int64_t>(buf.bytes), buf.ptr, flag_, stream_);
  }
  if (auto e = check(cudaGetLastError(), "state commit", true)) return e;
  return std::nullopt;
}

std::optional<exec_error> cuda_executor::flag_error(entry& en) {
  step_flag f;
  std::memcpy(&f, flag_host_.p, sizeof f);
  if (f.code == flag_none) return std::nullopt;
  std::string where = "eqn " + std::to_string(f.eqn);
  if (f.eqn >= 0 && static_cast<std::size_t>(f.eqn) < en.g.equations().size())
    where += " (" + std::string(graph::op_name(en.g.equations()[static_cast<std::size_t>(f.eqn)].code)) + ")";
  const auto v = std::to_string(f.value), b = std::to_string(f.bound);
  switch (f.code) {
    case flag_gather_range: return exec_error{exec_error_code::index_out_of_range, where, "row " + v + " outside [0, " + b + ")"};
    case flag_scatter_range: return exec_error{exec_error_code::index_out_of_range, where, "slot " + v + " outside [0, " + b + ")"};
    case flag_scatter_twice: return exec_error{exec_error_code::index_out_of_range, where, "slot " + v + " written twice"};
    case flag_kv_range: return exec_error{exec_error_code::index_out_of_range, where, "kv row " + v + " outside [0, " + b + ")"};
    case flag_div_zero: return exec_error{exec_error_code::index_out_of_range, where, "integer division by zero"};
    case flag_take_range: return exec_error{exec_error_code::index_out_of_range, where, "index " + v + " outside [0, " + b + ")"};
    case flag_expert_range: return exec_error{exec_error_code::index_out_of_range, where, "expert " + v + " outside [0, " + b + ")"};
    case flag_state_row: return exec_error{exec_error_code::index_out_of_range, where, "state row " + v + " outside [0, " + b + ")"};
    default: return exec_error{exec_error_code::device_error, where, "unknown step flag " + std::to_string(f.code)};
  }
}

// Copies the named outputs (all when `names` is null) back, waits for the step, and reads its flag.
std::optional<exec_error> cuda_executor::finish_step(entry& en, const std::vector<std::string>* names, step_outputs& out) {
  struct pending {
    const std::string* name;
    graph::value_id value;
    graph::tensor_type type;
    std::size_t at, bytes;
    bool emit;  // asked for; a witness output not asked for is read only to be checked
  };
  std::vector<pending> wanted;
  std::size_t at = 0;
  for (const auto& o : en.g.outputs()) {
    const bool emit = !names || std::find(names->begin(), names->end(), o.name) != names->end();
    const bool witness = std::any_of(en.g.witnesses().begin(), en.g.witnesses().end(), [&](const auto& w) { return w.output == o.name; });
    if (!emit && !witness) continue;
    const auto& t = en.g.info(o.value).type;
    const std::size_t bytes = *storage_bytes(t.type, static_cast<std::uint64_t>(t.dims.numel()));
    if (bytes)
      if (auto e = check(cudaMemcpyAsync(en.staging.p + at, en.ptr[o.value.index], bytes, cudaMemcpyDeviceToHost, stream_), "output " + o.name, true))
        return e;
    wanted.push_back({&o.name, o.value, t, at, bytes, emit});
    at += bytes;
  }
  if (auto e = check(cudaMemcpyAsync(flag_host_.p, flag_, sizeof(step_flag), cudaMemcpyDeviceToHost, stream_), "step flag", true)) return e;
  if (auto e = check(cudaStreamSynchronize(stream_), "step", true)) return e;
  if (auto e = flag_error(en)) return e;
  // A routed graph's witnesses (its router's selections) hold before anything is read back.
  if (!en.g.witnesses().empty())
    if (auto e = check_witnesses(en.g, [&](graph::value_id v) -> const std::byte* {
          for (const auto& w : wanted)
            if (w.value == v) return en.staging.p + w.at;
          return nullptr;
        }))
      return e;
  for (const auto& w : wanted) {
    if (!w.emit) continue;
    tensor r(w.type.type, w.type.dims);
    if (w.bytes) std::memcpy(r.data(), en.staging.p + w.at, w.bytes);
    out.outputs.emplace(*w.name, std::move(r));
  }
  return std::nullopt;
}

result<step_outputs, exec_error> cuda_executor::step(entry_id id, const step_inputs& in) {
  if (id.value >= entries_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "entry", "not added here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  auto& en = *entries_[id.value];
  if (auto e = run(en, in)) return unexpected(*e);
  step_outputs out;
  if (auto e = finish_step(en, nullptr, out)) return unexpected(*e);
  return out;
}

result<void, exec_error> cuda_executor::open_history(std::uint64_t sequence, std::int64_t vocab, std::span<const std::int32_t> prompt,
                                                     std::span<const std::pair<std::int32_t, float>> bias) {
  auto r = executor::open_history(sequence, vocab, prompt, bias);
  if (auto it = slot_of_.find(sequence); it != slot_of_.end()) slots_[static_cast<std::size_t>(it->second)].dirty = true;
  return r;
}

void cuda_executor::close_history(std::uint64_t sequence) {
  executor::close_history(sequence);
  if (auto it = slot_of_.find(sequence); it != slot_of_.end()) {
    slots_[static_cast<std::size_t>(it->second)] = slot_state{};
    slot_of_.erase(it);
  }
}

void cuda_executor::record_history(std::uint64_t sequence, std::span<const std::int32_t> tokens) {
  executor::record_history(sequence, tokens);
  if (auto it = slot_of_.find(sequence); it != slot_of_.end()) slots_[static_cast<std::size_t>(it->second)].dirty = true;
}

// The device slot of a sequence's history, uploading the host's copy when the device's is stale. A
// sequence without a host history has none on the device either (-1). Slots are reused least
// recently used first, never one a row of this step holds.
result<int, exec_error> cuda_executor::history_slot(std::uint64_t sequence, std::int64_t vocab, const std::set<int>& busy) {
  const token_history* h = history(sequence);
  if (!h) return -1;
  if (h->vocab() != vocab)
    return unexpected(exec_error{exec_error_code::bad_sampling, "history of sequence " + std::to_string(sequence),
                                 "vocabulary " + std::to_string(h->vocab()) + " but the logits have " + std::to_string(vocab)});
  int slot = -1;
  if (auto it = slot_of_.find(sequence); it != slot_of_.end()) slot = it->second;
  if (slot < 0) {
    std::uint64_t oldest = ~std::uint64_t{0};
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (busy.count(static_cast<int>(s))) continue;
      if (!slots_[s].used) { slot = static_cast<int>(s); break; }
      if (slots_[s].last_use < oldest) oldest = slots_[s].last_use, slot = static_cast<int>(s);
    }
    if (slot < 0) return unexpected(exec_error{exec_error_code::bad_sampling, "histories", "more rows than device history slots"});
    if (slots_[static_cast<std::size_t>(slot)].used) slot_of_.erase(slots_[static_cast<std::size_t>(slot)].sequence);
    slots_[static_cast<std::size_t>(slot)] = slot_state{sequence, true, true, 0};
    slot_of_[sequence] = slot;
  }
  auto& s = slots_[static_cast<std::size_t>(slot)];
  s.last_use = ++use_clock_;
  if (s.dirty) {
    // Dense counts, prompt flags and bias, staged and copied on the stream (ordered before the sampler).
    const std::size_t V = static_cast<std::size_t>(vocab);
    auto* counts = reinterpret_cast<std::int32_t*>(hist_stage_.p);
    auto* prompt = reinterpret_cast<std::uint8_t*>(hist_stage_.p + V * 8);
    auto* bias = reinterpret_cast<float*>(hist_stage_.p + V * 4);
    // The stage is reused per upload: wait for the previous upload to leave it.
    if (auto e = check(cudaStreamSynchronize(stream_), "history upload", true)) return unexpected(*e);
    for (std::size_t t = 0; t < V; ++t) {
      counts[t] = h->count(static_cast<std::int32_t>(t));
      prompt[t] = h->in_prompt(static_cast<std::int32_t>(t)) ? 1 : 0;
      bias[t] = 0.0f;
    }
    for (const auto& [t, b] : h->bias()) bias[t] += b;
    const std::size_t off = static_cast<std::size_t>(slot) * V;
    if (auto e = check(cudaMemcpyAsync(hist_counts_ + off, counts, V * 4, cudaMemcpyHostToDevice, stream_), "history upload", true)) return unexpected(*e);
    if (auto e = check(cudaMemcpyAsync(hist_bias_ + off, bias, V * 4, cudaMemcpyHostToDevice, stream_), "history upload", true)) return unexpected(*e);
    if (auto e = check(cudaMemcpyAsync(hist_prompt_ + off, prompt, V, cudaMemcpyHostToDevice, stream_), "history upload", true)) return unexpected(*e);
    s.dirty = false;
  }
  return slot;
}

// The sampling head's device buffers for `rows` rows of `vocab` logits: the history table (one slot per
// sequence it keeps), the rows' rules, picks, masks and scratch. Sized when an entry with logits is
// added, so a serving step allocates nothing.
std::optional<exec_error> cuda_executor::ensure_sampler(int R, std::int64_t vocab) {
  if (hist_vocab_ != 0 && hist_vocab_ != vocab)
    return exec_error{exec_error_code::unsupported, "logits",
                      "a vocabulary of " + std::to_string(vocab) + " beside " + std::to_string(hist_vocab_) + ": one sampling vocabulary per executor"};
  const std::int64_t words = (vocab + 31) / 32;
  const std::size_t V = static_cast<std::size_t>(vocab);
  // The history table: at least history_slots sequences, and every row of the largest batch.
  const std::size_t slots = static_cast<std::size_t>(std::max(opt_.history_slots, R));
  if (slots > slots_.size()) {
    if (!hist_stage_.reserve(V * 9)) return device_fault("cudaMallocHost", "history staging");
    auto c = arena_.take(slots * V * 4);
    auto p = arena_.take(slots * V);
    auto b = arena_.take(slots * V * 4);
    if (!c || !p || !b) return device_fault("sampling histories", !c ? c.error() : !p ? p.error() : b.error());
    hist_counts_ = reinterpret_cast<std::int32_t*>(*c);
    hist_prompt_ = reinterpret_cast<std::uint8_t*>(*p);
    hist_bias_ = reinterpret_cast<float*>(*b);
    state_bytes_ += slots * V * 9;
    slots_.assign(slots, slot_state{});  // the new table holds nothing yet: every sequence uploads again
    slot_of_.clear();
  }
  if (sample_rows_cap_ < R) {
    const int cap = std::max(R, 8);
    const std::size_t rows_b = static_cast<std::size_t>(cap) * sizeof(device_sample_row), outs_b = static_cast<std::size_t>(cap) * sizeof(device_sample_out);
    const std::size_t masks_b = static_cast<std::size_t>(cap * words) * 4;
    if (!sample_stage_.reserve(rows_b + outs_b + masks_b)) return device_fault("cudaMallocHost", "sampling staging");
    auto rp = arena_.take(rows_b);
    auto op = arena_.take(outs_b);
    auto mp = arena_.take(masks_b);
    auto wp = arena_.take(sample_work_bytes(cap, vocab));
    if (!rp || !op || !mp || !wp) return device_fault("sampling buffers", "out of device memory");
    rows_dev_ = reinterpret_cast<device_sample_row*>(*rp);
    out_dev_ = reinterpret_cast<device_sample_out*>(*op);
    masks_dev_ = reinterpret_cast<std::uint32_t*>(*mp);
    sample_work_ = *wp;
    scratch_bytes_ += rows_b + outs_b + masks_b + sample_work_bytes(cap, vocab);
    sample_rows_cap_ = cap;
  }
  hist_vocab_ = vocab;
  return std::nullopt;
}

result<std::vector<sampled_row>, exec_error> cuda_executor::step_sample(entry_id id, const step_inputs& in,
                                                                        std::span<const sample_row_request> rows, const mask_hook& masks,
                                                                        step_outputs* rest) {
  if (id.value >= entries_.size()) return unexpected(exec_error{exec_error_code::unknown_id, "entry", "not added here"});
  if (auto e = refused_if_poisoned()) return unexpected(*e);
  auto& en = *entries_[id.value];
  const auto lo = std::find_if(en.g.outputs().begin(), en.g.outputs().end(), [](const auto& o) { return o.name == "logits"; });
  if (lo == en.g.outputs().end()) return unexpected(exec_error{exec_error_code::bad_binding, "head", "the entry returns no logits to sample"});
  const auto& lt = en.g.info(lo->value).type;
  if (lt.dims.rank() != 2 || lt.type != dtype::f32 || lt.dims[0] < static_cast<std::int64_t>(rows.size()))
    return unexpected(exec_error{exec_error_code::bad_binding, "head", "logits are not f32 [rows, vocab] covering every sampled row"});
  const std::int64_t vocab = lt.dims[1];
  const int R = static_cast<int>(rows.size());
  for (int r = 0; r < R; ++r)
    if (auto c = exec::check(rows[static_cast<std::size_t>(r)].params); !c)
      return unexpected(exec_error{exec_error_code::bad_sampling, "row " + std::to_string(r), c.error().message()});
  static_assert(max_top_logprobs <= max_device_top_logprobs, "check() bounds top_logprobs by what the device reports");

  // The sampler's buffers were sized when the entry was added (its logits' rows and vocabulary).
  const std::int64_t words = (vocab + 31) / 32;
  if (hist_vocab_ != vocab || sample_rows_cap_ < R) {
    const std::lock_guard lock(structure_);
    if (auto e = ensure_sampler(R, vocab)) return unexpected(*e);
  }

  // The forward pass runs on the device while the host fills the masks and the rows' rules.
  if (auto e = run(en, in)) return unexpected(*e);
  std::vector<std::vector<std::uint32_t>> mask_words(rows.size());
  if (masks) masks(mask_words);
  auto* params = reinterpret_cast<device_sample_row*>(sample_stage_.p);
  auto* mask_stage = reinterpret_cast<std::uint32_t*>(sample_stage_.p + static_cast<std::size_t>(sample_rows_cap_) * sizeof(device_sample_row));
  auto* outs = reinterpret_cast<device_sample_out*>(sample_stage_.p + static_cast<std::size_t>(sample_rows_cap_) * (sizeof(device_sample_row) + static_cast<std::size_t>(words) * 4));
  std::set<int> busy;
  bool any_mask = false;
  for (int r = 0; r < R; ++r) {
    const auto& q = rows[static_cast<std::size_t>(r)];
    auto& d = params[r];
    d = device_sample_row{};
    d.temperature = q.params.temperature;
    d.top_p = q.params.top_p;
    d.min_p = q.params.min_p;
    d.repetition_penalty = q.params.repetition_penalty;
    d.presence_penalty = q.params.presence_penalty;
    d.frequency_penalty = q.params.frequency_penalty;
    d.top_k = q.params.top_k;
    d.top_logprobs = q.params.top_logprobs;
    d.seed = q.params.seed;
    d.draw = q.draw;
    auto slot = history_slot(q.sequence, vocab, busy);
    if (!slot) {
      cudaStreamSynchronize(stream_);
      return unexpected(slot.error());
    }
    d.history = *slot;
    if (*slot >= 0) busy.insert(*slot);
    const auto& m = mask_words[static_cast<std::size_t>(r)];
    if (!m.empty()) {
      bool allows = false;
      for (std::int64_t t = 0; t < vocab && !allows; t += 32) allows = m.size() == static_cast<std::size_t>(words) && m[static_cast<std::size_t>(t / 32)] != 0;
      if (m.size() != static_cast<std::size_t>(words) || !allows) {
        cudaStreamSynchronize(stream_);
        return unexpected(exec_error{exec_error_code::bad_sampling, "row " + std::to_string(r),
                                     m.size() != static_cast<std::size_t>(words) ? "a mask of " + std::to_string(m.size()) + " words for " + std::to_string(words)
                                                                                 : "the mask allows no token"});
      }
      std::memcpy(mask_stage + static_cast<std::size_t>(r) * static_cast<std::size_t>(words), m.data(), m.size() * 4);
      d.masked = 1;
      any_mask = true;
    }
  }
  if (auto e = check(cudaMemcpyAsync(rows_dev_, params, static_cast<std::size_t>(R) * sizeof(device_sample_row), cudaMemcpyHostToDevice, stream_), "sampling rows", true))
    return unexpected(*e);
  if (any_mask)
    if (auto e = check(cudaMemcpyAsync(masks_dev_, mask_stage, static_cast<std::size_t>(R * words) * 4, cudaMemcpyHostToDevice, stream_), "masks", true))
      return unexpected(*e);
  const auto* logits = reinterpret_cast<const float*>(en.ptr[lo->value.index]);
  if (R > 0)
    launch_sample(logits, vocab, vocab, R, rows_dev_, device_history_table{hist_counts_, hist_prompt_, hist_bias_}, masks_dev_, words, out_dev_,
                  sample_work_, stream_);
  if (auto e = check(cudaGetLastError(), "sampling launch", true)) return unexpected(*e);
  if (auto e = check(cudaMemcpyAsync(outs, out_dev_, static_cast<std::size_t>(R) * sizeof(device_sample_out), cudaMemcpyDeviceToHost, stream_), "picks", true))
    return unexpected(*e);
  // Logits only for the rows that asked (Head::Logits), read with the picks.
  bool want = false;
  for (const auto& q : rows) want = want || q.want_logits;
  step_outputs lg;
  // Logits only where a row asked; the other outputs (a hidden carry) where the caller asked.
  std::vector<std::string> names;
  if (want) names.push_back("logits");
  if (rest)
    for (const auto& o : en.g.outputs())
      if (o.name != "logits") names.push_back(o.name);
  if (auto e = finish_step(en, &names, lg)) {
    // The device may have recorded picks the host will not: its copies of these histories are stale.
    for (int slot : busy) slots_[static_cast<std::size_t>(slot)].dirty = true;
    return unexpected(*e);
  }
  std::vector<sampled_row> picks(rows.size());
  for (int r = 0; r < R; ++r) {
    const auto& o = outs[r];
    auto& p = picks[static_cast<std::size_t>(r)];
    p.pick.token = o.token;
    p.pick.logprob = o.logprob;
    p.pick.non_finite = o.non_finite != 0;
    for (int k = 0; k < o.top_count && k < max_device_top_logprobs; ++k) p.pick.top.push_back({o.top_tokens[k], o.top_logprobs[k]});
    // The device recorded the pick into its slot; the host copy follows without marking it stale.
    const std::int32_t tok = o.token;
    executor::record_history(rows[static_cast<std::size_t>(r)].sequence, std::span(&tok, 1));
    if (rows[static_cast<std::size_t>(r)].want_logits) {
      const auto& t = lg.outputs.at("logits");
      const float* row = t.as<float>() + static_cast<std::int64_t>(r) * vocab;
      p.logits.assign(row, row + vocab);
    }
  }
  if (rest) {
    lg.outputs.erase("logits");
    rest->outputs = std::move(lg.outputs);
  }
  return picks;
}

result<std::vector<device_info>, std::string> devices() {
  int count = 0;
  if (auto e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return unexpected("no usable CUDA device: " + cuda_why(e));
  }
  if (count == 0) return unexpected(std::string("no CUDA device on this machine"));
  std::vector<device_info> out;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (auto e = cudaGetDeviceProperties(&p, d); e != cudaSuccess) return unexpected("cudaGetDeviceProperties: " + cuda_why(e));
    out.push_back({d, p.name, p.totalGlobalMem, p.major, p.minor, p.multiProcessorCount});
  }
  return out;
}

result<std::unique_ptr<executor>, exec_error> make_executor(const cuda_options& options) {
  auto devs = devices();
  if (!devs) return unexpected(device_fault("cuda", devs.error()));
  if (options.device < 0 || options.device >= static_cast<int>(devs->size()))
    return unexpected(device_fault("cuda", "device " + std::to_string(options.device) + " of " + std::to_string(devs->size())));
  auto ex = std::make_unique<cuda_executor>(options);
  if (auto r = ex->init(); !r) return unexpected(r.error());
  return std::unique_ptr<executor>(std::move(ex));
}

result<double, std::string> copy_bandwidth(int device, std::size_t bytes, int repeats) {
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return unexpected("cudaSetDevice: " + cuda_why(e));
  void *a = nullptr, *b = nullptr;
  if (auto e = cudaMalloc(&a, bytes); e != cudaSuccess) return unexpected("cudaMalloc: " + cuda_why(e));
  if (auto e = cudaMalloc(&b, bytes); e != cudaSuccess) {
    cudaFree(a);
    return unexpected("cudaMalloc: " + cuda_why(e));
  }
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  cudaEventRecord(t0);
  for (int i = 0; i < repeats; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(a);
  cudaFree(b);
  if (auto e = cudaGetLastError(); e != cudaSuccess) return unexpected(cuda_why(e));
  return 2.0 * static_cast<double>(bytes) * repeats / (static_cast<double>(ms) * 1e-3) / 1e9;
}

}  // namespace troupe::exec::cuda
