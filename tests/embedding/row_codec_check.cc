// Runs ops/kernels/row_codec.h on rows from a file, for tests/embedding/test_row_codec.py:
//   row_codec_check int8|bf16 SEED DIM IN OUT
// IN: records [int64 key, int64 step, DIM float32]; OUT: each row encoded (int8: DIM codes,
// scale, bias; bf16: DIM uint16), then each row decoded (DIM float32).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "row_codec.h"

using tensorflow::ttf::DecodeBf16;
using tensorflow::ttf::DecodeInt8;
using tensorflow::ttf::EncodeBf16;
using tensorflow::ttf::EncodeInt8;
using tensorflow::ttf::RoundingDraws;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s int8|bf16 SEED DIM IN OUT\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const int64_t dim = std::strtoll(argv[3], nullptr, 10);
  FILE* in = std::fopen(argv[4], "rb");
  FILE* out = std::fopen(argv[5], "wb");
  if (in == nullptr || out == nullptr || dim < 1 || (mode != "int8" && mode != "bf16")) return 2;
  const int64_t record = 16 + 4 * dim, encoded = mode == "int8" ? dim + 8 : 2 * dim;
  std::vector<char> buf(record), code(encoded);
  std::vector<float> decoded_all;
  std::vector<float> decoded(dim);
  while (std::fread(buf.data(), 1, record, in) == static_cast<size_t>(record)) {
    int64_t key, step;
    std::memcpy(&key, buf.data(), 8);
    std::memcpy(&step, buf.data() + 8, 8);
    std::vector<float> x(dim);
    std::memcpy(x.data(), buf.data() + 16, 4 * dim);
    const RoundingDraws draws(seed, key, step);
    if (mode == "int8") {
      EncodeInt8(x.data(), dim, draws, reinterpret_cast<int8_t*>(code.data()));
      DecodeInt8(reinterpret_cast<const int8_t*>(code.data()), dim, decoded.data());
    } else {
      EncodeBf16(x.data(), dim, draws, reinterpret_cast<uint16_t*>(code.data()));
      DecodeBf16(reinterpret_cast<const uint16_t*>(code.data()), dim, decoded.data());
    }
    std::fwrite(code.data(), 1, encoded, out);
    decoded_all.insert(decoded_all.end(), decoded.begin(), decoded.end());
  }
  std::fwrite(decoded_all.data(), sizeof(float), decoded_all.size(), out);
  return std::fclose(out) == 0 ? 0 : 1;
}
