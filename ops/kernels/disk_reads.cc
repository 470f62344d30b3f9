#include "disk_reads.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__linux__) && __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#define TTF_HAVE_IO_URING 1
#endif

#include "disk_tier.h"  // DiskReadAll
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace ttf {
namespace {

// Reads `bytes` at `offset` only if the page cache holds them all (RWF_NOWAIT): false when the
// read would wait for the disk, or fails, or the kernel cannot tell (a blocking read then
// gives the answer or the error).
bool ReadIfCached(int fd, const DiskRead& r) {
#ifdef RWF_NOWAIT
  iovec target{r.data, static_cast<size_t>(r.bytes)};
  return ::preadv2(fd, &target, 1, static_cast<off_t>(r.offset), RWF_NOWAIT) == r.bytes;
#else
  return false;
#endif
}

// Threads that only wait on disk reads (no CPU work), for kernels without io_uring: a read that
// misses the page cache waits for the device, ~0.1 ms on a virtual disk, and a step's thousands
// of such reads issued one after another added up to most of its wall time. Created on the
// first read that misses; never destroyed (ops may run until the process exits).
thread::ThreadPool* DiskReadPool() {
  static thread::ThreadPool* pool = new thread::ThreadPool(Env::Default(), "ttf_disk_read", 32);
  return pool;
}

Status ReadManyOnThreads(int fd, const std::string& dir, int64_t n, const DiskRead* reads, int64_t* waited) {
  thread_local std::vector<int64_t> waiting_scratch;
  std::vector<int64_t>& waiting = waiting_scratch;  // this thread's: the pool's threads read it
  waiting.clear();
  for (int64_t i = 0; i < n; ++i)
    if (!ReadIfCached(fd, reads[i])) waiting.push_back(i);
  const int64_t m = static_cast<int64_t>(waiting.size());
  *waited = m;
  auto read_waiting = [&](int64_t begin, int64_t end) -> Status {
    for (int64_t j = begin; j < end; ++j) {
      const DiskRead& r = reads[waiting[j]];
      TF_RETURN_IF_ERROR(DiskReadAll(fd, dir, r.data, r.bytes, r.offset));
    }
    return OkStatus();
  };
  const int64_t tasks = std::min<int64_t>(m, DiskReadPool()->NumThreads());
  if (tasks <= 1) return read_waiting(0, m);
  std::vector<Status> done(tasks);
  BlockingCounter counter(tasks - 1);
  auto run = [&](int64_t t) { done[t] = read_waiting(m * t / tasks, m * (t + 1) / tasks); };
  for (int64_t t = 1; t < tasks; ++t) DiskReadPool()->Schedule([&, t]() { run(t), counter.DecrementCount(); });
  run(0);
  counter.Wait();
  for (const Status& status : done) TF_RETURN_IF_ERROR(status);
  return OkStatus();
}

#ifdef TTF_HAVE_IO_URING
// One io_uring of one thread (raw system calls: no liburing to install). A wave of reads is
// queued, handed to the kernel in one io_uring_enter and waited for in the same call.
class ReadRing {
 public:
  static constexpr unsigned kEntries = 512;

  // This thread's ring, or null when the kernel refuses one (logged once a process).
  static ReadRing* ThisThread() {
    static const bool enabled = [] {
      const char* env = std::getenv("TTF_SSD_IO_URING");
      return env == nullptr || std::strcmp(env, "0") != 0;
    }();
    if (!enabled) return nullptr;
    thread_local std::unique_ptr<ReadRing> ring = Create();
    return ring != nullptr && !ring->broken_ ? ring.get() : nullptr;
  }

  ~ReadRing() {
    if (sqes_ != MAP_FAILED) ::munmap(sqes_, sqes_bytes_);
    if (cq_ptr_ != MAP_FAILED && cq_ptr_ != sq_ptr_) ::munmap(cq_ptr_, cq_bytes_);
    if (sq_ptr_ != MAP_FAILED) ::munmap(sq_ptr_, sq_bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  // Reads reads[idx[j]] (reads[j] if idx is null) for j < m, each with `rw_flags`; res[j]
  // gets each result (bytes read or -errno). Waves of at most kEntries. An error of the ring
  // itself is returned.
  Status Run(int file, const DiskRead* reads, const int64_t* idx, int64_t m, int rw_flags, int* res) {
    for (int64_t first = 0; first < m; first += sq_entries_) {
      const unsigned wave = static_cast<unsigned>(std::min<int64_t>(sq_entries_, m - first));
      unsigned tail = *sq_tail_;  // only this thread writes it
      for (unsigned k = 0; k < wave; ++k, ++tail) {
        const unsigned at = tail & sq_mask_;
        const DiskRead& r = reads[idx == nullptr ? first + k : idx[first + k]];
        io_uring_sqe* sqe = &sqes_[at];
        std::memset(sqe, 0, sizeof(*sqe));
        sqe->opcode = IORING_OP_READ;
        sqe->fd = file;
        sqe->off = static_cast<uint64_t>(r.offset);
        sqe->addr = reinterpret_cast<uint64_t>(r.data);
        sqe->len = static_cast<uint32_t>(r.bytes);
        sqe->rw_flags = rw_flags;
        sqe->user_data = first + k;
        sq_array_[at] = at;
      }
      __atomic_store_n(sq_tail_, tail, __ATOMIC_RELEASE);
      unsigned to_submit = wave, done = 0;
      while (done < wave) {
        const int r = Enter(to_submit, wave - done);
        if (r < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
          broken_ = true;  // never entered again: this thread reads on the pool from now on
          return errors::Internal("io_uring_enter for the SSD tier's reads failed (", std::strerror(errno),
                                  "); set TTF_SSD_IO_URING=0 to read on a thread pool instead");
        }
        if (r > 0) to_submit -= std::min<unsigned>(to_submit, static_cast<unsigned>(r));
        unsigned head = *cq_head_;
        const unsigned cq_tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
        for (; head != cq_tail; ++head, ++done) {
          const io_uring_cqe& cqe = cqes_[head & cq_mask_];
          res[cqe.user_data] = cqe.res;
        }
        __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
      }
    }
    return OkStatus();
  }

 private:
  static std::unique_ptr<ReadRing> Create() {
    std::unique_ptr<ReadRing> ring(new ReadRing);
    const char* why = ring->Setup();
    const int err = errno;
    if (why == nullptr) return ring;
    static std::atomic<bool> logged{false};  // once: every thread that reads would say the same
    if (!logged.exchange(true)) {
      LOG(INFO) << "ttf: the SSD tier reads on a thread pool, not io_uring (" << why << ": "
                << std::strerror(err) << ")";
    }
    return nullptr;
  }

  // Null on success, else the step that failed (errno says why).
  const char* Setup() {
    io_uring_params p;
    // Completions are handled when this thread waits for them (no interrupting task work),
    // where the kernel has those flags (6.1; 5.19); else without.
    for (unsigned flags : {
#if defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
           unsigned{IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN},
#endif
#ifdef IORING_SETUP_COOP_TASKRUN
           unsigned{IORING_SETUP_COOP_TASKRUN},
#endif
           0u}) {
      std::memset(&p, 0, sizeof(p));
      p.flags = flags;
      fd_ = static_cast<int>(::syscall(__NR_io_uring_setup, kEntries, &p));
      if (fd_ >= 0 || errno != EINVAL) break;
    }
    if (fd_ < 0) return "io_uring_setup";
    sq_entries_ = p.sq_entries;
    sq_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single_mmap = p.features & IORING_FEAT_SINGLE_MMAP;
    if (single_mmap) sq_bytes_ = cq_bytes_ = std::max(sq_bytes_, cq_bytes_);
    sq_ptr_ = ::mmap(nullptr, sq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQ_RING);
    if (sq_ptr_ == MAP_FAILED) return "mapping the io_uring submission queue";
    cq_ptr_ = single_mmap ? sq_ptr_
                          : ::mmap(nullptr, cq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                                   IORING_OFF_CQ_RING);
    if (cq_ptr_ == MAP_FAILED) return "mapping the io_uring completion queue";
    sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    void* sqes = ::mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
    if (sqes == MAP_FAILED) return "mapping the io_uring submission entries";
    sqes_ = static_cast<io_uring_sqe*>(sqes);
    char* sq = static_cast<char*>(sq_ptr_);
    char* cq = static_cast<char*>(cq_ptr_);
    sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    return nullptr;
  }

  int Enter(unsigned to_submit, unsigned min_complete) {
    return static_cast<int>(
        ::syscall(__NR_io_uring_enter, fd_, to_submit, min_complete, IORING_ENTER_GETEVENTS, nullptr, 0));
  }

  int fd_ = -1;
  bool broken_ = false;  // an io_uring_enter failed: the ring's state is unknown
  unsigned sq_entries_ = 0;
  size_t sq_bytes_ = 0, cq_bytes_ = 0, sqes_bytes_ = 0;
  void* sq_ptr_ = MAP_FAILED;
  void* cq_ptr_ = MAP_FAILED;
  io_uring_sqe* sqes_ = static_cast<io_uring_sqe*>(MAP_FAILED);
  unsigned *sq_tail_ = nullptr, *sq_array_ = nullptr, *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned sq_mask_ = 0, cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

// Two waves: every read with RWF_NOWAIT (the page cache's complete, the others fail with
// EAGAIN at once), then the ones that failed without it, reaching the device together. A read
// that neither wave completes (a short read, an error) is read again with pread, which retries
// or returns the error.
Status ReadManyOnRing(ReadRing* ring, int fd, const std::string& dir, int64_t n, const DiskRead* reads,
                      int64_t* waited) {
  thread_local std::vector<int64_t> waiting;
  thread_local std::vector<int> res;
  res.assign(n, 0);
  TF_RETURN_IF_ERROR(ring->Run(fd, reads, nullptr, n, RWF_NOWAIT, res.data()));
  waiting.clear();
  for (int64_t i = 0; i < n; ++i)
    if (res[i] != reads[i].bytes) waiting.push_back(i);
  const int64_t m = static_cast<int64_t>(waiting.size());
  *waited = m;
  if (m == 0) return OkStatus();
  res.assign(m, 0);
  TF_RETURN_IF_ERROR(ring->Run(fd, reads, waiting.data(), m, 0, res.data()));
  for (int64_t j = 0; j < m; ++j) {
    const DiskRead& r = reads[waiting[j]];
    if (res[j] != r.bytes) TF_RETURN_IF_ERROR(DiskReadAll(fd, dir, r.data, r.bytes, r.offset));
  }
  return OkStatus();
}
#endif  // TTF_HAVE_IO_URING

}  // namespace

Status ReadMany(int fd, const std::string& dir, int64_t n, const DiskRead* reads, int64_t* waited) {
  *waited = 0;
  if (n == 0) return OkStatus();
#ifdef TTF_HAVE_IO_URING
  if (ReadRing* ring = ReadRing::ThisThread()) return ReadManyOnRing(ring, fd, dir, n, reads, waited);
#endif
  return ReadManyOnThreads(fd, dir, n, reads, waited);
}

}  // namespace ttf
}  // namespace tensorflow
