// The SSE4.2 CRC32C (ops/kernels/crc32c_sse42.h) against TensorFlow's crc32c::Value (what
// TtfReadRecords uses on a CPU without SSE4.2, and what tf.io.TFRecordWriter writes): random
// buffers of every length 0..2,100 at every start offset 0..7, and lengths past a page.
// Prints "sse4.2 ok N" (N buffers compared), or "no-sse4.2" where the CPU cannot run it;
// "mismatch ..." and exit 1 at the first differing CRC. Built by tests/data/test_crc32c.py.
#include <cstdio>
#include <random>
#include <vector>

#include "tensorflow/core/lib/hash/crc32c.h"
#include "crc32c_sse42.h"

int main() {
  namespace hw = tensorflow::ttf::crc32c_hw;
  if (!hw::Available()) {
    std::printf("no-sse4.2\n");
    return 0;
  }
#ifdef TTF_CRC32C_SSE42
  std::mt19937_64 rng(48);
  std::vector<char> buffer(70000 + 8);
  for (char& c : buffer) c = static_cast<char>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 2100; ++n) lengths.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65535, 65536, 69999}) lengths.push_back(n);
  long compared = 0;
  for (size_t n : lengths) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const char* data = buffer.data() + offset;
      const uint32_t want = tensorflow::crc32c::Value(data, n), got = hw::Sse42Value(data, n);
      if (want != got) {
        std::printf("mismatch at length %zu offset %zu: TensorFlow %08x, SSE4.2 %08x\n", n, offset, want, got);
        return 1;
      }
      ++compared;
    }
  }
  // The check value of CRC-32C ("123456789"), so both cannot agree on a wrong polynomial.
  if (hw::Sse42Value("123456789", 9) != 0xe3069283u) {
    std::printf("mismatch on the check value: %08x\n", hw::Sse42Value("123456789", 9));
    return 1;
  }
  std::printf("sse4.2 ok %ld\n", compared);
#endif
  return 0;
}
