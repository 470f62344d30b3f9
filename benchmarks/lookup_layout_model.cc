// A model of an inference lookup's memory traffic, without ttf (issue 18 item 5): how close can
// a hash-table lookup come to a gather whose ids are row numbers? Three loops over the same
// Zipf(--zipf) ids as benchmarks/lookup_floor.py draws them (numpy's rejection sampler, the
// rank folded into [0, keys) with a modulo: ~20% of ids then fall anywhere in the table):
//   gather  the C++ floor: rows[rank] of a [keys, 3 * dim] array (value | m | v), value copied
//   index   ttf's layout: 12-byte (key, row id) linear-probing slots at a load of 3/8..3/4, rows
//           in insertion (rank) order in one array; FindEach's pipeline (blocks of 256 ids, each
//           slot prefetched 32 ids ahead, each found row prefetched at once, copied after its block)
//   inline  the key stored with its row: records [key | pad | value | m | v] at the key's hash
//           position (same load), the key and value in adjacent cache lines; the same pipeline
// Prints the median ns per id of each (--reps passes over 64 batches) and the bytes a key costs.
//
//   g++ -O3 -std=c++17 benchmarks/lookup_layout_model.cc -o /tmp/layout_model
//   /tmp/layout_model 10000000        # keys [reps] [zipf]; ~2.6 GiB at 10M keys
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "zipf_sampler.h"

namespace {

constexpr int64_t kDim = 16, kStride = 3 * kDim, kBatch = 26624, kBatches = 64;
constexpr int64_t kBlock = 256, kAhead = 32;
constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;  // key of rank r: r * kMix, as lookup_floor.py

uint64_t Hash(int64_t key) {  // SplitMix64's finalizer, as ttf's HashKey
  uint64_t z = static_cast<uint64_t>(key) + kMix;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <typename T>
T* HugeArray(int64_t n) {  // THP-backed, as ttf's rows and numpy's large arrays
  void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  madvise(p, n * sizeof(T), MADV_HUGEPAGE);
  return static_cast<T*>(p);
}

#pragma pack(push, 4)
struct Slot {
  int64_t key;
  uint32_t id;  // ~0u: empty
};
#pragma pack(pop)

struct Record {
  int64_t key;  // -1: empty
  int64_t pad[7];
  float row[kStride];
};

template <typename F>
double MedianNsPerId(int reps, F&& one_batch) {
  std::vector<double> ns;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < kBatches; ++b) one_batch(b);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                 (kBatches * kBatch));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s keys [reps=15] [zipf=1.1]\n", argv[0]);
    return 2;
  }
  const int64_t keys = std::atoll(argv[1]);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  const double zipf = argc > 3 ? std::atof(argv[3]) : 1.1;
  if (keys <= 0 || keys >= (int64_t{1} << 31) || reps <= 0 || zipf <= 1.0) {
    std::fprintf(stderr, "keys in (0, 2^31), reps > 0, zipf > 1\n");
    return 2;
  }
  uint64_t capacity = 1;
  while (capacity * 3 < static_cast<uint64_t>(keys) * 4) capacity <<= 1;  // load <= 3/4
  const uint64_t mask = capacity - 1;
  float* rows = HugeArray<float>(keys * kStride);
  Slot* slots = HugeArray<Slot>(capacity);
  Record* records = HugeArray<Record>(capacity);
  for (uint64_t p = 0; p < capacity; ++p) {
    slots[p].id = ~0u;
    records[p].key = -1;
  }
  for (int64_t r = 0; r < keys; ++r) {  // row r = rank r, inserted in rank order
    for (int64_t j = 0; j < kStride; ++j) rows[r * kStride + j] = static_cast<float>(r + j);
    const int64_t key = static_cast<int64_t>(r * kMix);
    uint64_t p = Hash(key) & mask;
    while (slots[p].id != ~0u) p = (p + 1) & mask;
    slots[p] = Slot{key, static_cast<uint32_t>(r)};
    p = Hash(key) & mask;
    while (records[p].key != -1) p = (p + 1) & mask;
    records[p].key = key;
    std::memcpy(records[p].row, rows + r * kStride, sizeof(records[p].row));
  }
  std::mt19937_64 rng(0);
  std::vector<int64_t> ranks(kBatches * kBatch);
  for (int64_t& r : ranks) r = (Zipf(rng, zipf) - 1) % keys;

  std::vector<float> out(kBatch * kDim);
  std::vector<uint64_t> hashes(kBatch);
  const float* found[kBlock];
  const double gather = MedianNsPerId(reps, [&](int64_t b) {
    const int64_t* r = ranks.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) {
      if (p + 8 < kBatch) __builtin_prefetch(rows + r[p + 8] * kStride);
      std::memcpy(&out[p * kDim], rows + r[p] * kStride, kDim * sizeof(float));
    }
  });
  // The two hash layouts share the pipeline; `probe` returns the id's row (values first).
  auto pipeline = [&](int64_t b, auto&& prefetch_slot, auto&& probe) {
    const int64_t* r = ranks.data() + b * kBatch;
    for (int64_t p = 0; p < kBatch; ++p) hashes[p] = Hash(static_cast<int64_t>(r[p] * kMix));
    for (int64_t begin = 0; begin < kBatch; begin += kBlock) {
      const int64_t m = std::min(kBlock, kBatch - begin);
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = begin + q;
        if (i + kAhead < kBatch) prefetch_slot(hashes[i + kAhead] & mask);
        found[q] = probe(static_cast<int64_t>(r[i] * kMix), hashes[i] & mask);
      }
      for (int64_t q = 0; q < m; ++q) std::memcpy(&out[(begin + q) * kDim], found[q], kDim * sizeof(float));
    }
  };
  const double index = MedianNsPerId(reps, [&](int64_t b) {
    pipeline(
        b,
        [&](uint64_t p) {
          const char* slot = reinterpret_cast<const char*>(slots + p);
          __builtin_prefetch(slot);
          __builtin_prefetch(slot + sizeof(Slot) - 1);
        },
        [&](int64_t key, uint64_t p) {
          while (slots[p].key != key) p = (p + 1) & mask;
          const float* row = rows + static_cast<int64_t>(slots[p].id) * kStride;
          __builtin_prefetch(row);
          return row;
        });
  });
  const double inline_rows = MedianNsPerId(reps, [&](int64_t b) {
    pipeline(
        b,
        [&](uint64_t p) {
          __builtin_prefetch(records + p);
          __builtin_prefetch(records[p].row);
        },
        [&](int64_t key, uint64_t p) {
          while (records[p].key != key) p = (p + 1) & mask;
          return static_cast<const float*>(records[p].row);
        });
  });
  const double index_bytes = (keys * kStride * 4.0 + capacity * sizeof(Slot)) / keys;
  const double inline_bytes = capacity * static_cast<double>(sizeof(Record)) / keys;
  std::printf("keys %lld, slots %llu: gather %.1f ns/id; index %.1f (%.2fx, %.0f bytes a key); "
              "inline %.1f (%.2fx, %.0f bytes a key)\n",
              static_cast<long long>(keys), static_cast<unsigned long long>(capacity), gather, index, index / gather,
              index_bytes, inline_rows, inline_rows / gather, inline_bytes);
  return 0;
}
