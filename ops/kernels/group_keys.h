// GroupKeys: a batch's distinct keys, grouped by the table shard that holds them, so each
// shard is locked once and each distinct key probed once (the lookup, the apply, a tiered
// lookup's misses).
#ifndef TTF_OPS_KERNELS_GROUP_KEYS_H_
#define TTF_OPS_KERNELS_GROUP_KEYS_H_

#include <cstdint>
#include <vector>

#include "embedding_table.h"
#include "grouped_keys.h"

namespace tensorflow {
namespace ttf {

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

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_GROUP_KEYS_H_
