// Attention's plan: how the work is cut into (row, kv head, query block, key range) tasks, and the
// merge of key ranges that were split across threads. The per-task kernel, one per isa level, is
// kernels_detail::attention_task_run (detail/kernels_impl.hpp).
//
// A task owns one kv head and every query head of its group, so K and V are streamed once per kv head
// however many query heads share it (the decode bound), and a block of query tokens reuses each K/V
// tile from cache (the prefill bound). When rows x kv heads leave threads idle (decode of one
// sequence), each row's keys are split into ranges whose partial softmax states are merged here.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "engine/exec/cpu/detail/kernels_table.hpp"
#include "engine/exec/cpu/kernels.hpp"

namespace troupe::exec::cpu {
namespace {

// Queries (tokens x group heads) per task: each K/V tile, read once from memory, serves them all.
constexpr std::int64_t queries_per_task = 32;
// The fewest keys worth a task of their own when a row's keys are split.
constexpr std::int64_t min_keys_per_split = 256;
// Decode tokens and the tokens of a verify window (attention_args::per_token) run the per-query form
// over key ranges that depend on the capacity alone (not on the pool's threads or the other rows). A
// token's output is then the same bits whatever else the step holds (how many tokens a row verifies,
// how many rows are batched) and however many threads run it, so a verify window gives the logits
// decode would have given. (The block form sums in another order: on a q8_0 file, whose activations
// are rounded to 8 bits before each product, that one-ulp difference grew to 0.05 of log-probability
// and changed a greedy token 49 steps on.) Prefill chunks keep the block form, which gives a prompt
// token the same bits in any chunk, so a prefix-cache hit and a miss agree.

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Per-thread scratch, grown as needed and kept, so a warm step allocates nothing here.
struct task_scratch {
  std::vector<float> floats;
  std::vector<std::int32_t> keys;
  std::vector<std::uint8_t> any;
};

task_scratch& thread_scratch() {
  thread_local task_scratch s;
  return s;
}

float* aligned_floats(std::vector<float>& v, std::size_t n) {
  if (v.size() < n + 16) v.resize(n + 16);
  const auto addr = reinterpret_cast<std::uintptr_t>(v.data());
  return v.data() + (64 - addr % 64) % 64 / sizeof(float);
}

}  // namespace

void attention(const attention_args& a, thread_pool& pool, isa level) {
  if (a.R <= 0 || a.T <= 0 || a.Hq <= 0 || a.Hkv <= 0 || a.Dv <= 0) return;
  const auto& kernels = kernels_detail::kernels_for(level);
  const std::int64_t G = a.Hq / a.Hkv;
  const std::int64_t threads = pool.size();

  // Tokens per task, made a whole number of 16-query vectors where the group allows (the block form's
  // lanes); fewer when there are too few (row, kv head) pairs to give each thread two tasks.
  std::int64_t bq = ceil_div(queries_per_task, G);
  const std::int64_t lanes = 16 / std::gcd<std::int64_t>(G, 16);  // tokens that make G x tokens a multiple of 16
  bq = std::clamp<std::int64_t>(ceil_div(bq, lanes) * lanes, 1, a.T);
  bq = std::min(bq, std::max<std::int64_t>(1, a.T / ceil_div(2 * threads, a.R * a.Hkv)));
  // A verify window: a row's tokens in one task a kv head (each token computed as decode computes it,
  // the keys read once for all of them; kernels_impl.hpp attention_task_typed).
  if (a.per_token) bq = a.T;
  const std::int64_t blocks = ceil_div(a.T, bq);
  std::int64_t splits = 1;
  if (bq == 1 || a.per_token)  // the same ranges for a token alone or among others, on any pool
    splits = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(std::clamp<std::int64_t>(a.C / min_keys_per_split, 1, 64))));
  // One token per task (decode): the task takes every kv head, so that it streams whole K and V rows
  // (all heads of a key are adjacent) rather than every Hkv-th piece of them; unless that leaves
  // threads idle (one row of fewer than 512 keys: a single task), when each kv head is a task. A query's
  // bits do not depend on which heads share its task, only on its key ranges.
  const bool whole_rows = bq == 1 && !a.per_token && a.R * splits >= threads;
  const std::int64_t heads_per_task = whole_rows ? a.Hkv : 1;
  const std::int64_t head_groups = a.Hkv / heads_per_task;
  const std::int64_t units = a.R * head_groups * blocks;
  const std::int64_t gq = heads_per_task * G;  // queries per token of a task

  if (bq > 1 && !a.per_token && units < 2 * threads)
    splits = std::clamp<std::int64_t>(ceil_div(2 * threads, units), 1, std::max<std::int64_t>(1, a.C / min_keys_per_split));
  const std::int64_t span = std::max<std::int64_t>(1, ceil_div(a.C, splits));
  splits = std::max<std::int64_t>(1, ceil_div(a.C, span));

  const std::int64_t part_stride = bq * gq * (a.Dv + 2);
  // Sinks join in the merge: the tasks leave partial softmax states even when nothing is split.
  const bool merge = splits > 1 || a.sinks != nullptr;
  std::vector<float> part(merge ? static_cast<std::size_t>(units * splits * part_stride) : 0);
  const auto scratch_floats = static_cast<std::size_t>(std::max(kernels_detail::attention_scratch_floats(bq, gq, a.D, a.Dv),
                                                                  kernels_detail::attention_block_scratch_floats(bq, gq, a.D, a.Dv)));

  // Unit u is (row, head group, block) with later blocks first: under a causal mask they read the most
  // keys, and starting them first evens out the threads' finishing times.
  auto unit_task = [&](std::int64_t u, std::int64_t split) {
    kernels_detail::attention_task tk;
    const std::int64_t head = u / blocks, qb = blocks - 1 - u % blocks;
    tk.r = head / head_groups;
    tk.kh0 = head % head_groups * heads_per_task;
    tk.kh1 = tk.kh0 + heads_per_task;
    tk.t0 = qb * bq;
    tk.t1 = std::min(a.T, tk.t0 + bq);
    tk.c0 = std::min(a.C, split * span);
    tk.c1 = std::min(a.C, tk.c0 + span);
    return tk;
  };

  auto run = [&](std::int64_t task, const kernels_detail::attention_task* ahead) {
    auto tk = unit_task(task / splits, task % splits);
    auto& s = thread_scratch();
    const auto len = static_cast<std::size_t>(tk.c1 - tk.c0);
    if (s.keys.size() < len) s.keys.resize(len);
    if (s.any.size() < len) s.any.resize(len);
    tk.scratch = aligned_floats(s.floats, scratch_floats);
    tk.keys = s.keys.data();
    tk.any = s.any.data();
    if (merge) tk.part = part.data() + task * part_stride;
    tk.ahead = ahead;
    kernels.attention(a, tk);
  };
  const std::int64_t total = units * splits;
  if (bq == 1 && total > threads) {
    // Decode over many rows (batched sequences): each thread claims its next task before it runs the
    // current one, and the current one fetches the next one's first keys while it computes. A row's
    // short context is otherwise read at memory latency at the start of every task.
    std::atomic<std::int64_t> counter{0};
    pool.parallel_for(threads, [&](std::int64_t, int) {
      std::int64_t cur = counter.fetch_add(1, std::memory_order_relaxed);
      while (cur < total) {
        const std::int64_t nxt = counter.fetch_add(1, std::memory_order_relaxed);
        kernels_detail::attention_task ahead;
        if (nxt < total) ahead = unit_task(nxt / splits, nxt % splits);
        run(cur, nxt < total ? &ahead : nullptr);
        cur = nxt;
      }
    });
  } else {
    pool.parallel_for(total, [&](std::int64_t task, int) { run(task, nullptr); });
  }
  if (!merge) return;

  // Merge the key ranges of each query: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
  for (std::int64_t u = 0; u < units; ++u) {
    const auto tk = unit_task(u, 0);
    const std::int64_t nq = (tk.t1 - tk.t0) * gq;
    for (std::int64_t i = 0; i < nq; ++i) {
      float* o = a.out + ((tk.r * a.T + tk.t0 + i / gq) * a.Hq + tk.kh0 * G + i % gq) * a.Dv;
      std::fill(o, o + a.Dv, 0.0f);
      float m = -INFINITY;
      for (std::int64_t sp = 0; sp < splits; ++sp) m = std::max(m, part[(u * splits + sp) * part_stride + i * (a.Dv + 2)]);
      if (m == -INFINITY) continue;  // no allowed key in any range: zeros
      float l = 0.0f;
      if (a.sinks) {  // head h's sink: a logit in the denominator that no value answers
        const float s = a.sinks[tk.kh0 * G + i % gq];
        m = std::max(m, s);
        l = std::exp(s - m);
      }
      for (std::int64_t sp = 0; sp < splits; ++sp) {
        const float* src = part.data() + (u * splits + sp) * part_stride + i * (a.Dv + 2);
        if (src[0] == -INFINITY) continue;
        const float w = std::exp(src[0] - m);
        l += w * src[1];
        for (std::int64_t d = 0; d < a.Dv; ++d) o[d] += w * src[2 + d];
      }
      const float inv = 1.0f / l;
      for (std::int64_t d = 0; d < a.Dv; ++d) o[d] *= inv;
    }
  }
}

}  // namespace troupe::exec::cpu
