// Shared by the table kernels (lookup, apply): de-duplicating keys and grouping them by
// table shard, so each shard is probed once per unique key under one lock acquisition, and
// running per-shard work on TensorFlow's CPU pool.
#ifndef TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_
#define TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_

#include <vector>

#include "embedding_table.h"
#include "tensorflow/core/framework/op_kernel.h"
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
  // De-duplicate with a local open-addressing set sized for a load factor <= 1/2.
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  const uint64_t mask = cap - 1;
  // Per-thread scratch reused across calls: large fresh buffers would page-fault every step.
  thread_local std::vector<int32_t> slots;
  thread_local std::vector<int64_t> first_keys;
  thread_local std::vector<uint64_t> first_hashes;
  slots.assign(cap, -1);
  first_keys.clear();
  first_hashes.clear();
  out->inverse.resize(n);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t key = keys[p];
    const uint64_t h = HashKey(key);
    uint64_t pos = h & mask;
    while (slots[pos] >= 0 && first_keys[slots[pos]] != key) pos = (pos + 1) & mask;
    if (slots[pos] < 0) {
      slots[pos] = static_cast<int32_t>(first_keys.size());
      first_keys.push_back(key);
      first_hashes.push_back(h);
    }
    out->inverse[p] = slots[pos];
  }
  // Counting sort of the distinct keys by shard; remap inverse to the sorted order.
  const int num_shards = table.num_shards();
  const int64_t u = first_keys.size();
  thread_local std::vector<int32_t> shard_of;
  shard_of.resize(u);
  out->offsets.assign(num_shards + 1, 0);
  for (int64_t i = 0; i < u; ++i) {
    shard_of[i] = table.ShardOf(first_hashes[i]);
    ++out->offsets[shard_of[i] + 1];
  }
  for (int s = 0; s < num_shards; ++s) out->offsets[s + 1] += out->offsets[s];
  std::vector<int64_t> cursor(out->offsets.begin(), out->offsets.end() - 1);
  thread_local std::vector<int32_t> new_pos;
  new_pos.resize(u);
  out->keys.resize(u);
  out->hashes.resize(u);
  for (int64_t i = 0; i < u; ++i) {
    const int64_t dst = cursor[shard_of[i]]++;
    new_pos[i] = static_cast<int32_t>(dst);
    out->keys[dst] = first_keys[i];
    out->hashes[dst] = first_hashes[i];
  }
  for (int64_t p = 0; p < n; ++p) out->inverse[p] = new_pos[out->inverse[p]];
}

// Runs fn(shard) for every table shard on TensorFlow's CPU pool. `cost_per_key` is a rough
// cycle count, so tiny batches stay on the calling thread.
template <typename Fn>
void ForEachShard(OpKernelContext* ctx, const GroupedKeys& grouped, int num_shards, int64_t cost_per_key, Fn fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t per_shard = cost_per_key * (grouped.size() / num_shards + 1);
  Shard(workers->num_threads, workers->workers, num_shards, per_shard, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if (grouped.offsets[s + 1] > grouped.offsets[s]) fn(static_cast<int>(s));
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
