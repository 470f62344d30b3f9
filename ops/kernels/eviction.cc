#include "eviction.h"

#include <algorithm>

#include "table_shard.h"

namespace tensorflow {
namespace ttf {

Status Eviction::Expired(TableShard* sh, int64_t now, bool* due, std::vector<int64_t>* rows,
                         std::vector<int64_t>* candidates) const {
  *due = config_.evict_policy == EvictPolicy::kTtl && now >= sh->eviction.next_ttl_sweep;
  if (!*due) return OkStatus();
  const int64_t expired_before = now - config_.ttl_steps + 1;
  sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
    if (sh->rows.store.meta(id).last_seen < expired_before) rows->push_back(key);
  });
  TF_RETURN_IF_ERROR(sh->tier.disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) {
    if (m.last_seen < expired_before) rows->push_back(key);
  }));
  const KeyedStore& cands = sh->admission.candidates;
  cands.index.ForEach([&](int64_t key, uint32_t id) {
    if (cands.store.meta(id).last_seen < expired_before) candidates->push_back(key);
  });
  return OkStatus();
}

void Eviction::Swept(TableShard* sh, int64_t now) const {
  sh->eviction.next_ttl_sweep = now + std::max<int64_t>(1, config_.ttl_steps / 16);
}

Status Eviction::OverCapacity(const TableShard& sh, int64_t now, std::vector<int64_t>* doomed) const {
  if (!config_.capped()) return OkStatus();
  const int64_t shard_capacity = RowLimit(sh);
  const int64_t size = sh.rows.index.size() + sh.tier.disk.index.size();  // both tiers count
  if (size <= shard_capacity) return OkStatus();
  const int64_t target = shard_capacity - shard_capacity / 16;
  const bool by_count = lfu();
  std::vector<Victim> victims;
  victims.reserve(size);
  auto consider = [&](int64_t key, const RowMeta& m) {
    if (m.last_seen >= now) return;
    victims.push_back(Victim::Of(by_count, m, key));
  };
  sh.rows.index.ForEach([&](int64_t key, uint32_t id) { consider(key, sh.rows.store.meta(id)); });
  TF_RETURN_IF_ERROR(sh.tier.disk.ForEachLive([&](int64_t key, const RowMeta& m, const float*) { consider(key, m); }));
  const size_t drop = std::min<size_t>(victims.size(), static_cast<size_t>(size - target));
  if (drop == 0) return OkStatus();
  std::nth_element(victims.begin(), victims.begin() + (drop - 1), victims.end());
  doomed->reserve(drop);
  for (size_t i = 0; i < drop; ++i) doomed->push_back(victims[i].key);
  return OkStatus();
}

int64_t Eviction::RowLimit(const TableShard& sh) const {
  // Bytes: at the current width, which grows when an optimizer adds its slots (Adam: 3x dim).
  if (config_.capacity_bytes > 0)
    return config_.capacity_bytes / config_.num_shards / RowBytes(sh.rows.store.stride());
  return (config_.capacity + config_.num_shards - 1) / config_.num_shards;
}

}  // namespace ttf
}  // namespace tensorflow
