// The C++-loop floor of benchmarks/lookup_floor.py: what the same rows cost with no hash
// table at all. Rows sit in one contiguous [rows, 3 * dim] array (value | m | v, the layout
// of a ttf row under Adam) and ids are row numbers. Built by the benchmark with the flags
// ttf's op library uses (-O3, no -march=native) and called through ctypes.
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {

// out[p] = the value part of row idx[p] (the inference lookup's work without the table).
void floor_gather(const float* store, int64_t stride, const int64_t* idx, int64_t n, int64_t dim, float* out) {
  for (int64_t p = 0; p < n; ++p) {
    if (p + 8 < n) __builtin_prefetch(store + idx[p + 8] * stride);
    std::memcpy(out + p * dim, store + idx[p] * stride, dim * sizeof(float));
  }
}

// The Adam update of rows idx[p] with grads[p], in place (a gather and scatter of value and
// both slots fused into one pass; Keras' epsilon placement, as ttf's AdamUpdate).
void floor_adam(float* store, int64_t stride, const int64_t* idx, int64_t n, int64_t dim, const float* grads,
                float alpha, float beta_1, float beta_2, float epsilon) {
  for (int64_t p = 0; p < n; ++p) {
    if (p + 8 < n) {
      const char* ahead = reinterpret_cast<const char*>(store + idx[p + 8] * stride);
      for (int64_t b = 0; b < stride * 4; b += 64) __builtin_prefetch(ahead + b, 1);
    }
    float* __restrict row = store + idx[p] * stride;
    float* __restrict m = row + dim;
    float* __restrict v = row + 2 * dim;
    const float* __restrict g = grads + p * dim;
    for (int64_t j = 0; j < dim; ++j) {
      m[j] += (g[j] - m[j]) * (1.0f - beta_1);
      v[j] += (g[j] * g[j] - v[j]) * (1.0f - beta_2);
      row[j] -= (m[j] * alpha) / (std::sqrt(v[j]) + epsilon);
    }
  }
}

}  // extern "C"
