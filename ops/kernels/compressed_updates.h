// Compressed optimizer states for compressed rows (issue 49), FBGEMM's row-wise forms: one
// second moment a row instead of one an element. Each works on a row decoded to fp32,
// [value (dim) | state], and has the shape of sparse_apply_kernels.cc's functors
// (Update(row, grad, dim)); the row is then encoded back (row_codec.h).
//
// - Row-wise Adagrad: state = 1 float, the accumulator of the mean squared gradient of the
//   row; epsilon inside the root, as ttf's (Keras') Adagrad.
// - Partial row-wise Adam: state = the first moment per element (dim floats; bf16 once
//   encoded) and the second moment per row (1 float, the mean of g^2); Adam's bias
//   correction folded into alpha as in AdamUpdate.
// Bytes of state a key at dim 32: Adam 256 -> 68 (bf16 m: 64 + 4), Adagrad 128 -> 4.
#ifndef TTF_OPS_KERNELS_COMPRESSED_UPDATES_H_
#define TTF_OPS_KERNELS_COMPRESSED_UPDATES_H_

#include <cmath>
#include <cstdint>

namespace tensorflow {
namespace ttf {

// The mean of g[j]^2 in a fixed order (deterministic): element j into partial sum j % 8, in
// order, then the eight sums pairwise, ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)). The
// partial sums are independent lanes the compiler vectorizes with baseline SSE2; one sum in
// order was a chain of dim dependent adds, a third of the int8 Adam update's time (profiled).
inline float MeanSquare(const float* g, int64_t dim) {
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    for (int l = 0; l < 8; ++l) s[l] += g[j + l] * g[j + l];
  }
  for (int l = 0; j + l < dim; ++l) s[l] += g[j + l] * g[j + l];
  const float sum = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  return sum / static_cast<float>(dim);
}

struct RowwiseAdagradUpdate {
  static constexpr int64_t StateFloats(int64_t) { return 1; }
  float lr, epsilon;
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    float& accum = row[dim];
    accum += MeanSquare(g, dim);
    const float step = lr / std::sqrt(accum + epsilon);
    for (int64_t j = 0; j < dim; ++j) row[j] -= step * g[j];
  }
};

struct PartialRowwiseAdamUpdate {
  static constexpr int64_t StateFloats(int64_t dim) { return dim + 1; }
  float beta_1, beta_2, epsilon, alpha;  // alpha: lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
  PartialRowwiseAdamUpdate(float lr, float b1, float b2, float eps, int64_t step)
      : beta_1(b1), beta_2(b2), epsilon(eps) {
    const float t = static_cast<float>(step);
    alpha = lr * std::sqrt(1.0f - std::pow(beta_2, t)) / (1.0f - std::pow(beta_1, t));
  }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    float* __restrict m = row + dim;
    float& v = row[2 * dim];
    v += (MeanSquare(g, dim) - v) * (1.0f - beta_2);
    const float step = alpha / (std::sqrt(v) + epsilon);
    for (int64_t j = 0; j < dim; ++j) {
      m[j] += (g[j] - m[j]) * (1.0f - beta_1);
      row[j] -= m[j] * step;
    }
  }
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_COMPRESSED_UPDATES_H_
