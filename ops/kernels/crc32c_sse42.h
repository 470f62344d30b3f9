// CRC32C (Castagnoli) by the SSE4.2 crc32 instruction, chosen at run time: TensorFlow's wheel is
// built for baseline x86-64, so its crc32c::Value (absl) runs the portable table code, and the
// TFRecord framing (read_records_kernels.cc) checks every byte it reads. The library stays
// portable (no -msse4.2): only Sse42Value is compiled for SSE4.2, and only called where the CPU
// has it; elsewhere the caller keeps TensorFlow's. Same results bit for bit (the crc32 instruction
// computes this very polynomial): tests/data/crc32c_check.cc compares them on random buffers.
// No TensorFlow header here, so the check builds without TensorFlow.
#ifndef TTF_OPS_KERNELS_CRC32C_SSE42_H_
#define TTF_OPS_KERNELS_CRC32C_SSE42_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define TTF_CRC32C_SSE42 1
#endif

namespace tensorflow {
namespace ttf {
namespace crc32c_hw {

// True where Sse42Value may be called: an x86-64 CPU with SSE4.2.
inline bool Available() {
#ifdef TTF_CRC32C_SSE42
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

#ifdef TTF_CRC32C_SSE42
// The CRC32C of data[0:n) (not masked), as crc32c::Value gives it: 8 bytes an instruction, then
// the tail. Only where Available().
__attribute__((target("sse4.2"))) inline uint32_t Sse42Value(const char* data, size_t n) {
  uint64_t crc = 0xffffffffu;
  for (; n >= 8; n -= 8, data += 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    crc = _mm_crc32_u64(crc, word);
  }
  uint32_t c = static_cast<uint32_t>(crc);
  for (; n > 0; --n, ++data) c = _mm_crc32_u8(c, static_cast<uint8_t>(*data));
  return ~c;
}
#endif

}  // namespace crc32c_hw
}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_CRC32C_SSE42_H_
