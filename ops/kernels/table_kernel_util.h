// Shared by the table kernels (lookup, apply): de-duplicating keys and grouping them by
// table shard, so each shard is probed once per unique key under one lock acquisition, and
// running per-shard work on TensorFlow's CPU pool.
#ifndef TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_
#define TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_

#include <algorithm>
#include <vector>

#include "embedding_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace ttf {

// The distinct keys of a batch, ordered by shard: keys[offsets[s] .. offsets[s+1]) all
// live in shard s. inverse[p] is the position in `keys` of input key p.
struct GroupedKeys {
  std::vector<int64_t> keys;
  std::vector<uint64_t> hashes;
  std::vector<int64_t> offsets;  // num_shards + 1
  std::vector<int32_t> inverse;
  int64_t size() const { return static_cast<int64_t>(keys.size()); }
};

inline void GroupKeys(const int64_t* keys, int64_t n, const EmbeddingTable& table, GroupedKeys* out) {
  // De-duplicate with a local open-addressing set sized for a load factor <= 1/2, holding
  // each slot's key beside its position (no second, dependent load per probe), its slots
  // prefetched 16 keys ahead (a set of 2n slots outgrows the L1 cache).
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  const uint64_t mask = cap - 1;
  // Per-thread scratch reused across calls: large fresh buffers would page-fault every step.
  // Bound to references once: each access to a thread_local of a shared library is a call.
  thread_local std::vector<uint64_t> tl_hashes;
  thread_local std::vector<int32_t> tl_slot_pos;   // -1: empty, else the key's index in first_keys
  thread_local std::vector<int64_t> tl_slot_keys;  // read only where slot_pos >= 0
  thread_local std::vector<int64_t> tl_first_keys;
  thread_local std::vector<uint64_t> tl_first_hashes;
  std::vector<uint64_t>& hashes = tl_hashes;
  std::vector<int32_t>& slot_pos = tl_slot_pos;
  std::vector<int64_t>& slot_keys = tl_slot_keys;
  std::vector<int64_t>& first_keys = tl_first_keys;
  std::vector<uint64_t>& first_hashes = tl_first_hashes;
  hashes.resize(n);
  for (int64_t p = 0; p < n; ++p) hashes[p] = HashKey(keys[p]);
  slot_pos.assign(cap, -1);
  if (static_cast<int64_t>(slot_keys.size()) < cap) slot_keys.resize(cap);
  if (static_cast<int64_t>(first_keys.size()) < n) first_keys.resize(n), first_hashes.resize(n);
  out->inverse.resize(n);
  int32_t* inverse = out->inverse.data();
  int32_t u = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (p + 16 < n) {
      const uint64_t ahead = hashes[p + 16] & mask;
      __builtin_prefetch(&slot_pos[ahead]);
      __builtin_prefetch(&slot_keys[ahead]);
    }
    const int64_t key = keys[p];
    uint64_t pos = hashes[p] & mask;
    while (slot_pos[pos] >= 0 && slot_keys[pos] != key) pos = (pos + 1) & mask;
    if (slot_pos[pos] < 0) {
      slot_pos[pos] = u;
      slot_keys[pos] = key;
      first_keys[u] = key;
      first_hashes[u] = hashes[p];
      ++u;
    }
    inverse[p] = slot_pos[pos];
  }
  // Counting sort of the distinct keys by shard; remap inverse to the sorted order.
  const int num_shards = table.num_shards();
  thread_local std::vector<int32_t> tl_shard_of, tl_new_pos;
  std::vector<int32_t>& shard_of = tl_shard_of;
  std::vector<int32_t>& new_pos = tl_new_pos;
  shard_of.resize(u);
  out->offsets.assign(num_shards + 1, 0);
  for (int64_t i = 0; i < u; ++i) {
    shard_of[i] = table.ShardOf(first_hashes[i]);
    ++out->offsets[shard_of[i] + 1];
  }
  for (int s = 0; s < num_shards; ++s) out->offsets[s + 1] += out->offsets[s];
  std::vector<int64_t> cursor(out->offsets.begin(), out->offsets.end() - 1);
  new_pos.resize(u);
  out->keys.resize(u);
  out->hashes.resize(u);
  for (int64_t i = 0; i < u; ++i) {
    const int64_t dst = cursor[shard_of[i]]++;
    new_pos[i] = static_cast<int32_t>(dst);
    out->keys[dst] = first_keys[i];
    out->hashes[dst] = first_hashes[i];
  }
  for (int64_t p = 0; p < n; ++p) inverse[p] = new_pos[inverse[p]];
}

// sums[u] = the sum of the rows p of `rows` with index[p] == u, added in order of p (so the
// result is deterministic), for every u < num_sums (index values must be in range; a sum no
// index names is zeros). A sum starts as 0.0f + its first row (the bits of a zero-filled sum,
// -0.0 included), a flag a sum marking it started: zero-filling every sum first wrote the
// whole buffer once more.
inline void SumRowsByIndex(const float* rows, const int32_t* index, int64_t n, int64_t num_sums, int64_t dim,
                           float* sums) {
  std::vector<char> started(num_sums, 0);
  for (int64_t p = 0; p < n; ++p) {
    float* __restrict dst = sums + static_cast<int64_t>(index[p]) * dim;
    const float* __restrict src = rows + p * dim;
    if (started[index[p]]) {
      for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    } else {
      started[index[p]] = 1;
      for (int64_t j = 0; j < dim; ++j) dst[j] = 0.0f + src[j];
    }
  }
  for (int64_t u = 0; u < num_sums; ++u) {
    if (!started[u]) std::fill(sums + u * dim, sums + (u + 1) * dim, 0.0f);
  }
}

// A per-thread buffer for the rows of a lookup's distinct keys, reused across calls: a fresh
// vector per call was zero-filled (and its pages faulted in) at every lookup. The buffer of
// a call of more than kMaxKeptScratchFloats floats is given back at the next call.
constexpr size_t kMaxKeptScratchFloats = size_t{1} << 22;  // 16 MiB
inline std::vector<float>& ScratchRows() {
  thread_local std::vector<float> rows;
  if (rows.capacity() > kMaxKeptScratchFloats) std::vector<float>().swap(rows);
  return rows;
}

// Runs fn(begin, end) over [0, total) on TensorFlow's CPU pool in at most one block per pool
// thread, each of at least min_per_block units; a single block runs on the calling thread.
// Shard's cost model cut a lookup of 26k ids into several blocks, and each hand-off wakes a
// pool thread that then spins for more work: 7-19% of a lookup's CPU time (a training step's:
// 6-10%), and no wall time gained on a busy machine (docs/lookup_speed.md).
template <typename Fn>
void RunInBlocks(OpKernelContext* ctx, int64_t total, int64_t min_per_block, const Fn& fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(workers->num_threads, total / min_per_block));
  if (blocks == 1) {
    if (total > 0) fn(0, total);
    return;
  }
  BlockingCounter done(static_cast<int>(blocks - 1));
  for (int64_t b = 1; b < blocks; ++b) {
    workers->workers->Schedule([&fn, &done, b, blocks, total] {
      fn(total * b / blocks, total * (b + 1) / blocks);
      done.DecrementCount();
    });
  }
  fn(0, total / blocks);
  done.Wait();
}

// Keys per block of ForEachShard: a probe and a row copy or update each, ~0.5 ms a block.
// A tiered table's keys cost more (about half of a step's distinct keys read, promote and
// later demote a disk record: ~4 us each at 100M keys), so its blocks are smaller: a step's
// ~13k distinct keys ran as one block on one thread while the all-DRAM table's dense layers
// used both cores.
constexpr int64_t kMinKeysPerBlock = 8192;
constexpr int64_t kMinKeysPerBlockTiered = 1024;

// Runs fn(shard) for every shard of `table` holding keys of `grouped`, in blocks of whole
// shards of about equal key counts (RunInBlocks, kMinKeysPerBlock keys at least, or
// kMinKeysPerBlockTiered): a shard runs in the block where its first key falls.
template <typename Fn>
void ForEachShard(OpKernelContext* ctx, const GroupedKeys& grouped, const EmbeddingTable& table, Fn fn) {
  const int num_shards = table.num_shards();
  const int64_t min_per_block = table.config().tiered() ? kMinKeysPerBlockTiered : kMinKeysPerBlock;
  RunInBlocks(ctx, grouped.size(), min_per_block, [&](int64_t begin, int64_t end) {
    for (int s = 0; s < num_shards; ++s) {
      const int64_t first = grouped.offsets[s];
      if (first >= begin && first < end && grouped.offsets[s + 1] > first) fn(s);
    }
  });
}

// Resolves the table handle in input 0; the caller owns one reference (core::ScopedUnref).
inline Status GetTable(OpKernelContext* ctx, EmbeddingTable** table) {
  return LookupResource(ctx, HandleFromInput(ctx, 0), table);
}

// Base of the kernels whose input 0 is a table: resolves the handle (a clear error when
// it names no table) and holds a reference for the duration of ComputeWithTable.
class TableOpKernel : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) final {
    EmbeddingTable* table = nullptr;
    OP_REQUIRES_OK(ctx, GetTable(ctx, &table));
    core::ScopedUnref unref(table);
    ComputeWithTable(ctx, table);
  }

 protected:
  virtual void ComputeWithTable(OpKernelContext* ctx, EmbeddingTable* table) = 0;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_
