#include "page_memory.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace tensorflow {
namespace ttf {

void ReleaseFreedMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

namespace {
constexpr size_t kPageBytes = 4096;
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kSmallBlockBytes = size_t{64} << 10;  // below: operator new (too small to matter)
constexpr size_t kSlabBytes = size_t{16} << 20;        // 8 huge pages: a slab's unused tail is < one block
constexpr size_t kSmallAlignment = 64;                 // a cache line

size_t RoundUp(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

// `bytes` (a multiple of kHugePageBytes) of zeroed memory at a 2 MiB boundary, marked for
// transparent huge pages. MAP_NORESERVE: untouched slab tails take no commit charge.
char* MapHugeAligned(size_t bytes) {
  const size_t padded = bytes + kHugePageBytes;
  void* mapped = ::mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = RoundUp(start, kHugePageBytes);
  if (aligned > start) ::munmap(mapped, aligned - start);
  const uintptr_t end = aligned + bytes;
  if (start + padded > end) ::munmap(reinterpret_cast<void*>(end), start + padded - end);
  // Best effort: a kernel without THP (or with it "never") keeps 4 KiB pages, and all still works.
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(aligned);
}

// Slabs carved front to back (a bump pointer: blocks live long, a chunk of rows or an index,
// and are freed in bulk by compaction, re-layout and restore). A freed block's range is not
// reused: its pages are returned, and the slab goes once its last block does. Blocks above
// half a slab get a mapping of their own. One arena per process, as malloc is: a row chunk
// is allocated outside any shard lock (ReserveRoom) and outlives nothing but its table.
class PageArena {
 public:
  static PageArena& Get() {
    static PageArena* arena = new PageArena;  // never destroyed: tables may free blocks at exit
    return *arena;
  }
  void* Allocate(size_t bytes) {
    bytes = RoundUp(bytes, kPageBytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > kSlabBytes / 2) {
      const size_t size = RoundUp(bytes, kHugePageBytes);
      char* base = MapHugeAligned(size);
      slabs_[base] = Slab{size, size, bytes};
      return base;
    }
    if (current_ == nullptr || slabs_[current_].used + bytes > kSlabBytes) {
      if (current_ != nullptr && slabs_[current_].live == 0) Unmap(slabs_.find(current_));
      current_ = MapHugeAligned(kSlabBytes);
      slabs_[current_] = Slab{kSlabBytes, 0, 0};
    }
    Slab& slab = slabs_[current_];
    char* block = current_ + slab.used;
    slab.used += bytes;
    slab.live += bytes;
    return block;
  }
  void Free(void* block, size_t bytes) {
    bytes = RoundUp(bytes, kPageBytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slabs_.upper_bound(static_cast<char*>(block));
    --it;  // the slab starting at or before the block
    it->second.live -= bytes;
    if (it->second.live == 0) {
      Unmap(it);
    } else {
      ::madvise(block, bytes, MADV_DONTNEED);  // RSS falls now; the slab stays for its other blocks
    }
  }

 private:
  struct Slab {
    size_t size, used, live;  // bytes: mapped, carved, carved and not freed
  };
  void Unmap(std::map<char*, Slab>::iterator it) {
    ::munmap(it->first, it->second.size);
    if (it->first == current_) current_ = nullptr;
    slabs_.erase(it);
  }
  std::mutex mu_;
  std::map<char*, Slab> slabs_;  // by base address
  char* current_ = nullptr;      // the slab being carved
};
}  // namespace

void* AllocatePages(size_t bytes) {
  if (bytes < kSmallBlockBytes) return ::operator new(bytes, std::align_val_t(kSmallAlignment));
  return PageArena::Get().Allocate(bytes);
}

void FreePages(void* block, size_t bytes) {
  if (bytes < kSmallBlockBytes) return ::operator delete(block, std::align_val_t(kSmallAlignment));
  PageArena::Get().Free(block, bytes);
}

}  // namespace ttf
}  // namespace tensorflow
