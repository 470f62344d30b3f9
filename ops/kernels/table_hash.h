// The table's one hash: a key's lock shard (EmbeddingTable::ShardOf), its index slots
// (KeyIndex, DiskIndex), its partition across processes (PartitionOf) and its initial row
// (RowInitializer) all derive from SplitMix64 of the key.
#ifndef TTF_OPS_KERNELS_TABLE_HASH_H_
#define TTF_OPS_KERNELS_TABLE_HASH_H_

#include <cstdint>

namespace tensorflow {
namespace ttf {

// SplitMix64 finaliser: a fast, well-mixed 64-bit hash (Steele et al., 2014).
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t HashKey(int64_t key) { return Mix64(static_cast<uint64_t>(key)); }

// The partition (parameter server, Horovod rank) owning a key: the low 32 bits of its
// SplitMix64 hash mod n, as ttf.embedding.shard_of computes it in stock TF ops. ShardOf (the
// lock shard inside one table) uses bits 40..63 of the same hash, so the two never correlate.
inline int64_t PartitionOf(int64_t key, int64_t n) {
  return static_cast<int64_t>(HashKey(key) & 0xffffffffULL) % n;
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TABLE_HASH_H_
