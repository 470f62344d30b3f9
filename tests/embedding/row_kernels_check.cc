// The vector row kernels against the scalar ones (ops/kernels/row_kernels.h), for
// tests/embedding/test_row_kernels.py:  row_kernels_check ROWS
// Encodes and decodes ROWS rows of each width 1..67 with both kernel sets, directly and through
// RowLayout (each row format with each optimizer's slots), and compares the bytes. Prints
// "avx2 ok N" (N rows compared), "no-avx2" when this CPU has none, or the first mismatch (exit 1).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "row_layout.h"

using namespace tensorflow::ttf;  // NOLINT: a test driver

namespace {
uint64_t state = 1;
uint64_t Next() { return Mix64(state++); }
double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
float Normal() { return static_cast<float>(std::sqrt(-2.0 * std::log(Uniform() + 1e-300)) * std::cos(6.283185307 * Uniform())); }

// A row of one of the shapes whose bits could part the two paths.
void RandomRow(int64_t dim, int kind, float* x) {
  const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>(Next() % 13) - 6));
  for (int64_t j = 0; j < dim; ++j) x[j] = Normal() * scale;
  const float inf = std::numeric_limits<float>::infinity();
  switch (kind) {
    case 1: for (int64_t j = 0; j < dim; ++j) x[j] = x[0]; break;                              // constant
    case 2: for (int64_t j = 0; j < dim; ++j) x[j] = (Next() & 1) ? 0.0f : -0.0f; break;       // zeros of both signs
    case 3: for (int64_t j = 0; j < dim; ++j) x[j] = (Next() & 3) ? std::fabs(x[j]) : ((Next() & 1) ? 0.0f : -0.0f); break;
    case 4: x[Next() % dim] = std::nanf(""); break;
    case 5: x[Next() % dim] = (Next() & 1) ? inf : -inf; break;
    case 6: x[Next() % dim] = 3e38f; x[Next() % dim] = -3e38f; break;                          // span overflows
    case 7: for (int64_t j = 0; j < dim; ++j) x[j] *= 1e-40f; break;                            // denormals
    case 8: x[Next() % dim] *= 1000.0f; break;                                                  // an outlier
    case 9: for (int64_t j = 0; j < dim; ++j) x[j] = -std::fabs(x[j]); x[Next() % dim] = -0.0f; break;
    default: break;
  }
}

int Fail(const char* what, int64_t dim, int64_t row) {
  std::printf("mismatch: %s, dim %lld, row %lld\n", what, static_cast<long long>(dim), static_cast<long long>(row));
  return 1;
}

// RowLayout Encode then Decode of `work` with both kernel sets: same stored bytes, same floats.
bool SameThroughLayout(RowLayout layout, const RowKernels& vec, const float* work, const RoundingDraws* draws) {
  std::vector<float> a(layout.words()), b(layout.words()), wa(layout.work_floats()), wb(layout.work_floats());
  layout.UseKernels(vec);
  layout.Encode(work, draws, a.data());
  layout.Decode(a.data(), wa.data());
  layout.UseKernels(ScalarRowKernels());
  layout.Encode(work, draws, b.data());
  layout.Decode(b.data(), wb.data());
  return std::memcmp(a.data(), b.data(), a.size() * 4) == 0 && std::memcmp(wa.data(), wb.data(), wa.size() * 4) == 0;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2000;
  const RowKernels* vec = Avx2RowKernels();
  if (vec == nullptr) {
    std::printf("no-avx2\n");
    return 0;
  }
  const RowKernels& sc = ScalarRowKernels();
  int64_t compared = 0;
  for (int64_t dim = 1; dim <= 67; ++dim) {
    std::vector<float> x(dim), da(dim), db(dim);
    std::vector<int8_t> qa(dim + 8), qb(dim + 8);
    std::vector<uint16_t> ha(dim), hb(dim);
    for (int64_t r = 0; r < rows; ++r) {
      RandomRow(dim, static_cast<int>(r % 12), x.data());
      const RoundingDraws draws = (r % 17 == 0) ? RoundingDraws::Nearest()
                                                : RoundingDraws(Next(), static_cast<int64_t>(Next()), static_cast<int64_t>(Next() % 100000));
      vec->encode_int8(x.data(), dim, draws, qa.data());
      sc.encode_int8(x.data(), dim, draws, qb.data());
      if (std::memcmp(qa.data(), qb.data(), dim + 8) != 0) return Fail("encode_int8", dim, r);
      vec->decode_int8(qa.data(), dim, da.data());
      sc.decode_int8(qa.data(), dim, db.data());
      if (std::memcmp(da.data(), db.data(), dim * 4) != 0) return Fail("decode_int8", dim, r);
      const int64_t first = static_cast<int64_t>(Next() % 4) * dim;
      vec->encode_bf16(x.data(), dim, draws, first, ha.data());
      sc.encode_bf16(x.data(), dim, draws, first, hb.data());
      if (std::memcmp(ha.data(), hb.data(), dim * 2) != 0) return Fail("encode_bf16", dim, r);
      vec->decode_bf16(ha.data(), dim, da.data());
      sc.decode_bf16(ha.data(), dim, db.data());
      if (std::memcmp(da.data(), db.data(), dim * 4) != 0) return Fail("decode_bf16", dim, r);
      if (r % 8 == 0) {  // whole rows: value and each optimizer's slots (work: value, then state)
        for (RowFormat format : {RowFormat::kInt8, RowFormat::kBf16}) {
          for (const auto& opt : {std::make_pair("adam", 2), std::make_pair("adagrad", 1), std::make_pair("ftrl", 2),
                                  std::make_pair("sgd", 0)}) {
            const RowLayout layout(format, dim, opt.first, opt.second);
            std::vector<float> work(layout.work_floats());
            for (int64_t j = 0; j < layout.work_floats(); ++j) work[j] = j < dim ? x[j] : Normal();
            if (!SameThroughLayout(layout, *vec, work.data(), &draws)) return Fail(opt.first, dim, r);
            if (!SameThroughLayout(layout, *vec, work.data(), nullptr)) return Fail("nearest layout", dim, r);
          }
        }
      }
      ++compared;
    }
  }
  std::printf("%s ok %lld\n", vec->name, static_cast<long long>(compared));
  return 0;
}
