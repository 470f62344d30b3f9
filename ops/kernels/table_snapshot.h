// Snapshots of a table: what Export (one snapshot under every shard lock), Save (a streamed
// save, one shard at a time) and Import (restore or upsert) read and write. Export and Save
// share one serialisation path: VisitShard picks a shard's rows and candidates, PutRow and
// PutCandidate write them in the one layout both produce.
#ifndef TTF_OPS_KERNELS_TABLE_SNAPSHOT_H_
#define TTF_OPS_KERNELS_TABLE_SNAPSHOT_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "row_layout.h"
#include "table_shard.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tensorflow {
namespace ttf {

// Where a snapshot's rows go: keys [rows], values [rows, stride], meta [rows, 2] (count,
// last_seen), candidate_keys [candidates], candidate_meta [candidates, 2]. Export's are
// allocated by the caller once the counts are known (all shard locks are held meanwhile, so
// the counts stay exact).
struct ExportBuffers {
  int64_t* keys = nullptr;
  float* values = nullptr;
  int64_t* meta = nullptr;
  int64_t* candidate_keys = nullptr;
  int64_t* candidate_meta = nullptr;

  void PutRow(int64_t r, int64_t stride, int64_t key, const RowMeta& m, const float* row) const {
    keys[r] = key;
    std::memcpy(values + r * stride, row, stride * sizeof(float));
    meta[2 * r] = m.count;
    meta[2 * r + 1] = m.last_seen;
  }
  void PutCandidate(int64_t c, int64_t key, const RowMeta& m) const {
    candidate_keys[c] = key;
    candidate_meta[2 * c] = m.count;
    candidate_meta[2 * c + 1] = m.last_seen;
  }
};
struct ExportLayout {
  int64_t rows = 0, candidates = 0, stride = 0;  // rows and candidates: of the export (Export only)
  std::string optimizer;
  std::vector<float> slot_init;
  int64_t step = 0;
  // Save: "" when a row is `stride` floats of the full layout (fp32 rows), else the layout tag
  // (RowLayout::Tag) of the stored words a row is.
  std::string row_layout;
};
using ExportAllocator = std::function<Status(const ExportLayout&, ExportBuffers*)>;
// The buffers a streamed save (Save) fills from the front: room for max_rows rows and
// max_candidates candidates. `write` writes its first `rows` rows and `candidates` candidates
// out as the next piece; the save then refills it from the front.
struct SavePiece : ExportBuffers {
  int64_t max_rows = 0, max_candidates = 0;
  int64_t rows = 0, candidates = 0;  // filled
  std::function<Status(const SavePiece&)> write;
};
// Called once by Save, with the layout and no shard lock held: sets the piece's room,
// buffers and writer.
using SaveAllocator = std::function<Status(const ExportLayout&, SavePiece*)>;

// An Import's input, read in place from the op's input tensors (never copied).
struct ImportSource {
  const int64_t* keys = nullptr;
  int64_t num_rows = 0;
  const float* values = nullptr;  // num_rows x the words of SourceRowLayout
  const int64_t* meta = nullptr;  // num_rows x 2
  const int64_t* candidate_keys = nullptr;
  int64_t num_candidates = 0;
  const int64_t* candidate_meta = nullptr;  // num_candidates x 2
  std::string optimizer;
  std::vector<float> slot_init;
  int64_t step = 0;
  // How `values` hold a row: "" the full layout (dim * (1 + slot_init.size()) floats), else a
  // checkpoint's layout tag (RowLayout::Tag): its stored words, with optimizer's slots or none.
  std::string row_layout;
  // Only keys with PartitionOf(key, num_partitions) == partition are imported.
  int64_t num_partitions = 1, partition = 0;
  // false: replace the whole content; true: upsert these rows, keep the others.
  bool merge = false;
};

// The layout of src.values' rows for a table of `dim` (see ImportSource::row_layout), or an
// InvalidArgument naming why the tag cannot be read or does not fit, and the fix.
Status SourceRowLayout(const ImportSource& src, int64_t dim, RowLayout* layout);

// Calls row(key, meta, floats) for each of a shard's rows last seen after since_step (DRAM,
// then its disk tier's, read sequentially), then candidate(key, meta) for each such
// candidate; since_step INT64_MIN: every one. The shard lock is held at least shared.
// Returns the disk's read error.
template <typename RowFn, typename CandidateFn>
Status VisitShard(const TableShard& sh, int64_t since_step, RowFn&& row, CandidateFn&& candidate) {
  const bool all = since_step == std::numeric_limits<int64_t>::min();
  auto wanted = [&](const RowMeta& m) { return all || m.last_seen > since_step; };
  sh.rows.index.ForEach([&](int64_t key, uint32_t id) {
    const RowMeta& m = sh.rows.store.meta(id);
    if (wanted(m)) row(key, m, sh.rows.store.row(id));
  });
  TF_RETURN_IF_ERROR(sh.tier.disk.ForEachLive([&](int64_t key, const RowMeta& m, const float* floats) {
    if (wanted(m)) row(key, m, floats);
  }));
  const KeyedStore& cands = sh.admission.candidates;
  cands.index.ForEach([&](int64_t key, uint32_t id) {
    const RowMeta& m = cands.store.meta(id);
    if (wanted(m)) candidate(key, m);
  });
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_TABLE_SNAPSHOT_H_
