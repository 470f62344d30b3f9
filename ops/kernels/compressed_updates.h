// Compressed optimizer states for compressed rows (issue 49), FBGEMM's row-wise forms: one
// second moment for a row's leading elements instead of one an element. Each works on a row
// decoded to fp32, [value (dim) | state], and has the shape of sparse_apply_kernels.cc's
// functors (Update(row, grad, dim)); the row is then encoded back (row_codec.h).
//
// The row-wise moment spans all but the row's LAST element, which keeps a moment of its own
// (RowwiseMomentFloats: 2 floats, [the leading elements', the last's]; 1 at dim 1, where the
// two forms are one). A DeepFM / Wide&Deep row is `dim` embedding values plus the id's
// first-order weight as its last element (models/ctr.py), whose gradient is ~7x the
// embedding elements' (rms): in one shared moment it took steps several times element-wise
// Adam's, and int8 Adam's AUC sat +0.0018 above fp32's; with its own moment, +0.0007
// (benchmarks/results/table_memory.md). For a row without such a weight the last element
// simply gets its element-wise moment.
//
// - Row-wise Adagrad: state = the accumulators of the leading elements' mean squared gradient
//   and of the last element's squared gradient; epsilon inside the root, as ttf's (Keras') Adagrad.
// - Partial row-wise Adam: state = the first moment per element (dim floats; bf16 once
//   encoded), then the second moment: the leading elements' mean of g^2 and the last
//   element's g^2; Adam's bias correction folded into alpha as in AdamUpdate.
// Bytes of state a key at dim 33 (32 + the first-order weight): Adam 264 -> 76 (bf16 m: 68
// + 8), Adagrad 132 -> 8.
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

// Floats of a row-wise moment: the leading dim - 1 elements' and the last element's (one at
// dim 1: the last element is the row).
constexpr int64_t RowwiseMomentFloats(int64_t dim) { return dim > 1 ? 2 : 1; }

struct RowwiseAdagradUpdate {
  static constexpr int64_t StateFloats(int64_t dim) { return RowwiseMomentFloats(dim); }
  float lr, epsilon;
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    const int64_t last = dim - 1;
    float* __restrict accum = row + dim;  // [leading elements' (dim > 1), the last element's]
    if (last > 0) {
      accum[0] += MeanSquare(g, last);
      const float step = lr / std::sqrt(accum[0] + epsilon);
      for (int64_t j = 0; j < last; ++j) row[j] -= step * g[j];
    }
    float& own = accum[RowwiseMomentFloats(dim) - 1];
    own += g[last] * g[last];
    row[last] -= lr / std::sqrt(own + epsilon) * g[last];
  }
};

struct PartialRowwiseAdamUpdate {
  static constexpr int64_t StateFloats(int64_t dim) { return dim + RowwiseMomentFloats(dim); }
  float beta_1, beta_2, epsilon, alpha;  // alpha: lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
  PartialRowwiseAdamUpdate(float lr, float b1, float b2, float eps, int64_t step)
      : beta_1(b1), beta_2(b2), epsilon(eps) {
    const float t = static_cast<float>(step);
    alpha = lr * std::sqrt(1.0f - std::pow(beta_2, t)) / (1.0f - std::pow(beta_1, t));
  }
  void Update(float* __restrict row, const float* __restrict g, int64_t dim) const {
    const int64_t last = dim - 1;
    float* __restrict m = row + dim;
    float* __restrict v = row + 2 * dim;  // [leading elements' (dim > 1), the last element's]
    for (int64_t j = 0; j < dim; ++j) m[j] += (g[j] - m[j]) * (1.0f - beta_1);
    if (last > 0) {
      v[0] += (MeanSquare(g, last) - v[0]) * (1.0f - beta_2);
      const float step = alpha / (std::sqrt(v[0]) + epsilon);
      for (int64_t j = 0; j < last; ++j) row[j] -= m[j] * step;
    }
    float& own = v[RowwiseMomentFloats(dim) - 1];
    own += (g[last] * g[last] - own) * (1.0f - beta_2);
    row[last] -= m[last] * (alpha / (std::sqrt(own) + epsilon));
  }
};

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_COMPRESSED_UPDATES_H_
