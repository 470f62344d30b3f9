// Shared by the table kernels (lookup, apply): summing rows by index and running per-shard
// work on TensorFlow's CPU pool (the de-dup and grouping by shard, GroupKeys, is the table's:
// group_keys.h).
#ifndef TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_
#define TTF_OPS_KERNELS_TABLE_KERNEL_UTIL_H_

#include <algorithm>
#include <vector>

#include "embedding_table.h"
#include "group_keys.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace ttf {

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

// The "record" attr: which reader of the table's change log an op reads, resets or saves for.
inline Status GetRecordAttr(OpKernelConstruction* ctx, int* record) {
  int64_t reader = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("record", &reader));
  if (!ChangeLog::ValidReader(reader))
    return errors::InvalidArgument("record must be in [0, ", kNumChangeLogReaders,
                                   "): the change log's reader whose removed keys are read, got ", reader);
  *record = static_cast<int>(reader);
  return OkStatus();
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
