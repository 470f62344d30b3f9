// Memory for rows and index slots, in 2 MiB transparent huge pages where the kernel gives
// them (THP in "madvise" or "always" mode): a lookup's random rows and index slots then
// miss the TLB far less often (one entry covers 2 MiB, not 4 KiB), which was the largest cost
// left against a plain gather (docs/lookup_speed.md). Blocks of at least 64 KiB are carved
// from 2 MiB-aligned slabs marked MADV_HUGEPAGE, page-aligned (so a row of 16k floats fills
// whole cache lines); smaller ones come from operator new, 64-byte aligned. A freed block's
// pages go back to the system at once (MADV_DONTNEED; a slab with no live block is unmapped),
// so RSS falls after an eviction. Thread-safe; allocation is rare (a chunk of rows, an index).
#ifndef TTF_OPS_KERNELS_PAGE_MEMORY_H_
#define TTF_OPS_KERNELS_PAGE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tensorflow {
namespace ttf {

void* AllocatePages(size_t bytes);
void FreePages(void* block, size_t bytes);

// Hands memory freed by the allocator back to the system. glibc keeps freed pages in the
// arena of the thread that allocated them; without this, RSS would not fall after an
// eviction or a restore frees rows.
void ReleaseFreedMemory();

// `n` Ts (trivially copyable, left uninitialised) from AllocatePages; freed with the array.
template <typename T>
class PageArray {
  static_assert(std::is_trivially_copyable<T>::value, "PageArray holds plain data");

 public:
  PageArray() = default;
  explicit PageArray(int64_t n)
      : data_(n > 0 ? static_cast<T*>(AllocatePages(static_cast<size_t>(n) * sizeof(T))) : nullptr), n_(n) {}
  ~PageArray() { Reset(); }
  PageArray(PageArray&& o) noexcept : data_(o.data_), n_(o.n_) { o.data_ = nullptr, o.n_ = 0; }
  PageArray& operator=(PageArray&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_, n_ = o.n_;
      o.data_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  PageArray(const PageArray&) = delete;
  PageArray& operator=(const PageArray&) = delete;
  T* get() const { return data_; }
  T& operator[](int64_t i) const { return data_[i]; }
  int64_t size() const { return n_; }

 private:
  void Reset() {
    if (data_ != nullptr) FreePages(data_, static_cast<size_t>(n_) * sizeof(T));
    data_ = nullptr, n_ = 0;
  }
  T* data_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_PAGE_MEMORY_H_
