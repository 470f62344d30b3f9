#include "admission.h"

namespace tensorflow {
namespace ttf {

ShardAdmission Admission::NewShard() const {
  ShardAdmission a;
  if (sketch_bytes_per_shard_ > 0) a.sketch = AdmissionSketch(sketch_bytes_per_shard_);
  return a;
}

void Admission::FoldCandidatesIntoSketch(ShardAdmission* a) const {
  if (!a->sketch.enabled() || a->candidates.index.size() == 0) return;
  a->candidates.index.ForEach(
      [&](int64_t key, uint32_t id) { a->sketch.Add(HashKey(key), a->candidates.store.meta(id).count); });
  a->candidates = KeyedStore(0);
}

void Admission::DropOldest(ShardAdmission* a, const ChangeLog& log, ShardChangeLog* shard_log) const {
  struct Seen {
    int64_t last_seen, count, key;
    bool operator<(const Seen& o) const { return last_seen != o.last_seen ? last_seen < o.last_seen : count < o.count; }
  };
  std::vector<Seen> seen;
  seen.reserve(a->candidates.index.size());
  a->candidates.index.ForEach([&](int64_t key, uint32_t id) {
    const RowMeta& m = a->candidates.store.meta(id);
    seen.push_back(Seen{m.last_seen, m.count, key});
  });
  const size_t drop = std::max<size_t>(1, seen.size() / 8);
  std::nth_element(seen.begin(), seen.begin() + (drop - 1), seen.end());
  for (size_t i = 0; i < drop && i < seen.size(); ++i) {
    a->candidates.Remove(seen[i].key, HashKey(seen[i].key));
    log.Record(shard_log, seen[i].key);
  }
  a->candidates_dropped += static_cast<int64_t>(std::min(drop, seen.size()));
}

}  // namespace ttf
}  // namespace tensorflow
