// Runs ops/kernels/compressed_updates.h for tests/embedding/test_row_codec.py:
//   compressed_updates_check adagrad|adam DIM N STEPS LR B1 B2 EPS IN OUT
// IN: N rows of [value | state] float32, then STEPS x N gradient rows of DIM float32; each
// step t (1-based) updates every row with its gradient. OUT: the N rows after the last step.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compressed_updates.h"

using tensorflow::ttf::PartialRowwiseAdamUpdate;
using tensorflow::ttf::RowwiseAdagradUpdate;

int main(int argc, char** argv) {
  if (argc != 11) return 2;
  const std::string mode = argv[1];
  const int64_t dim = std::atoll(argv[2]), n = std::atoll(argv[3]), steps = std::atoll(argv[4]);
  const float lr = std::atof(argv[5]), b1 = std::atof(argv[6]), b2 = std::atof(argv[7]), eps = std::atof(argv[8]);
  const bool adam = mode == "adam";
  if (!adam && mode != "adagrad") return 2;
  const int64_t stride = dim + (adam ? PartialRowwiseAdamUpdate::StateFloats(dim) : RowwiseAdagradUpdate::StateFloats(dim));
  std::vector<float> rows(n * stride), grads(steps * n * dim);
  FILE* in = std::fopen(argv[9], "rb");
  if (in == nullptr || std::fread(rows.data(), 4, rows.size(), in) != rows.size() ||
      std::fread(grads.data(), 4, grads.size(), in) != grads.size())
    return 2;
  for (int64_t t = 1; t <= steps; ++t) {
    const float* g = grads.data() + (t - 1) * n * dim;
    for (int64_t i = 0; i < n; ++i) {
      if (adam) {
        PartialRowwiseAdamUpdate(lr, b1, b2, eps, t).Update(rows.data() + i * stride, g + i * dim, dim);
      } else {
        RowwiseAdagradUpdate{lr, eps}.Update(rows.data() + i * stride, g + i * dim, dim);
      }
    }
  }
  FILE* out = std::fopen(argv[10], "wb");
  if (out == nullptr) return 2;
  std::fwrite(rows.data(), 4, rows.size(), out);
  return std::fclose(out) == 0 ? 0 : 1;
}
