// The table's snapshots (Export, Save, Import) and the reads of its change log: one
// serialisation path, VisitShard with ExportBuffers::PutRow and PutCandidate
// (table_snapshot.h), for Export and the streamed Save alike.
#include "table_snapshot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "embedding_table.h"

namespace tensorflow {
namespace ttf {

void EmbeddingTable::CollectDeleted(bool reset, std::vector<int64_t>* deleted, int reader) {
  if (deleted != nullptr) {
    size_t total = 0;
    for (const auto& sh : shards_) total += sh->log.size(reader);
    deleted->clear();
    deleted->reserve(total);
    for (const auto& sh : shards_) sh->log.AppendTo(reader, deleted);
    ChangeLog::SortDistinct(deleted);
  }
  if (reset) {
    // Appends hold a shard lock exclusively and we hold every shard lock (at least shared),
    // so no append runs while the record is cleared.
    for (auto& sh : shards_) sh->log.Clear(reader);
    change_log_.Start(reader);
  }
}

void EmbeddingTable::DeletedKeys(bool reset, std::vector<int64_t>* deleted, int reader) {
  std::lock_guard<std::mutex> log_lock(change_log_.mu());
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  CollectDeleted(reset, deleted, reader);
}

Status EmbeddingTable::Export(int64_t since_step, const ExportAllocator& allocate, std::vector<int64_t>* deleted,
                              bool reset_deleted, int reader, bool stored_values) {
  std::unique_lock<std::mutex> log_lock(change_log_.mu(), std::defer_lock);
  if (deleted != nullptr || reset_deleted) log_lock.lock();
  // Every shard locked shared for the whole export: one slot layout, exact counts, and the
  // rows written straight into the caller's buffers (no intermediate copy).
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  ExportLayout layout;
  layout.stride = stored_values ? layout_.value_words() : config_.dim * (1 + static_cast<int64_t>(slot_init_.size()));
  layout.optimizer = optimizer_;
  layout.slot_init = slot_init_;
  layout.step = step();
  const bool all = since_step == std::numeric_limits<int64_t>::min();
  for (const auto& sh : shards_) {
    if (all) {
      layout.rows += sh->rows.index.size() + sh->tier.disk.index.size();
      layout.candidates += sh->admission.candidates.index.size();
      continue;
    }
    TF_RETURN_IF_ERROR(VisitShard(
        *sh, since_step, [&](int64_t, const RowMeta&, const float*) { ++layout.rows; },
        [&](int64_t, const RowMeta&) { ++layout.candidates; }));
  }
  ExportBuffers out;
  TF_RETURN_IF_ERROR(allocate(layout, &out));
  const int64_t stride = layout.stride;
  int64_t r = 0, c = 0;
  std::vector<float> scratch;  // a compressed row in the full layout
  for (const auto& sh : shards_) {
    if (sh->rows.store.stride() != layout_.words())  // cannot happen: layouts change under every lock
      return errors::Internal("table shard has row stride ", sh->rows.store.stride(), ", expected ", layout_.words());
    // The disk tier's rows are read sequentially (same snapshot: writers wait).
    TF_RETURN_IF_ERROR(VisitShard(
        *sh, since_step,
        [&](int64_t key, const RowMeta& m, const float* row) {
          // The value part leads a stored row (row_layout.h): its words are copied as they are.
          out.PutRow(r++, stride, key, m, stored_values ? row : FullRow(layout_, row, &scratch));
        },
        [&](int64_t key, const RowMeta& m) { out.PutCandidate(c++, key, m); }));
  }
  if (deleted != nullptr || reset_deleted) CollectDeleted(reset_deleted, deleted, reader);
  return OkStatus();
}

Status EmbeddingTable::Save(int64_t since_step, const SaveAllocator& allocate, std::vector<int64_t>* deleted,
                            int reader) {
  std::shared_lock<std::shared_mutex> relayout_lock(relayout_mu_);
  ExportLayout layout;
  RowLayout rows;  // the slot layout stays this one throughout (relayout_mu_)
  {
    std::shared_lock<std::shared_mutex> lock(shards_[0]->mu);  // optimizer_ and slot_init_ are read under a shard lock
    layout.optimizer = optimizer_;
    layout.slot_init = slot_init_;
    rows = layout_;
  }
  // A row as the store holds it: fp32 rows are the full layout; compressed rows keep their
  // words, named by the layout tag, so a restore into the same layout is the same bits.
  layout.stride = rows.words();
  if (!rows.fp32()) layout.row_layout = rows.Tag();
  // Before the first shard: an update landing after some shard's copy (its step above every
  // completed one) stamps its rows later than this, so the next delta holds them.
  layout.step = step();
  SavePiece piece;
  TF_RETURN_IF_ERROR(allocate(layout, &piece));
  if (piece.max_rows < 1 || piece.max_candidates < 1 || !piece.write)
    return errors::Internal("a save's piece needs room for a row and a candidate, and a writer");
  const int64_t stride = layout.stride;
  int64_t written = 0;
  auto write = [&]() -> Status {
    TF_RETURN_IF_ERROR(piece.write(piece));
    piece.rows = piece.candidates = 0;
    ++written;
    return OkStatus();
  };
  deleted->clear();
  for (auto& shard : shards_) {
    TableShard& sh = *shard;
    if (piece.rows > 0 || piece.candidates > 0) {
      // Write the piece with no lock held when this shard (at most all its rows) may not fit
      // in what is left of it but fits in an empty one.
      int64_t rows, candidates;
      {
        std::shared_lock<std::shared_mutex> lock(sh.mu);
        rows = sh.rows.index.size() + sh.tier.disk.index.size();
        candidates = sh.admission.candidates.index.size();
      }
      const bool fits_left = piece.rows + rows <= piece.max_rows && piece.candidates + candidates <= piece.max_candidates;
      if (!fits_left && rows <= piece.max_rows && candidates <= piece.max_candidates) TF_RETURN_IF_ERROR(write());
    }
    // The shard's copy and its change log's move are one step: updates (which record
    // removals, under the shard lock exclusive) wait; the change log's lock (taken first, the
    // lock order) keeps other readers of the log out.
    std::lock_guard<std::mutex> log_lock(change_log_.mu());
    std::shared_lock<std::shared_mutex> lock(sh.mu);
    if (sh.rows.store.stride() != rows.words())  // cannot happen: layouts change under relayout_mu_
      return errors::Internal("table shard has row stride ", sh.rows.store.stride(), ", expected ", rows.words());
    Status status = OkStatus();
    // A full piece inside a shard is written under its lock: the shard holds more than a piece.
    TF_RETURN_IF_ERROR(VisitShard(
        sh, since_step,
        [&](int64_t key, const RowMeta& m, const float* row) {
          if (!status.ok()) return;
          if (piece.rows == piece.max_rows && !(status = write()).ok()) return;
          piece.PutRow(piece.rows++, stride, key, m, row);
        },
        [&](int64_t key, const RowMeta& m) {
          if (!status.ok()) return;
          if (piece.candidates == piece.max_candidates && !(status = write()).ok()) return;
          piece.PutCandidate(piece.candidates++, key, m);
        }));
    TF_RETURN_IF_ERROR(status);
    sh.log.TakeForSave(reader);
    deleted->insert(deleted->end(), sh.log.taken[reader].begin(), sh.log.taken[reader].end());
  }
  if (piece.rows > 0 || piece.candidates > 0 || written == 0) TF_RETURN_IF_ERROR(write());  // at least one piece
  ChangeLog::SortDistinct(deleted);
  return OkStatus();
}

void EmbeddingTable::CommitSave(int reader) {
  std::lock_guard<std::mutex> log_lock(change_log_.mu());
  for (auto& sh : shards_) std::vector<int64_t>().swap(sh->log.taken[reader]);  // changes under the log's lock only
}

namespace {
// The positions of the imported keys (those of the partition) ordered by table shard:
// order[offsets[s] .. offsets[s+1]) are the input positions of shard s's keys.
struct ShardOrder {
  std::vector<int64_t> order, offsets;
};
ShardOrder OrderByShard(const EmbeddingTable& table, const int64_t* keys, int64_t n, int64_t num_partitions,
                        int64_t partition) {
  ShardOrder so;
  const int num_shards = table.num_shards();
  so.offsets.assign(num_shards + 1, 0);
  auto wanted = [&](int64_t key) { return num_partitions == 1 || PartitionOf(key, num_partitions) == partition; };
  for (int64_t i = 0; i < n; ++i)
    if (wanted(keys[i])) ++so.offsets[table.ShardOf(HashKey(keys[i])) + 1];
  for (int s = 0; s < num_shards; ++s) so.offsets[s + 1] += so.offsets[s];
  so.order.resize(so.offsets[num_shards]);
  std::vector<int64_t> cursor(so.offsets.begin(), so.offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (wanted(keys[i])) so.order[cursor[table.ShardOf(HashKey(keys[i]))]++] = i;
  return so;
}

// An index of shard s's imported keys (id = position within the shard's slice of `so`),
// failing on a key given twice.
Status IndexShard(const int64_t* keys, const ShardOrder& so, int s, const char* name, KeyIndex* index) {
  const int64_t begin = so.offsets[s], n = so.offsets[s + 1] - begin;
  *index = KeyIndex(KeyIndex::CapacityFor(n));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t key = keys[so.order[begin + j]];
    const uint64_t h = HashKey(key);
    if (index->Find(key, h) != KeyIndex::kNone)
      return errors::InvalidArgument(name, " holds key ", key, " more than once (at position ", so.order[begin + j],
                                     ")");
    index->Insert(key, h, static_cast<uint32_t>(j));
  }
  return OkStatus();
}

// An imported row (in `from`'s words) into a stored row of `to`. The same layout's words are
// copied: the same bits (a row of the same format without slots: its value's, the slots
// initialised). Another is decoded to the full layout (the slots `from` lacks start
// at slot_init) and converted, compressed rows rounding to nearest, so an export of a table of
// the same format imports back to the same codes.
void PutImported(const RowLayout& from, const RowLayout& to, bool same, const std::vector<float>& slot_init,
                 const float* row, float* stored) {
  if (same) {
    std::memcpy(stored, row, to.words() * sizeof(float));
    return;
  }
  if (from.format() == to.format() && from.num_slots() == 0) {  // a shard saved before any update
    std::memcpy(stored, row, to.value_words() * sizeof(float));
    to.InitSlots(slot_init, stored);
    return;
  }
  thread_local std::vector<float> scratch, padded, work;
  const float* full = FullRow(from, row, &scratch);
  if (from.num_slots() < to.num_slots()) {
    padded.assign(full, full + from.full_floats());
    for (int64_t k = from.num_slots(); k < to.num_slots(); ++k) padded.insert(padded.end(), to.dim(), slot_init[k]);
    full = padded.data();
  }
  if (to.fp32()) {
    std::memcpy(stored, full, to.full_floats() * sizeof(float));
    return;
  }
  work.resize(to.work_floats());
  to.FromFull(full, work.data());
  to.Encode(work.data(), nullptr, stored);
}

}  // namespace

Status SourceRowLayout(const ImportSource& src, int64_t dim, RowLayout* layout) {
  const int64_t slots = static_cast<int64_t>(src.slot_init.size());
  if (src.row_layout.empty()) {
    *layout = RowLayout(RowFormat::kFp32, dim, src.optimizer, slots);
    return OkStatus();
  }
  std::string why;
  if (!LayoutOfTag(src.row_layout, layout, &why))
    return errors::InvalidArgument("the checkpoint's row layout tag '", src.row_layout, "' ", why,
                                   ": it was written by another ttf version; restore it with that version");
  if (layout->dim() != dim)
    return errors::InvalidArgument("the checkpoint holds rows of dim ", layout->dim(), " (row layout '",
                                   src.row_layout, "'), this table has dim ", dim,
                                   ": restore it into a table of dim ", layout->dim());
  if (layout->num_slots() > 0 && (layout->optimizer() != src.optimizer || layout->num_slots() != slots))
    return errors::InvalidArgument("the checkpoint's rows hold the slots of '", layout->optimizer(),
                                   "' (row layout '", src.row_layout, "'), its table those of '", src.optimizer,
                                   "': the checkpoint is damaged; restore an earlier one");
  return OkStatus();
}

Status EmbeddingTable::Import(const ImportSource& src) {
  const int64_t slots = static_cast<int64_t>(src.slot_init.size());
  const RowLayout layout(config_.rows, config_.dim, src.optimizer, slots);
  RowLayout from;  // how src.values hold a row
  TF_RETURN_IF_ERROR(SourceRowLayout(src, config_.dim, &from));
  const int64_t stride = from.words();
  const bool same = from.Tag() == layout.Tag();
  // Validate everything before the table changes: an import either happens whole or not at all.
  TF_RETURN_IF_ERROR(CheckCapacityBytesHoldARow(config_, layout.words(), slots));
  // A NaN/Inf value or slot would poison every step that reads its row: refuse it.
  int64_t non_finite = 0, first_bad = -1;
  std::vector<float> scratch;
  for (int64_t i = 0; i < src.num_rows; ++i) {
    const float* row = FullRow(from, src.values + i * stride, &scratch);
    if (!std::all_of(row, row + from.full_floats(), [](float x) { return std::isfinite(x); })) {
      if (first_bad < 0) first_bad = i;
      ++non_finite;
    }
  }
  if (non_finite > 0)
    return errors::InvalidArgument("values hold NaN or Inf in ", non_finite, " of ", src.num_rows,
                                   " row(s) (value or optimizer slot), the first at position ", first_bad, " (key ",
                                   src.keys[first_bad], "): imported rows must be finite");
  const ShardOrder rows = OrderByShard(*this, src.keys, src.num_rows, src.num_partitions, src.partition);
  const ShardOrder cands =
      OrderByShard(*this, src.candidate_keys, src.num_candidates, src.num_partitions, src.partition);
  std::vector<KeyIndex> row_index(shards_.size()), cand_index(shards_.size());
  for (int s = 0; s < num_shards(); ++s) {
    TF_RETURN_IF_ERROR(IndexShard(src.keys, rows, s, "keys", &row_index[s]));
    TF_RETURN_IF_ERROR(IndexShard(src.candidate_keys, cands, s, "candidate_keys", &cand_index[s]));
    const int64_t begin = cands.offsets[s];
    for (int64_t j = begin; j < cands.offsets[s + 1]; ++j) {
      const int64_t key = src.candidate_keys[cands.order[j]];
      if (row_index[s].Find(key, HashKey(key)) != KeyIndex::kNone)
        return errors::InvalidArgument("key ", key, " is in both keys and candidate_keys");
    }
  }

  std::unique_lock<std::shared_mutex> relayout_lock(relayout_mu_);  // waits for a save in progress
  std::unique_lock<std::mutex> log_lock(change_log_.mu());
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  for (auto& sh : shards_) locks.emplace_back(sh->mu);
  // A failed demotion (a full disk) leaves its rows in DRAM, over the budget: the import still
  // completes, whole, and then reports the disk's error.
  Status tier_status = OkStatus();
  if (src.merge) {
    const bool same_layout = optimizer_ == src.optimizer && slot_init_.size() == src.slot_init.size();
    if (!same_layout && !(slot_init_.empty() && (optimizer_.empty() || optimizer_ == src.optimizer))) {
      return errors::InvalidArgument("cannot merge rows with ", slots, " slot(s) of '", src.optimizer,
                                     "' into a table holding ", slot_init_.size(), " slot(s) of '", optimizer_, "'");
    }
    if (!same_layout) TF_RETURN_IF_ERROR(Relayout(src.optimizer, src.slot_init));
    for (int s = 0; s < num_shards(); ++s) {
      TableShard& sh = *shards_[s];
      GrowFor(&sh.rows, rows.offsets[s + 1] - rows.offsets[s]);
      GrowFor(&sh.admission.candidates, cands.offsets[s + 1] - cands.offsets[s]);
      for (int64_t j = rows.offsets[s]; j < rows.offsets[s + 1]; ++j) {
        const int64_t i = rows.order[j], key = src.keys[i];
        const uint64_t h = HashKey(key);
        sh.admission.candidates.Remove(key, h);
        uint32_t id = sh.rows.index.Find(key, h);
        if (id == KeyIndex::kNone) {
          // An upserted row comes to DRAM; Demote below sends the coldest back. A failed read
          // stops the import here, each key still in one tier.
          bool was_on_disk = false;
          TF_RETURN_IF_ERROR(sh.tier.disk.Remove(key, h, &was_on_disk));
          id = sh.rows.Add(key, h);
        }
        PutImported(from, layout, same, src.slot_init, src.values + i * stride, sh.rows.store.row(id));
        sh.rows.store.meta(id) = RowMeta{src.meta[2 * i], src.meta[2 * i + 1]};
      }
      for (int64_t j = cands.offsets[s]; j < cands.offsets[s + 1]; ++j) {
        const int64_t i = cands.order[j], key = src.candidate_keys[i];
        const uint64_t h = HashKey(key);
        if (sh.rows.index.Find(key, h) != KeyIndex::kNone) continue;  // already admitted
        KeyedStore& candidates = sh.admission.candidates;
        uint32_t id = candidates.index.Find(key, h);
        if (id == KeyIndex::kNone) id = candidates.Add(key, h);
        candidates.store.meta(id) = RowMeta{src.candidate_meta[2 * i], src.candidate_meta[2 * i + 1]};
      }
      admission_.FoldCandidatesIntoSketch(&sh.admission);
      if (tiering_.enabled()) tier_status.Update(tiering_.Demote(&sh, 0, {}, nullptr));
    }
    AdvanceStep(src.step);
    return tier_status;
  }
  // Replace, one shard at a time: the old shard is freed as soon as its new content is in,
  // so the import needs the input plus about one shard, never a second whole table.
  for (int s = 0; s < num_shards(); ++s) {
    TableShard& sh = *shards_[s];
    sh.rows = KeyedStore(layout.words());  // frees the old rows first
    sh.admission = admission_.NewShard();  // no candidates, none dropped, an empty sketch
    sh.tier.disk.Clear();
    TF_RETURN_IF_ERROR(sh.tier.disk.Rewrite(layout.words(), nullptr));  // empty: sets the stride
    sh.rows.index = std::move(row_index[s]);
    KeyedStore& candidates = sh.admission.candidates;
    candidates.index = std::move(cand_index[s]);
    const int64_t n = rows.offsets[s + 1] - rows.offsets[s], m = cands.offsets[s + 1] - cands.offsets[s];
    for (int64_t c = sh.rows.store.ChunksNeeded(n); c > 0; --c)
      sh.rows.store.AddChunk(RowStore::NewChunk(layout.words()));
    for (int64_t c = candidates.store.ChunksNeeded(m); c > 0; --c) candidates.store.AddChunk(RowStore::NewChunk(0));
    sh.rows.store.TakeFirst(n);
    candidates.store.TakeFirst(m);
    for (int64_t j = 0; j < n; ++j) {  // id j is the shard's j-th imported key (IndexShard)
      const int64_t i = rows.order[rows.offsets[s] + j];
      PutImported(from, layout, same, src.slot_init, src.values + i * stride,
                  sh.rows.store.row(static_cast<uint32_t>(j)));
      sh.rows.store.meta(static_cast<uint32_t>(j)) = RowMeta{src.meta[2 * i], src.meta[2 * i + 1]};
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t i = cands.order[cands.offsets[s] + j];
      candidates.store.meta(static_cast<uint32_t>(j)) = RowMeta{src.candidate_meta[2 * i], src.candidate_meta[2 * i + 1]};
    }
    admission_.FoldCandidatesIntoSketch(&sh.admission);
    sh.log.ClearRemoved();  // a restored table starts a new history
    if (tiering_.enabled()) tier_status.Update(tiering_.Demote(&sh, 0, {}, nullptr));
    ReleaseFreedMemory();
  }
  optimizer_ = src.optimizer;
  slot_init_ = src.slot_init;
  layout_ = layout;
  step_.store(src.step, std::memory_order_relaxed);
  return tier_status;
}


}  // namespace ttf
}  // namespace tensorflow
