// Many small reads at random offsets of one file, for the SSD tier's lookups.
#ifndef TTF_OPS_KERNELS_DISK_READS_H_
#define TTF_OPS_KERNELS_DISK_READS_H_

#include <cstdint>
#include <string>

#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace ttf {

struct DiskRead {
  char* data;
  int64_t bytes;
  int64_t offset;
};

// Reads all n requests of file `fd` (errors name ssd_dir `dir`); *waited counts those the page
// cache did not hold, which waited for the device. Through a per-thread io_uring where the
// kernel allows one: the reads go to the kernel together, those the page cache holds are copied
// at once, the rest reach the device as one batch and are waited for together. Otherwise (no
// io_uring: seccomp in most containers, kernel.io_uring_disabled, Linux before 5.6; or
// TTF_SSD_IO_URING=0) cached records are read with preadv2(RWF_NOWAIT) and the others on a
// pool of threads that only wait. Returns the first read error.
Status ReadMany(int fd, const std::string& dir, int64_t n, const DiskRead* reads, int64_t* waited);

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_DISK_READS_H_
