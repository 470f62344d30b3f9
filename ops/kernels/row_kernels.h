// The row codecs of row_codec.h behind one table of functions, chosen once per process by the
// CPU it runs on (issue 49): AVX2 where the CPU has it, else the scalar code of row_codec.h.
// The op library is built for baseline x86-64 and runs on AVX2-only and AVX-512 hosts alike,
// so the vector code is compiled for its target function by function and picked at run time.
//
// Both give the same bits for every input: the vector code does the scalar code's float32
// operations, lane by lane (a multiply, then an add: no fused multiply-add, which rounds
// once instead of twice), its rounding draws are the same hash of (seed, key, step, element),
// and the rows whose bits hang on the order of a reduction (a NaN, an infinity, a constant
// row: the sign of a zero span) are encoded by the scalar code. tests/embedding/
// test_row_kernels.py checks it.
#ifndef TTF_OPS_KERNELS_ROW_KERNELS_H_
#define TTF_OPS_KERNELS_ROW_KERNELS_H_

#include <cstdint>

#include "row_codec.h"

namespace tensorflow {
namespace ttf {

struct RowKernels {
  const char* name;  // "avx2" or "scalar"
  void (*decode_int8)(const int8_t* row, int64_t dim, float* out);
  void (*encode_int8)(const float* x, int64_t dim, const RoundingDraws& draws, int8_t* out);
  void (*decode_bf16)(const uint16_t* h, int64_t dim, float* out);
  // out[j] = x[j] rounded with draws.Bits(first + j) (a slot's draws start past the value's).
  void (*encode_bf16)(const float* x, int64_t dim, const RoundingDraws& draws, int64_t first, uint16_t* out);
};

const RowKernels& ScalarRowKernels();
// The AVX2 kernels, or null when this CPU has no AVX2 (or the build targets another ISA).
const RowKernels* Avx2RowKernels();
// The fastest kernels this CPU runs (chosen once).
const RowKernels& BestRowKernels();

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_ROW_KERNELS_H_
