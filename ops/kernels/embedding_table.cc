#include "embedding_table.h"

#include <algorithm>
#include <cstring>

#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ttf {

Status ParseInitKind(const std::string& name, InitKind* kind) {
  if (name == "normal") *kind = InitKind::kNormal;
  else if (name == "truncated_normal") *kind = InitKind::kTruncatedNormal;
  else if (name == "uniform") *kind = InitKind::kUniform;
  else if (name == "zeros") *kind = InitKind::kZeros;
  else if (name == "constant") *kind = InitKind::kConstant;
  else
    return errors::InvalidArgument("initializer must be one of normal, truncated_normal, uniform, zeros, ",
                                   "constant; got '", name, "'");
  return OkStatus();
}

namespace {
// Uniform in (0, 1) from counter `c` of the key's stream: 53 random bits, never 0 or 1.
inline double Uniform01(uint64_t stream, uint64_t c) {
  return (static_cast<double>(Mix64(stream + c) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
// Standard normal by Box-Muller from two uniforms of the stream.
inline double Normal(uint64_t stream, uint64_t c) {
  const double u1 = Uniform01(stream, c), u2 = Uniform01(stream, c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

void RowInitializer::Fill(int64_t key, float* row, int64_t dim) const {
  // Each element j draws from its own counter range (j << 8), so element values do not
  // depend on dim, and truncated-normal redraws (up to 127) never overlap the next element.
  const uint64_t stream = Mix64(static_cast<uint64_t>(seed) ^ Mix64(static_cast<uint64_t>(key)));
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t c = static_cast<uint64_t>(j) << 8;
    double v = 0.0;
    switch (kind) {
      case InitKind::kZeros: v = 0.0; break;
      case InitKind::kConstant: v = a; break;
      case InitKind::kUniform: v = a + (b - a) * Uniform01(stream, c); break;
      case InitKind::kNormal: v = a + b * Normal(stream, c); break;
      case InitKind::kTruncatedNormal: {
        double z = Normal(stream, c);
        for (uint64_t t = 1; std::fabs(z) > 2.0 && t < 127; ++t) z = Normal(stream, c + 2 * t);
        if (std::fabs(z) > 2.0) z = 0.0;  // probability ~1e-170: keep the bound exact
        v = a + b * z;
        break;
      }
    }
    row[j] = static_cast<float>(v);
  }
}

// ---------------------------------------------------------------- KeyIndex

KeyIndex::KeyIndex(int64_t capacity)
    : keys_(capacity), ids_(capacity, kNone), mask_(capacity - 1), capacity_(capacity) {}

int64_t KeyIndex::CapacityFor(int64_t keys) {
  int64_t cap = 16;
  while (keys * 4 > cap * 3) cap *= 2;
  return cap;
}

void KeyIndex::Insert(int64_t key, uint64_t hash, uint32_t id) {
  uint64_t pos = hash & mask_;
  while (ids_[pos] != kNone) pos = (pos + 1) & mask_;
  keys_[pos] = key;
  ids_[pos] = id;
  ++size_;
}

uint32_t KeyIndex::Erase(int64_t key, uint64_t hash) {
  if (capacity_ == 0) return kNone;
  uint64_t pos = hash & mask_;
  while (true) {
    if (ids_[pos] == kNone) return kNone;
    if (keys_[pos] == key) break;
    pos = (pos + 1) & mask_;
  }
  const uint32_t erased = ids_[pos];
  // Backward-shift deletion: pull later entries of the probe run into the hole when their
  // home slot does not lie cyclically in (hole, current].
  uint64_t hole = pos;
  for (uint64_t cur = (pos + 1) & mask_; ids_[cur] != kNone; cur = (cur + 1) & mask_) {
    const uint64_t home = HashKey(keys_[cur]) & mask_;
    const bool stays = (hole <= cur) ? (hole < home && home <= cur) : (hole < home || home <= cur);
    if (!stays) {
      keys_[hole] = keys_[cur];
      ids_[hole] = ids_[cur];
      hole = cur;
    }
  }
  ids_[hole] = kNone;
  --size_;
  return erased;
}

void KeyIndex::MoveAllInto(KeyIndex* bigger) const {
  ForEach([bigger](int64_t key, uint32_t id) { bigger->Insert(key, HashKey(key), id); });
}

// ---------------------------------------------------------------- RowStore

int64_t RowStore::ChunksNeeded(int64_t extra) const {
  const int64_t available =
      static_cast<int64_t>(free_ids_.size()) + static_cast<int64_t>(chunks_.size()) * kChunkRows - next_id_;
  if (extra <= available) return 0;
  return (extra - available + kChunkRows - 1) / kChunkRows;
}

RowStore::Chunk RowStore::NewChunk(int64_t stride) {
  Chunk chunk;
  if (stride > 0) chunk.values.reset(new float[kChunkRows * stride]);
  chunk.meta.reset(new RowMeta[kChunkRows]);
  return chunk;
}

uint32_t RowStore::Take() {
  if (!free_ids_.empty()) {
    const uint32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  return next_id_++;
}

int64_t RowStore::bytes() const {
  return static_cast<int64_t>(chunks_.size()) * kChunkRows * (stride_ * sizeof(float) + sizeof(RowMeta)) +
         static_cast<int64_t>(free_ids_.capacity()) * sizeof(uint32_t);
}

void RowStore::Widen(int64_t new_stride, const std::vector<float>& fill_per_slot, int64_t dim) {
  for (Chunk& chunk : chunks_) {
    std::unique_ptr<float[]> wider(new float[kChunkRows * new_stride]);
    for (int64_t r = 0; r < kChunkRows; ++r) {
      float* dst = wider.get() + r * new_stride;
      std::memcpy(dst, chunk.values.get() + r * stride_, stride_ * sizeof(float));
      for (int64_t f = stride_; f < new_stride; ++f) dst[f] = fill_per_slot[f / dim - 1];
    }
    chunk.values = std::move(wider);
  }
  stride_ = new_stride;
}

// ---------------------------------------------------------------- EmbeddingTable

EmbeddingTable::EmbeddingTable(const TableConfig& config) : config_(config) {
  shards_.reserve(config.num_shards);
  for (int i = 0; i < config.num_shards; ++i) shards_.emplace_back(new TableShard(config.dim));
}

std::string EmbeddingTable::DebugString() const {
  return strings::StrCat("ttf.EmbeddingTable(dim=", config_.dim, ", size=", Size(), ")");
}

void EmbeddingTable::AdvanceStep(int64_t step) {
  int64_t seen = step_.load(std::memory_order_relaxed);
  while (step > seen && !step_.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
  }
}

void EmbeddingTable::FillDefault(float* out) const { std::fill(out, out + config_.dim, config_.default_value); }

void EmbeddingTable::ReserveRoom(std::unique_lock<std::shared_mutex>& lock, KeyedStore* ks, int64_t extra) {
  const bool grow_index = !ks->index.HasRoom(extra);
  const int64_t new_capacity = KeyIndex::CapacityFor(ks->index.size() + extra);
  const int64_t chunks = ks->store.ChunksNeeded(extra);
  const int64_t stride = ks->store.stride();
  lock.unlock();
  KeyIndex bigger = grow_index ? KeyIndex(new_capacity) : KeyIndex();
  std::vector<RowStore::Chunk> fresh;
  for (int64_t i = 0; i < chunks; ++i) fresh.push_back(RowStore::NewChunk(stride));
  lock.lock();
  // Another thread may have grown the shard meanwhile; only ever move to a larger index.
  if (grow_index && bigger.capacity() > ks->index.capacity() && bigger.capacity() >= new_capacity) {
    ks->index.MoveAllInto(&bigger);
    std::swap(ks->index, bigger);
  }
  if (ks->store.stride() == stride) {  // a slot re-layout in between makes these chunks too narrow
    for (auto& chunk : fresh) ks->store.AddChunk(std::move(chunk));
  }
}

void EmbeddingTable::FindOrInsert(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, float* out) {
  TableShard& sh = *shards_[s];
  const int64_t dim = config_.dim;
  const int64_t min_count = config_.admission_min_count;
  const int64_t now = step();
  std::unique_lock<std::shared_mutex> lock(sh.mu);
  std::vector<uint32_t>& ids = ScratchIds(n);
  int64_t missing = 0;
  while (true) {
    // Probe every key once, remembering its row id. Repeated after a ReserveRoom, which
    // releases the lock (other threads may insert or evict meanwhile).
    missing = ProbeAll(sh.rows, keys, hashes, n, ids.data());
    if (missing == 0) break;
    if (min_count > 0 && !sh.candidates.HasRoom(missing)) {
      ReserveRoom(lock, &sh.candidates, missing);
      continue;
    }
    if (!sh.rows.HasRoom(missing)) {
      ReserveRoom(lock, &sh.rows, missing);
      continue;
    }
    break;
  }
  // Room is reserved for every missing key: from here on nothing allocates.
  for (int64_t i = 0; i < n; ++i) {
    if (i + 4 < n && ids[i + 4] != KeyIndex::kNone) __builtin_prefetch(sh.rows.store.row(ids[i + 4]));
    float* dst = out + i * dim;
    uint32_t id = ids[i];
    if (id == KeyIndex::kNone) id = sh.rows.index.Find(keys[i], hashes[i]);  // a repeat of an inserted key
    if (id != KeyIndex::kNone) {
      RowMeta& m = sh.rows.store.meta(id);
      ++m.count;
      m.last_seen = now;
      std::memcpy(dst, sh.rows.store.row(id), dim * sizeof(float));
      continue;
    }
    int64_t count = 1;
    if (min_count > 0) {
      uint32_t cid = sh.candidates.index.Find(keys[i], hashes[i]);
      if (cid == KeyIndex::kNone) {
        cid = sh.candidates.Add(keys[i], hashes[i]);
        sh.candidates.store.meta(cid) = RowMeta{0, now};
      }
      RowMeta& cm = sh.candidates.store.meta(cid);
      count = ++cm.count;
      cm.last_seen = now;
      if (count < min_count) {
        FillDefault(dst);
        continue;
      }
      sh.candidates.Remove(keys[i], hashes[i]);
    }
    id = sh.rows.Add(keys[i], hashes[i]);
    float* row = sh.rows.store.row(id);
    config_.init.Fill(keys[i], row, dim);
    for (size_t j = 0; j < slot_init_.size(); ++j) std::fill(row + (j + 1) * dim, row + (j + 2) * dim, slot_init_[j]);
    sh.rows.store.meta(id) = RowMeta{count, now};
    std::memcpy(dst, row, dim * sizeof(float));
  }
}

int64_t ProbeAll(const KeyedStore& ks, const int64_t* keys, const uint64_t* hashes, int64_t n, uint32_t* ids) {
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + 16 < n) ks.index.Prefetch(hashes[i + 16]);
    ids[i] = ks.index.Find(keys[i], hashes[i]);
    missing += ids[i] == KeyIndex::kNone;
  }
  return missing;
}

std::vector<uint32_t>& ScratchIds(int64_t n) {
  thread_local std::vector<uint32_t> ids;  // reused across calls: no allocation per lookup
  if (static_cast<int64_t>(ids.size()) < n) ids.resize(n);
  return ids;
}

void EmbeddingTable::Find(int s, const int64_t* keys, const uint64_t* hashes, int64_t n, float* out) const {
  const TableShard& sh = *shards_[s];
  const int64_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(sh.mu);
  std::vector<uint32_t>& ids = ScratchIds(n);
  ProbeAll(sh.rows, keys, hashes, n, ids.data());
  for (int64_t i = 0; i < n; ++i) {
    if (i + 4 < n && ids[i + 4] != KeyIndex::kNone) __builtin_prefetch(sh.rows.store.row(ids[i + 4]));
    const uint32_t id = ids[i];
    if (id == KeyIndex::kNone) {
      FillDefault(out + i * dim);
    } else {
      std::memcpy(out + i * dim, sh.rows.store.row(id), dim * sizeof(float));
    }
  }
}

int EmbeddingTable::num_slots() const {
  std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);
  return static_cast<int>(slot_init_.size());
}

Status EmbeddingTable::EnsureSlots(const std::string& optimizer, const std::vector<float>& slot_init) {
  {
    std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);
    if (optimizer_ == optimizer && slot_init_.size() == slot_init.size()) return OkStatus();
  }
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  if (optimizer_ == optimizer && slot_init_.size() == slot_init.size()) return OkStatus();
  if (!optimizer_.empty() && !slot_init_.empty()) {
    return errors::InvalidArgument("this table holds ", slot_init_.size(), " optimizer slot(s) of '", optimizer_,
                                   "' per row; it cannot be updated by '", optimizer,
                                   "'. Train a table with one optimizer (or start from a fresh table).");
  }
  const int64_t new_stride = config_.dim * (1 + static_cast<int64_t>(slot_init.size()));
  // A one-time re-layout when the first optimizer step meets rows made by lookups alone.
  for (auto& sh : shards_) sh->rows.store.Widen(new_stride, slot_init, config_.dim);
  optimizer_ = optimizer;
  slot_init_ = slot_init;
  return OkStatus();
}

int64_t EmbeddingTable::Size() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->rows.index.size();
  }
  return total;
}

int64_t EmbeddingTable::CandidateCount() const {
  int64_t total = 0;
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sh->candidates.index.size();
  }
  return total;
}

int64_t EmbeddingTable::MemoryBytes() const {
  int64_t total = sizeof(*this);
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    total += sizeof(TableShard) + sh->rows.index.bytes() + sh->rows.store.bytes() + sh->candidates.index.bytes() +
             sh->candidates.store.bytes();
  }
  return total;
}

int64_t EmbeddingTable::Evict(int64_t min_last_seen, int64_t min_count) {
  int64_t evicted = 0;
  std::vector<int64_t> doomed;
  for (auto& sh : shards_) {
    std::unique_lock<std::shared_mutex> lock(sh->mu);
    doomed.clear();
    sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
      const RowMeta& m = sh->rows.store.meta(id);
      if (m.last_seen < min_last_seen || m.count < min_count) doomed.push_back(key);
    });
    for (int64_t key : doomed) sh->rows.Remove(key, HashKey(key));
    evicted += doomed.size();
    doomed.clear();
    sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {
      if (sh->candidates.store.meta(id).last_seen < min_last_seen) doomed.push_back(key);
    });
    for (int64_t key : doomed) sh->candidates.Remove(key, HashKey(key));
  }
  return evicted;
}

void EmbeddingTable::Export(TableSnapshot* snap, std::string* optimizer, std::vector<float>* slot_init) const {
  for (const auto& sh : shards_) {
    std::shared_lock<std::shared_mutex> lock(sh->mu);
    const int64_t stride = sh->rows.store.stride();
    sh->rows.index.ForEach([&](int64_t key, uint32_t id) {
      snap->keys.push_back(key);
      const float* row = sh->rows.store.row(id);
      snap->values.insert(snap->values.end(), row, row + stride);
      snap->meta.push_back(sh->rows.store.meta(id));
    });
    sh->candidates.index.ForEach([&](int64_t key, uint32_t id) {
      snap->candidate_keys.push_back(key);
      snap->candidate_meta.push_back(sh->candidates.store.meta(id));
    });
  }
  std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);
  *optimizer = optimizer_;
  *slot_init = slot_init_;
}

Status EmbeddingTable::Import(const TableSnapshot& snap, const std::string& optimizer,
                              const std::vector<float>& slot_init, int64_t step) {
  const int64_t stride = config_.dim * (1 + static_cast<int64_t>(slot_init.size()));
  // Build the new shards unlocked, then swap them in under every lock.
  std::vector<std::unique_ptr<TableShard>> fresh;
  std::vector<int64_t> rows_per_shard(shards_.size(), 0), cands_per_shard(shards_.size(), 0);
  for (int64_t key : snap.keys) ++rows_per_shard[ShardOf(HashKey(key))];
  for (int64_t key : snap.candidate_keys) ++cands_per_shard[ShardOf(HashKey(key))];
  for (size_t s = 0; s < shards_.size(); ++s) {
    fresh.emplace_back(new TableShard(stride));
    TableShard& sh = *fresh.back();
    sh.rows.index = KeyIndex(KeyIndex::CapacityFor(rows_per_shard[s]));
    for (int64_t c = sh.rows.store.ChunksNeeded(rows_per_shard[s]); c > 0; --c)
      sh.rows.store.AddChunk(RowStore::NewChunk(stride));
    sh.candidates.index = KeyIndex(KeyIndex::CapacityFor(cands_per_shard[s]));
    for (int64_t c = sh.candidates.store.ChunksNeeded(cands_per_shard[s]); c > 0; --c)
      sh.candidates.store.AddChunk(RowStore::NewChunk(0));
  }
  for (size_t i = 0; i < snap.keys.size(); ++i) {
    const uint64_t h = HashKey(snap.keys[i]);
    TableShard& sh = *fresh[ShardOf(h)];
    if (sh.rows.index.Find(snap.keys[i], h) != KeyIndex::kNone)
      return errors::InvalidArgument("keys holds key ", snap.keys[i], " more than once (at position ", i, ")");
    const uint32_t id = sh.rows.Add(snap.keys[i], h);
    std::memcpy(sh.rows.store.row(id), snap.values.data() + i * stride, stride * sizeof(float));
    sh.rows.store.meta(id) = snap.meta[i];
  }
  for (size_t i = 0; i < snap.candidate_keys.size(); ++i) {
    const uint64_t h = HashKey(snap.candidate_keys[i]);
    TableShard& sh = *fresh[ShardOf(h)];
    if (sh.candidates.index.Find(snap.candidate_keys[i], h) != KeyIndex::kNone)
      return errors::InvalidArgument("candidate_keys holds key ", snap.candidate_keys[i], " more than once");
    sh.candidates.store.meta(sh.candidates.Add(snap.candidate_keys[i], h)) = snap.candidate_meta[i];
  }
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  for (size_t s = 0; s < shards_.size(); ++s) {
    std::swap(shards_[s]->rows, fresh[s]->rows);
    std::swap(shards_[s]->candidates, fresh[s]->candidates);
  }
  optimizer_ = optimizer;
  slot_init_ = slot_init;
  step_.store(step, std::memory_order_relaxed);
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow
