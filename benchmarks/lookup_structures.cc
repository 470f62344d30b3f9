// Where ttf's inference lookup loses to the bare hash loop of its own layout at 10M keys (issue 37
// item 5), with no TensorFlow: ttf's own KeyIndex and RowStore (ops/kernels/row_store.h), filled as
// benchmarks/lookup_floor.py fills its table (batches of 2^18 keys in rank order, room reserved per
// shard first, the index grown by rehash), against lookup_layout_model.cc's bare loop (one index at
// its final capacity, rows in rank order in one huge-page array), on the same Zipf(1.1) keys.
// Paths, each timed right after a bare run (ratios in pairs, medians of 9):
//   ttf                         FindEach's span loop before shard views: ProbeBlock chasing each
//                               shard's store for its index and rows
//   ttf with shard views        the same loop as table_lookup.cc has it: a local array of views
//   (one shard only:)
//   no shard arrays             ttf's index and rows, the loop without shard indirection
//   ttf index + bare rows       ttf's KeyIndex::Find, then the bare row array (row id = rank)
//   bare index + ttf rows       the bare probe, then RowStore::row
//   dense chunk bases           ttf's index and rows, rows addressed through an 8-byte-a-chunk array
//   bare rows by chunk bases    ttf's index, the bare rows addressed through such an array
// Also prints the huge-page coverage of the mappings holding each structure.
//
//   g++ -O3 -std=c++17 -Iops/kernels benchmarks/lookup_structures.cc ops/kernels/row_store.cc
//       ops/kernels/page_memory.cc -o /tmp/lookup_structures
//   /tmp/lookup_structures 10000000 1      # keys shards; ~5.5 GiB at 10M keys
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>
#include "row_store.h"
#include "zipf_sampler.h"
using namespace tensorflow::ttf;
namespace {
constexpr int64_t kDim = 16, kStride = 48, kBatch = 26624, kBatches = 64, kBlock = 256, kAhead = 32;
constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;
template <typename F>
double Median(int reps, F&& f) {
  std::vector<double> ns;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < kBatches; ++b) f(b);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (kBatches * kBatch));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}
#pragma pack(push, 4)
struct Slot { int64_t key; uint32_t id; };
#pragma pack(pop)
struct Sharded {
  std::vector<std::unique_ptr<KeyedStore>> stores;
  explicit Sharded(int n) { for (int i = 0; i < n; ++i) stores.emplace_back(new KeyedStore(kStride)); }
  int ShardOf(uint64_t h) const { return static_cast<int>(static_cast<uint32_t>(h >> 40) % static_cast<uint32_t>(stores.size())); }
};
}  // namespace

int main(int argc, char** argv) {
  const int64_t keys = std::atoll(argv[1]);
  const int shards = argc > 2 ? std::atoi(argv[2]) : 16;
  const int64_t fill_batch = argc > 3 ? std::atoll(argv[3]) : (1 << 18);
  const int reps = 9;
  // ttf's structures, filled as the benchmark fills its table: batches of fill_batch keys in rank
  // order, each shard's room reserved for its share of the batch first (ReserveRoom), then inserted.
  Sharded t(shards);
  for (int64_t begin = 0; begin < keys; begin += fill_batch) {
    const int64_t end = std::min(keys, begin + fill_batch);
    std::vector<int64_t> share(shards, 0);
    for (int64_t r = begin; r < end; ++r) ++share[t.ShardOf(HashKey(static_cast<int64_t>(r * kMix)))];
    for (int s = 0; s < shards; ++s) {
      KeyedStore& ks = *t.stores[s];
      if (!ks.index.HasRoom(share[s])) {
        KeyIndex bigger(KeyIndex::CapacityFor(ks.index.size() + share[s]));
        ks.index.MoveAllInto(&bigger);
        std::swap(ks.index, bigger);
      }
      for (int64_t c = ks.store.ChunksNeeded(share[s]); c > 0; --c) ks.store.AddChunk(RowStore::NewChunk(kStride));
    }
    for (int64_t r = begin; r < end; ++r) {
      const int64_t key = static_cast<int64_t>(r * kMix);
      const uint64_t h = HashKey(key);
      KeyedStore& ks = *t.stores[t.ShardOf(h)];
      const uint32_t id = ks.store.Take();
      ks.index.Insert(key, h, id);
      float* row = ks.store.row(id);
      for (int64_t j = 0; j < kStride; ++j) row[j] = static_cast<float>(r + j);
    }
  }
  // The bare loop's: one index at its final capacity, rows in rank order in one huge-page array.
  uint64_t capacity = 1;
  while (capacity * 3 < static_cast<uint64_t>(keys) * 4) capacity <<= 1;
  const uint64_t mask = capacity - 1;
  auto huge = [](size_t bytes) { void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); madvise(p, bytes, MADV_HUGEPAGE); return p; };
  Slot* slots = static_cast<Slot*>(huge(capacity * sizeof(Slot)));
  float* rows = static_cast<float*>(huge(keys * kStride * sizeof(float)));
  for (uint64_t p = 0; p < capacity; ++p) slots[p].id = ~0u;
  for (int64_t r = 0; r < keys; ++r) {
    const int64_t key = static_cast<int64_t>(r * kMix);
    uint64_t p = HashKey(key) & mask;
    while (slots[p].id != ~0u) p = (p + 1) & mask;
    slots[p] = Slot{key, static_cast<uint32_t>(r)};
    for (int64_t j = 0; j < kStride; ++j) rows[r * kStride + j] = static_cast<float>(r + j);
  }
  std::mt19937_64 rng(0);
  std::vector<int64_t> ids(kBatches * kBatch);
  for (int64_t& k : ids) k = static_cast<int64_t>(((Zipf(rng, 1.1) - 1) % keys) * kMix);
  std::vector<float> out(kBatch * kDim);
  std::vector<uint64_t> hashes(kBatch);
  std::vector<int32_t> shard(kBatch);
  const float* found[kBlock];
  auto bare = [&](int64_t b) {
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) { const char* s = reinterpret_cast<const char*>(slots + (hashes[i + kAhead] & mask)); __builtin_prefetch(s); __builtin_prefetch(s + 11); }
        uint64_t pos = hashes[i] & mask;
        while (slots[pos].key != k[i]) pos = (pos + 1) & mask;
        found[q] = rows + static_cast<int64_t>(slots[pos].id) * kStride;
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  std::vector<const KeyedStore*> stores;
  for (auto& s : t.stores) stores.push_back(s.get());
  auto ttf_loop = [&](int64_t b) {  // FindEach's span loop (one span: the batch), ProbeBlock + CopyBlock
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) { hashes[p] = HashKey(k[p]); shard[p] = t.ShardOf(hashes[p]); }
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) stores[shard[i + kAhead]]->index.Prefetch(hashes[i + kAhead]);
        const KeyedStore& ks = *stores[shard[i]];
        const uint32_t id = ks.index.Find(k[i], hashes[i]);
        found[q] = id == KeyIndex::kNone ? nullptr : ks.store.row(id);
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  struct ShardView {
    KeyIndex::View index;
    RowStore::View rows;
  };
  std::vector<ShardView> views;
  for (auto* ks : stores) views.push_back({ks->index.view(), ks->store.view()});
  auto ttf_views = [&](int64_t b) {  // FindEach's loop as table_lookup.cc has it: shard views
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) { hashes[p] = HashKey(k[p]); shard[p] = t.ShardOf(hashes[p]); }
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) views[shard[i + kAhead]].index.Prefetch(hashes[i + kAhead]);
        const ShardView& v = views[shard[i]];
        const uint32_t id = v.index.Find(k[i], hashes[i]);
        found[q] = id == KeyIndex::kNone ? nullptr : v.rows.row(id);
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  // With one shard, ttf's row id of rank r is r: the two hybrids swap one structure each.
  const KeyedStore& one = *stores[0];
  auto ttf_index_bare_rows = [&](int64_t b) {
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) one.index.Prefetch(hashes[i + kAhead]);
        const uint32_t id = one.index.Find(k[i], hashes[i]);
        found[q] = rows + static_cast<int64_t>(id) * kStride;
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  auto bare_index_ttf_rows = [&](int64_t b) {
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) { const char* s = reinterpret_cast<const char*>(slots + (hashes[i + kAhead] & mask)); __builtin_prefetch(s); __builtin_prefetch(s + 11); }
        uint64_t pos = hashes[i] & mask;
        while (slots[pos].key != k[i]) pos = (pos + 1) & mask;
        found[q] = one.store.row(slots[pos].id);
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  auto ttf_direct = [&](int64_t b) {  // ttf's index and rows, no shard arrays
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) one.index.Prefetch(hashes[i + kAhead]);
        const uint32_t id = one.index.Find(k[i], hashes[i]);
        found[q] = id == KeyIndex::kNone ? nullptr : one.store.row(id);
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  {  // huge-page coverage of each big mapping, and which one holds the bare arrays / ttf's first rows
    FILE* f = std::fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long lo = 0, hi = 0, rss = 0, hp = 0;
    auto flush = [&]() {
      const char* what = nullptr;
      auto in = [&](const void* p) { return reinterpret_cast<unsigned long>(p) >= lo && reinterpret_cast<unsigned long>(p) < hi; };
      if (in(slots)) what = " <- bare index";
      if (in(rows)) what = in(slots) ? " <- bare index and rows" : " <- bare rows";
      if (in(one.store.row(0))) what = " <- ttf rows 0";
      if (in(one.store.row(static_cast<uint32_t>(keys / 2)))) what = " <- ttf rows mid";
      if (what != nullptr)
        std::printf("mapping %8.1f MiB, rss %8.1f, in huge pages %8.1f%s\n", (hi - lo) / 1048576.0, rss / 1024.0,
                    hp / 1024.0, what);
    };
    while (std::fgets(line, sizeof line, f)) {
      unsigned long a, b;
      if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) { flush(); lo = a; hi = b; rss = hp = 0; continue; }
      std::sscanf(line, "Rss: %lu kB", &rss);
      std::sscanf(line, "AnonHugePages: %lu kB", &hp);
    }
    flush();
    std::fclose(f);
  }
  std::vector<float*> bases;  // dense chunk bases of ttf's rows
  for (int64_t c = 0; c * RowStore::kChunkRows < keys; ++c)
    bases.push_back(const_cast<float*>(one.store.row(static_cast<uint32_t>(c * RowStore::kChunkRows))));
  auto ttf_dense_bases = [&](int64_t b) {
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) one.index.Prefetch(hashes[i + kAhead]);
        const uint32_t id = one.index.Find(k[i], hashes[i]);
        found[q] = bases[id / RowStore::kChunkRows] + (id % RowStore::kChunkRows) * kStride;
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  std::vector<float*> bare_bases;  // the bare rows, addressed as ttf's are: one dependent load a row
  for (int64_t c = 0; c * RowStore::kChunkRows < keys; ++c) bare_bases.push_back(rows + c * RowStore::kChunkRows * kStride);
  auto ttf_index_bare_rows_by_bases = [&](int64_t b) {
    const int64_t* k = ids.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = HashKey(k[p]);
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) one.index.Prefetch(hashes[i + kAhead]);
        const uint32_t id = one.index.Find(k[i], hashes[i]);
        found[q] = bare_bases[id / RowStore::kChunkRows] + (id % RowStore::kChunkRows) * kStride;
        __builtin_prefetch(found[q]);
      }
      for (int64_t q = 0; q < m; ++q) CopyRow(&out[(begin + q) * kDim], found[q], kDim);
    }
  };
  std::vector<double> r_ttf, r_views, r_direct, r_ib, r_bi, r_dense, r_ibb, base;
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  for (int round = 0; round < 9; ++round) {  // each variant right after a bare run: ratios in pairs
    double a = Median(reps, bare); base.push_back(a); r_ttf.push_back(Median(reps, ttf_loop) / a);
    a = Median(reps, bare); r_views.push_back(Median(reps, ttf_views) / a);
    if (shards != 1) continue;
    a = Median(reps, bare); r_direct.push_back(Median(reps, ttf_direct) / a);
    a = Median(reps, bare); r_ib.push_back(Median(reps, ttf_index_bare_rows) / a);
    a = Median(reps, bare); r_bi.push_back(Median(reps, bare_index_ttf_rows) / a);
    a = Median(reps, bare); r_dense.push_back(Median(reps, ttf_dense_bases) / a);
    a = Median(reps, bare); r_ibb.push_back(Median(reps, ttf_index_bare_rows_by_bases) / a);
  }
  std::printf("keys %lld shards %d: bare %.1f ns/id (median); ratios to the bare run before each, medians of 9: ttf "
              "%.2fx; ttf with shard views %.2fx", (long long)keys, shards, med(base), med(r_ttf), med(r_views));
  if (shards == 1)
    std::printf("; ttf structures no shard arrays %.2fx; ttf index + bare rows %.2fx; bare index + ttf rows %.2fx",
                med(r_direct), med(r_ib), med(r_bi));
  if (shards == 1)
    std::printf("; ttf index + ttf rows by dense chunk bases %.2fx; ttf index + bare rows by chunk bases %.2fx",
                med(r_dense), med(r_ibb));
  std::printf("\n");
  return 0;
}
