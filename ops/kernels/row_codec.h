// Compressed training rows (issue 49): a row's fp32 values written back as bfloat16 or as
// row-wise int8 with seeded stochastic rounding, and read back (dequantized) in registers.
//
// Determinism. The rounding of element j of key k's row at update step t draws its uniform
// from a counter-based hash of (seed, key, step, j) (SplitMix64, table_hash.h), never from a
// stream shared between threads: a row stays a pure function of (seed, key, update history),
// bit for bit across runs and thread counts, as fp32 rows are. FBGEMM's int8 training rows
// draw theirs from a per-thread xorshift state instead (reproducible only with the same
// thread layout).
//
// int8 layout (the serving layout of ttf.serving's pack_rows, so an int8 training row exports
// as an int8 serving row without a round trip through fp32): dim int8 codes q in [-128, 127],
// then a float32 scale and a float32 bias, value = q * scale + bias. The write-back spans the
// row's [min, max] in 256 steps (scale = (max - min) / 255, bias = min + 128 * scale), as
// FBGEMM's row-wise 8-bit rows do; the code is floor((x - min) / scale + u), u uniform in
// [0, 1): its expectation is x exactly (unbiased), its error below one step.
//
// bf16: the fp32 bits plus 16 uniform bits, truncated to the top 16 (unbiased for finite
// values; NaN stays NaN, an infinity stays that infinity).
#ifndef TTF_OPS_KERNELS_ROW_CODEC_H_
#define TTF_OPS_KERNELS_ROW_CODEC_H_

#include <cstdint>
#include <cstring>

#include "table_hash.h"

namespace tensorflow {
namespace ttf {

enum class RowFormat : int { kFp32 = 0, kBf16 = 1, kInt8 = 2 };

// Bytes of one row's `dim` values in `format` (int8: the codes, then scale and bias).
inline int64_t RowValueBytes(RowFormat format, int64_t dim) {
  switch (format) {
    case RowFormat::kBf16: return 2 * dim;
    case RowFormat::kInt8: return dim + 8;
    default: return 4 * dim;
  }
}

// The rounding draws of one row's write-back at one step: Uniform(j) for element j.
class RoundingDraws {
 public:
  RoundingDraws(uint64_t seed, int64_t key, int64_t step)
      : base_(Mix64(Mix64(seed ^ 0x6a09e667f3bcc908ULL) ^ static_cast<uint64_t>(key)) ^
              Mix64(static_cast<uint64_t>(step) ^ 0xbb67ae8584caa73bULL)) {}
  // Draws that round to nearest instead (ties away from zero): Uniform is 1/2, the bits' low
  // half 0x8000.
  static RoundingDraws Nearest() {
    RoundingDraws draws(0, 0, 0);
    draws.nearest_ = true;
    return draws;
  }
  // 32 uniform bits for element j (the high half of one SplitMix64 step).
  uint32_t Bits(int64_t j) const {
    return nearest_ ? 0x80008000u : static_cast<uint32_t>(Mix64(base_ + static_cast<uint64_t>(j)) >> 32);
  }
  // Uniform in [0, 1), 24 bits (exact in a float).
  float Uniform(int64_t j) const {
    return nearest_ ? 0.5f : static_cast<float>(Bits(j) >> 8) * (1.0f / 16777216.0f);
  }
  // What Bits hashes (base() + j), for the vector kernels (row_kernels.cc).
  uint64_t base() const { return base_; }
  bool nearest() const { return nearest_; }

 private:
  uint64_t base_;
  bool nearest_ = false;
};

inline uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}
inline float BitsFloat(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// x rounded to bfloat16 stochastically with `r` (uniform bits: their low 16 are used).
inline uint16_t Bf16Stochastic(float x, uint32_t r) {
  const uint32_t b = FloatBits(x);
  if ((b & 0x7f800000u) == 0x7f800000u) {  // Inf stays Inf; NaN stays NaN (quiet bit set)
    return static_cast<uint16_t>((b >> 16) | ((b & 0x007fffffu) != 0 ? 0x0040u : 0u));
  }
  // Adding below the kept bits carries into them with probability (dropped bits) / 2^16. A
  // carry out of the largest finite magnitude gives an infinity, as round-to-nearest would.
  return static_cast<uint16_t>((b + (r & 0xffffu)) >> 16);
}

inline void EncodeBf16(const float* x, int64_t dim, const RoundingDraws& draws, uint16_t* out) {
  for (int64_t j = 0; j < dim; ++j) out[j] = Bf16Stochastic(x[j], draws.Bits(j));
}
inline void DecodeBf16(const uint16_t* h, int64_t dim, float* out) {
  for (int64_t j = 0; j < dim; ++j) out[j] = Bf16ToFloat(h[j]);
}

// An int8 row's scale and bias, after its dim codes (unaligned: read and written by memcpy).
inline void Int8ScaleBias(const int8_t* row, int64_t dim, float* scale, float* bias) {
  std::memcpy(scale, row + dim, sizeof(float));
  std::memcpy(bias, row + dim + 4, sizeof(float));
}

// out[j] = q[j] * scale + bias: a convert and a multiply-add the compiler vectorizes.
inline void DecodeInt8(const int8_t* row, int64_t dim, float* out) {
  float scale, bias;
  Int8ScaleBias(row, dim, &scale, &bias);
  for (int64_t j = 0; j < dim; ++j) out[j] = static_cast<float>(row[j]) * scale + bias;
}

// One element's code: its steps above `lo` plus the draw `u`, clamped in float before the
// conversion (a NaN becomes 0: no undefined conversion). The vector encoders' tails use it too.
inline int8_t Int8Code(float x, float lo, float inverse, float u) {
  float steps = (x - lo) * inverse + u;
  steps = steps >= 0.0f ? steps : 0.0f;
  steps = steps <= 255.0f ? steps : 255.0f;
  return static_cast<int8_t>(static_cast<int32_t>(steps) - 128);
}

// The row's float32 scale and bias after its `dim` codes (value = code * scale + bias).
inline void WriteInt8ScaleBias(float lo, float scale, int8_t* tail) {
  const float bias = lo + 128.0f * scale;
  std::memcpy(tail, &scale, sizeof(float));
  std::memcpy(tail + 4, &bias, sizeof(float));
}

// x (dim finite floats) into the int8 row layout above, each code rounded stochastically.
// A constant row is exact (scale 0). A row holding a NaN or an infinity (or spanning more
// than the float range) is written with scale NaN: it reads back as NaN, never as a finite
// row that hides it.
inline void EncodeInt8(const float* x, int64_t dim, const RoundingDraws& draws, int8_t* out) {
  float lo = x[0], hi = x[0];
  uint32_t non_finite = 0;  // as AllFinite: the exponent's +1 carries into bit 31 only when all ones
  for (int64_t j = 0; j < dim; ++j) {
    lo = x[j] < lo ? x[j] : lo;
    hi = x[j] > hi ? x[j] : hi;
    non_finite |= (FloatBits(x[j]) & 0x7f800000u) + 0x00800000u;
  }
  const float scale = (non_finite >> 31) != 0 ? BitsFloat(0x7fc00000u) : (hi - lo) / 255.0f;
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int64_t j = 0; j < dim; ++j) out[j] = Int8Code(x[j], lo, inverse, draws.Uniform(j));
  WriteInt8ScaleBias(lo, scale, out + dim);
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_ROW_CODEC_H_
