#include "row_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TTF_ROW_KERNELS_AVX2 1
#endif

namespace tensorflow {
namespace ttf {
namespace {

void EncodeBf16From(const float* x, int64_t dim, const RoundingDraws& draws, int64_t first, uint16_t* out) {
  for (int64_t j = 0; j < dim; ++j) out[j] = Bf16Stochastic(x[j], draws.Bits(first + j));
}

#ifdef TTF_ROW_KERNELS_AVX2
// "avx2" alone, not "fma": with FMA enabled the compiler may fuse a multiply and an add into
// one rounding, and the bits would differ from the scalar code's.
#define TTF_AVX2 __attribute__((target("avx2")))

// a * c mod 2^64 in each 64-bit lane (AVX2 has no 64-bit multiply): three 32 x 32 products.
TTF_AVX2 inline __m256i Mul64(__m256i a, uint64_t c) {
  const __m256i c_lo = _mm256_set1_epi64x(static_cast<int64_t>(c & 0xffffffffULL));
  const __m256i c_hi = _mm256_set1_epi64x(static_cast<int64_t>(c >> 32));
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo), _mm256_mul_epu32(a, c_hi));
  return _mm256_add_epi64(_mm256_mul_epu32(a, c_lo), _mm256_slli_epi64(cross, 32));
}

// Mix64 (table_hash.h) of four 64-bit lanes.
TTF_AVX2 inline __m256i Mix64x4(__m256i x) {
  x = _mm256_add_epi64(x, _mm256_set1_epi64x(static_cast<int64_t>(0x9e3779b97f4a7c15ULL)));
  x = Mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 30)), 0xbf58476d1ce4e5b9ULL);
  x = Mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 27)), 0x94d049bb133111ebULL);
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

// draws.Bits(first + i), i < 8, in lane order.
TTF_AVX2 inline __m256i Bits8(const RoundingDraws& draws, int64_t first) {
  if (draws.nearest()) return _mm256_set1_epi32(static_cast<int32_t>(0x80008000u));
  const __m256i at = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(draws.base() + first)),
                                      _mm256_setr_epi64x(0, 1, 2, 3));
  const __m256 a = _mm256_castsi256_ps(Mix64x4(at));
  const __m256 b = _mm256_castsi256_ps(Mix64x4(_mm256_add_epi64(at, _mm256_set1_epi64x(4))));
  // The high halves: [a0 a1 b0 b1 | a2 a3 b2 b3], then the middle quarters swapped.
  const __m256 high = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm256_permute4x64_epi64(_mm256_castps_si256(high), _MM_SHUFFLE(3, 1, 2, 0));
}

// draws.Uniform(first + i), i < 8.
TTF_AVX2 inline __m256 Uniform8(const RoundingDraws& draws, int64_t first) {
  if (draws.nearest()) return _mm256_set1_ps(0.5f);
  const __m256i bits = _mm256_srli_epi32(Bits8(draws, first), 8);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(bits), _mm256_set1_ps(1.0f / 16777216.0f));
}

TTF_AVX2 void DecodeInt8Avx2(const int8_t* row, int64_t dim, float* out) {
  float scale, bias;
  Int8ScaleBias(row, dim, &scale, &bias);
  const __m256 s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + j)));
    _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), s), b));
  }
  for (; j < dim; ++j) out[j] = static_cast<float>(row[j]) * scale + bias;
}

TTF_AVX2 void EncodeInt8Avx2(const float* x, int64_t dim, const RoundingDraws& draws, int8_t* out) {
  if (dim < 8) return EncodeInt8(x, dim, draws, out);
  __m256 lo8 = _mm256_loadu_ps(x), hi8 = lo8;
  __m256i non_finite8 = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    lo8 = _mm256_min_ps(v, lo8);
    hi8 = _mm256_max_ps(v, hi8);
    const __m256i exponent = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7f800000));
    non_finite8 = _mm256_or_si256(non_finite8, _mm256_add_epi32(exponent, _mm256_set1_epi32(0x00800000)));
  }
  alignas(32) float lanes_lo[8], lanes_hi[8];
  _mm256_store_ps(lanes_lo, lo8);
  _mm256_store_ps(lanes_hi, hi8);
  float lo = lanes_lo[0], hi = lanes_hi[0];
  for (int l = 1; l < 8; ++l) {
    lo = lanes_lo[l] < lo ? lanes_lo[l] : lo;
    hi = lanes_hi[l] > hi ? lanes_hi[l] : hi;
  }
  uint32_t non_finite = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(non_finite8)));
  for (int64_t t = j; t < dim; ++t) {
    lo = x[t] < lo ? x[t] : lo;
    hi = x[t] > hi ? x[t] : hi;
    non_finite |= ((FloatBits(x[t]) & 0x7f800000u) + 0x00800000u) >> 31;
  }
  // A row with a NaN or an infinity, or a constant one (whose span's zero has the sign of
  // whichever element the reduction met first), is the scalar code's: its bits hang on order.
  if (non_finite != 0 || !(lo < hi)) return EncodeInt8(x, dim, draws, out);
  const float scale = (hi - lo) / 255.0f;
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  const __m256 lo_v = _mm256_set1_ps(lo), inverse_v = _mm256_set1_ps(inverse);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
  // Byte 0 of each 32-bit lane to the front of its 128-bit half, then the halves' fronts together.
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  for (j = 0; j + 8 <= dim; j += 8) {
    __m256 steps = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), lo_v), inverse_v),
                                 Uniform8(draws, j));
    steps = _mm256_min_ps(_mm256_max_ps(steps, zero), top);  // as the scalar clamp (no NaN here)
    const __m256i code = _mm256_sub_epi32(_mm256_cvttps_epi32(steps), _mm256_set1_epi32(128));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(code, pick), gather);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), _mm256_castsi256_si128(bytes));
  }
  for (; j < dim; ++j) out[j] = Int8Code(x[j], lo, inverse, draws.Uniform(j));
  WriteInt8ScaleBias(lo, scale, out + dim);
}

TTF_AVX2 void DecodeBf16Avx2(const uint16_t* h, int64_t dim, float* out) {
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + j)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_slli_epi32(wide, 16));
  }
  for (; j < dim; ++j) out[j] = Bf16ToFloat(h[j]);
}

TTF_AVX2 void EncodeBf16Avx2(const float* x, int64_t dim, const RoundingDraws& draws, int64_t first,
                             uint16_t* out) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000), mantissa = _mm256_set1_epi32(0x007fffff);
  const __m256i low16 = _mm256_set1_epi32(0xffff), quiet = _mm256_set1_epi32(0x40);
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m256i r = _mm256_and_si256(Bits8(draws, first + j), low16);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, r), 16);
    // Inf and NaN as Bf16Stochastic: truncated, a NaN's quiet bit set.
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(b, exponent), exponent);
    const __m256i payload = _mm256_cmpeq_epi32(_mm256_and_si256(b, mantissa), _mm256_setzero_si256());
    const __m256i kept = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_andnot_si256(payload, quiet));
    const __m256i h = _mm256_blendv_epi8(rounded, kept, special);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm256_castsi256_si128(packed));
  }
  for (; j < dim; ++j) out[j] = Bf16Stochastic(x[j], draws.Bits(first + j));
}
#endif  // TTF_ROW_KERNELS_AVX2

const RowKernels kScalar{"scalar", DecodeInt8, EncodeInt8, DecodeBf16, EncodeBf16From};
#ifdef TTF_ROW_KERNELS_AVX2
const RowKernels kAvx2{"avx2", DecodeInt8Avx2, EncodeInt8Avx2, DecodeBf16Avx2, EncodeBf16Avx2};
#endif
}  // namespace

const RowKernels& ScalarRowKernels() { return kScalar; }

const RowKernels* Avx2RowKernels() {
#ifdef TTF_ROW_KERNELS_AVX2
  if (__builtin_cpu_supports("avx2")) return &kAvx2;
#endif
  return nullptr;
}

const RowKernels& BestRowKernels() {
  static const RowKernels* const best = Avx2RowKernels() != nullptr ? Avx2RowKernels() : &kScalar;
  return *best;
}

}  // namespace ttf
}  // namespace tensorflow
