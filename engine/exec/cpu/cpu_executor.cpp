#include "engine/exec/cpu/cpu_executor.hpp"
#include "engine/exec/lowering.hpp"
#include "engine/compile/fusion.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "engine/compile/passes.hpp"
#include "engine/exec/cpu/kernels.hpp"
#include "engine/exec/cpu/matmul.hpp"
#include "engine/exec/cpu/matmul_detail.hpp"
#include "engine/exec/cpu/lowering/lower.hpp"
#include "engine/exec/cpu/thread_pool.hpp"


namespace troupe::exec::cpu {

namespace {

// A weight read in place that the executor copies out of a file mapping (a norm or a bias; not an
// embedding table, of which the steps read a few rows).
constexpr std::size_t small_weight_bytes = std::size_t{1} << 20;

using graph::op;
using lowering::entry;
using lowering::executable;
using lowering::instr;

// TROUPE_PROFILE_OPS=1: every step times each instruction, and the totals per operation (with the
// output's shape) go to stderr when the process ends. A tool for finding where a step's time goes.
struct op_profile {
  bool on = [] {
    const char* e = std::getenv("TROUPE_PROFILE_OPS");
    return e && *e && *e != '0';
  }();
  std::mutex m;
  std::map<std::string, std::pair<double, std::int64_t>> total;  // seconds, calls
  std::int64_t steps = 0;
  ~op_profile() {
    if (!on || total.empty()) return;
    double all = 0;
    for (const auto& [_, v] : total) all += v.first;
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [k, v] : total) rows.emplace_back(v.first, k + " x" + std::to_string(v.second));
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "op profile: %lld steps, %.3f s in instructions\n", static_cast<long long>(steps), all);
    for (const auto& [t, k] : rows) std::fprintf(stderr, "  %6.2f%% %9.3f ms  %s\n", 100 * t / all, 1e3 * t, k.c_str());
  }
};

op_profile& profile() {
  static op_profile p;
  return p;
}

}  // namespace

struct cpu_executor::impl {
  cpu_options opt;
  isa level;
  thread_pool pool;
  std::vector<std::unique_ptr<executable>> exes;
  std::vector<std::unique_ptr<entry>> entries;
  // Guards what memory() reads (the executables, entries, states and packed weights) against load()
  // and add_entry() growing them: memory() is asked from other actors' threads while the driver's
  // thread compiles. Steps only read the structure, so they take no lock.
  mutable std::mutex structure;

  explicit impl(cpu_options o) : opt(o), level(o.level && usable(*o.level) ? *o.level : best_isa()), pool(o.threads) {}

  result<void, exec_error> lower(entry& en, executable& ex);
  instr lower_eqn(entry& en, executable& ex, std::size_t i,
                  const std::vector<std::int64_t>& residual_of, const std::vector<std::int64_t>& gated_of,
                  std::optional<exec_error>& err);
};

double logprob_bound(dtype weights) {
  switch (weights) {
    case dtype::f32: case dtype::f16: case dtype::fp8_s32: return 2e-4;  // FP8: f32 products of the exact weights
    case dtype::bf16: return 4e-2;
    default: return packable(weights) ? 0.25 : 1e-2;
  }
}

cpu_executor::cpu_executor(cpu_options opt) : impl_(std::make_unique<impl>(opt)) {}
cpu_executor::~cpu_executor() = default;
isa cpu_executor::level() const { return impl_->level; }
int cpu_executor::threads() const { return impl_->pool.size(); }
std::size_t cpu_executor::kernel_calls(entry_id entry) const {
  return entry.value < impl_->entries.size() ? impl_->entries[entry.value]->program.size() : 0;
}

result<executable_id, exec_error> cpu_executor::load(const weight_source& weights) {
  const std::lock_guard lock(impl_->structure);
  auto ex = std::make_unique<executable>();
  ex->weights = &weights;
  impl_->exes.push_back(std::move(ex));
  return executable_id{static_cast<std::uint32_t>(impl_->exes.size() - 1)};
}

result<void, exec_error> cpu_executor::reset_states(executable_id exe) {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  for (auto& [_, t] : impl_->exes[exe.value]->states) std::memset(t.data(), 0, t.bytes());
  return {};
}

result<void, exec_error> cpu_executor::copy_state_rows(executable_id exe, std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                                       std::span<const std::string> only) {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  auto& st = impl_->exes[exe.value]->states;
  auto chosen = [&](const std::string& name) { return only.empty() || std::find(only.begin(), only.end(), name) != only.end(); };
  for (const auto& [name, t] : st)
    if (chosen(name))
      if (auto e = check_state_rows(name, t.shape().rank() > 0 ? t.shape()[0] : 0, rows)) return unexpected(*e);
  for (auto& [name, t] : st) {
    if (!chosen(name)) continue;
    const auto n = t.shape()[0];
    const auto row = n > 0 ? t.bytes() / static_cast<std::size_t>(n) : 0;
    for (const auto& [from, to] : rows)
      std::memmove(t.data() + static_cast<std::size_t>(to) * row, t.data() + static_cast<std::size_t>(from) * row, row);
  }
  return {};
}

result<void, exec_error> cpu_executor::reload_expert(executable_id exe, const graph::weight_role& role, std::int64_t index) {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  auto& ex = *impl_->exes[exe.value];
  const std::lock_guard lock(impl_->structure);
  const auto it = ex.experts.find(role.str());
  if (it == ex.experts.end()) return {};  // packed from the source when an entry first reads it
  const auto full = ex.weights->find(role);
  const std::int64_t E = static_cast<std::int64_t>(it->second.size());
  if (!full || full->shape().rank() != 3 || full->shape()[0] != E || index < 0 || index >= E)
    return unexpected(exec_error{exec_error_code::bad_binding, "weight " + role.str(), "expert " + std::to_string(index) + " is not in the source's stack"});
  const std::int64_t N = full->shape()[1], K = full->shape()[2];
  const auto per = *storage_bytes(full->type(), static_cast<std::uint64_t>(N * K));
  auto pk = packed_matrix::pack(tensor_view(full->type(), troupe::shape{N, K}, full->data() + static_cast<std::size_t>(index) * per));
  if (!pk) return unexpected(exec_error{exec_error_code::unsupported, "weight " + role.str(), pk.error()});
  it->second[static_cast<std::size_t>(index)] = std::move(*pk);
  return {};
}

result<tensor, exec_error> cpu_executor::read_state(executable_id exe, const std::string& name) const {
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  const auto& st = impl_->exes[exe.value]->states;
  const auto it = st.find(name);
  if (it == st.end()) return unexpected(exec_error{exec_error_code::unknown_id, "state " + name, "no entry declares it"});
  return it->second;
}

memory_report cpu_executor::memory() const {
  const std::lock_guard lock(impl_->structure);
  memory_report m;
  for (const auto& ex : impl_->exes) {
    for (const auto& [_, t] : ex->states) m.state_bytes += t.bytes();
    for (const auto& [_, p] : ex->packed) m.weight_bytes += p.bytes();
    for (const auto& [_, ps] : ex->experts)
      for (const auto& p : ps) m.weight_bytes += p.bytes();
  }
  for (const auto& en : impl_->entries) {
    m.scratch_bytes += en->arena.bytes();
    for (const auto& [_, t] : en->tp.pruned.folded) m.weight_bytes += t.bytes();
    for (const auto& p : en->own_packed) m.weight_bytes += p.bytes();
  }
  return m;
}

result<entry_id, exec_error> cpu_executor::add_entry(executable_id exe, const graph::graph& g) {
  const std::lock_guard lock(impl_->structure);
  if (exe.value >= impl_->exes.size()) return unexpected(exec_error{exec_error_code::unknown_id, "executable", "not loaded here"});
  auto& ex = *impl_->exes[exe.value];
  auto en = std::make_unique<entry>();
  en->exe = exe;
  en->g = g;
  const auto& gg = en->g;

  auto planned = compile::plan_for_target(gg, [&](const graph::weight_role& r) { return ex.weights->find(r); });
  if (!planned) {
    const bool missing = planned.error().reason.find("no tensor") != std::string::npos;
    return unexpected(exec_error{missing ? exec_error_code::missing_weight : exec_error_code::unsupported, planned.error().where, planned.error().reason});
  }
  en->tp = std::move(*planned);

  // States: one buffer per name per executable, shared by every entry that declares it.
  for (const auto& s : gg.states()) {
    const auto& t = gg.info(s.in).type;
    if (!computable_type(t.type) && !kv_storage_type(t.type))
      return unexpected(exec_error{exec_error_code::unsupported, "state " + s.name, "dtype " + std::string(troupe::name(t.type))});
    auto it = ex.states.find(s.name);
    if (it == ex.states.end()) {
      ex.states.emplace(s.name, tensor(t.type, t.dims));
    } else if (it->second.type() != t.type || it->second.shape() != t.dims) {
      return unexpected(exec_error{exec_error_code::state_conflict, "state " + s.name,
                                   "declared " + t.str() + " here and " + graph::tensor_type{it->second.type(), it->second.shape()}.str() + " before"});
    }
  }

  en->arena = tensor(dtype::u8, {std::max<std::int64_t>(en->tp.plan.arena_bytes, 64)});

  // Resolve every value's bytes.
  en->ptr.assign(gg.values().size(), nullptr);
  for (const auto& l : gg.literals()) en->ptr[l.value.index] = const_cast<std::byte*>(l.data.data());
  // A weight only a linear reads is packed, and the packing releases its pages. A small one some other
  // op reads at each step (a norm, a bias) gets the executable's own copy: read in place from a file
  // mapping it would fault a page of the file back in on the first step, and keep it.
  std::vector<char> in_place(gg.values().size(), 0);
  for (const auto& q : gg.equations())
    for (std::size_t k = 0; k < q.inputs.size(); ++k)
      if (!(k == 1 && (q.code == graph::op::linear || q.code == graph::op::linear_id))) in_place[q.inputs[k].index] = 1;
  std::vector<tensor_view> held;  // small weights packed by the lowering
  for (const auto& w : gg.weights()) {
    const auto view = *ex.weights->find(w.role);
    std::byte* p = const_cast<std::byte*>(view.data());
    const bool small = view.bytes() <= small_weight_bytes;
    if (small && in_place[w.value.index] && ex.weights->file_backed(view)) {
      auto it = ex.copies.find(w.role.str());
      if (it == ex.copies.end()) {
        tensor t(view.type(), view.shape());
        std::memcpy(t.data(), view.data(), view.bytes());
        it = ex.copies.emplace(w.role.str(), std::move(t)).first;
        // Now, not after lowering: the copy's fault may have mapped the folio around it, neighbours'
        // pages with it, and packing must not grow beside them.
        ex.weights->release(view, true);
      }
      p = it->second.data();
    } else if (small && !in_place[w.value.index]) {
      held.push_back(view);  // packed
    }
    en->ptr[w.value.index] = p;
  }
  for (auto& [v, t] : en->tp.pruned.folded) en->ptr[v] = t.data();
  for (const auto& s : gg.states()) en->ptr[s.in.index] = ex.states.at(s.name).data();
  for (std::uint32_t v = 0; v < gg.values().size(); ++v) {
    if (en->tp.plan.kind[v] == compile::storage::arena) en->ptr[v] = en->arena.data() + en->tp.plan.offset[v];
    if (en->tp.plan.kind[v] == compile::storage::alias) en->ptr[v] = en->ptr[en->tp.plan.alias_of[v]];
  }
  if (auto r = impl_->lower(*en, ex); !r) return unexpected(r.error());
  // The small packed weights are held in their own form now; drop the file pages they were read from,
  // those they share with neighbours included.
  for (const auto& view : held) ex.weights->release(view, true);
  detail::trim_weight_slabs();  // the unused end of the weight slab being carved (matmul.cpp)
  impl_->entries.push_back(std::move(en));
  return entry_id{static_cast<std::uint32_t>(impl_->entries.size() - 1)};
}

result<void, exec_error> cpu_executor::impl::lower(entry& en, executable& ex) {
  const auto& g = en.g;
  if (auto e = check_value_types(g, en.tp.pruned.runs, "CPU")) return unexpected(*e);
  const auto choice = compile::choose_fusions(g, en.tp, en.ptr);
  const auto& fused = choice.fused;
  const auto& residual_of = choice.residual_side;
  const auto& gated_of = choice.gated_of;
  std::vector<std::size_t> order;  // the equations that run on their own, in order
  for (std::size_t i = 0; i < g.equations().size(); ++i)
    if (en.tp.pruned.runs[i] && !fused[i]) order.push_back(i);
  for (std::size_t k = 0; k < order.size();) {
    const std::size_t i = order[k];
    std::size_t end = k + 1;
    const bool experts = g.equations()[i].code == graph::op::linear_id;
    auto siblings = experts ? lowering::linear_id_siblings : lowering::linear_siblings;
    while (end < order.size() && siblings(g, g.equations()[i], g.equations()[order[end]])) ++end;
    std::optional<exec_error> err;
    instr f;
    if (end - k > 1) {
      lowering::lower_ctx c{en, ex, i, residual_of, gated_of, err, level, &pool, opt};
      const auto group = std::span(order).subspan(k, end - k);
      f = experts ? lowering::lower_linear_id_group(c, group) : lowering::lower_linear_group(c, group);
    } else {
      f = lower_eqn(en, ex, i, residual_of, gated_of, err);
    }
    if (err) return unexpected(*err);
    if (f) {
      en.program.push_back(std::move(f));
      en.program_eqn.push_back(static_cast<std::uint32_t>(i));
    }
    k = end;
  }
  return {};
}

instr cpu_executor::impl::lower_eqn(entry& en, executable& ex, std::size_t i,
                                    const std::vector<std::int64_t>& residual_of, const std::vector<std::int64_t>& gated_of,
                                    std::optional<exec_error>& err) {
  lowering::lower_ctx c{en, ex, i, residual_of, gated_of, err, level, &pool, opt};
  switch (lowering_family_of(en.g.equations()[i].code)) {
    using enum lowering_family;
    case elementwise: return lowering::lower_elementwise(c);
    case reduce: return lowering::lower_reduce(c);
    case movement: return lowering::lower_movement(c);
    case linear: return lowering::lower_linear(c);
    case moe: return lowering::lower_moe(c);
    case collective: return lowering::lower_collective(c);
    case norm_rope: return lowering::lower_norm_rope(c);
    case attention: return lowering::lower_attention(c);
    case recurrent: return lowering::lower_recurrent(c);
  }
  err = exec_error{exec_error_code::unsupported, "eqn " + std::to_string(i), "no CPU lowering"};
  return nullptr;
}

result<step_views, exec_error> cpu_executor::step_in_place(entry_id id, const step_inputs& in) {
  if (id.value >= impl_->entries.size()) return unexpected(exec_error{exec_error_code::unknown_id, "entry", "not added here"});
  auto& en = *impl_->entries[id.value];
  const auto& g = en.g;
  if (auto e = check_slots(g, in)) return unexpected(*e);
  for (const auto& s : g.slots()) {
    const auto& v = in.slots.at(s.slot.name);
    if (en.ptr[s.value.index] && en.tp.plan.kind[s.value.index] == compile::storage::arena) std::memcpy(en.ptr[s.value.index], v.data(), v.bytes());
  }
  if (profile().on) {
    std::vector<double> took(en.program.size());
    for (std::size_t k = 0; k < en.program.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      if (auto e = en.program[k]()) return unexpected(*e);
      took[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    auto& p = profile();
    const std::lock_guard lock(p.m);
    ++p.steps;
    for (std::size_t k = 0; k < took.size(); ++k) {
      const auto& eq = g.equations()[en.program_eqn[k]];
      auto& slot = p.total[std::string(graph::op_name(eq.code)) + " " + g.info(eq.out).type.dims.str()];
      slot.first += took[k];
      ++slot.second;
    }
  } else {
    for (auto& f : en.program)
      if (auto e = f()) return unexpected(*e);
  }
  if (auto e = check_witnesses(g, [&](graph::value_id v) -> const std::byte* { return en.ptr[v.index]; })) return unexpected(*e);
  // A state updated in place needs nothing more; one computed elsewhere is copied into its buffer.
  auto& states = impl_->exes[en.exe.value]->states;
  for (const auto& s : g.states()) {
    auto& buf = states.at(s.name);
    if (en.ptr[s.out.index] != buf.data()) std::memmove(buf.data(), en.ptr[s.out.index], buf.bytes());
  }
  step_views out;
  for (const auto& o : g.outputs()) {
    const auto& t = g.info(o.value).type;
    out.outputs.emplace_back(o.name, tensor_view(t.type, t.dims, en.ptr[o.value.index]));
  }
  return out;
}

int cpu_executor::row_workers() const { return impl_->pool.size(); }

void cpu_executor::for_each_row(std::size_t n, const std::function<void(std::size_t row, int worker)>& fn) {
  impl_->pool.parallel_for(static_cast<std::int64_t>(n), [&](std::int64_t r, int worker) { fn(static_cast<std::size_t>(r), worker); });
}

result<step_outputs, exec_error> cpu_executor::step(entry_id id, const step_inputs& in) {
  auto views = step_in_place(id, in);
  if (!views) return unexpected(views.error());
  step_outputs out;
  for (const auto& [name, v] : views->outputs) out.outputs.emplace(name, tensor::copy_of(v));
  return out;
}

}  // namespace troupe::exec::cpu
