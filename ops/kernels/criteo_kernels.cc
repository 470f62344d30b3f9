// Kernel of TtfParseCriteo (ops/criteo_ops.cc): one call parses a batch of lines, in
// parallel over lines on TensorFlow's CPU pool. The Python statement of the same contract
// (the test reference) is ttf/data/_criteo.py: field_key and the number grammar there.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace ttf {
namespace {

constexpr int kDense = 13, kFields = 26, kColumns = 1 + kDense + kFields;
constexpr int kValueBits = 56;
constexpr uint64_t kMissing = (uint64_t{1} << kValueBits) - 1;
constexpr uint64_t kHashBase = uint64_t{1} << 32;

uint64_t Fnv1a64(const char* s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ULL;
  return h;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// (field << 56) | v: up to 8 hex digits are their own value (Criteo's form, exact and
// collision-free, below 2^32); other strings hash above 2^32, so they never meet a hex
// value; the empty string is 2^56 - 1, one missing key per field.
int64_t CategoricalKey(int field, const char* s, size_t n) {
  uint64_t v = kMissing;
  if (n > 0) {
    uint64_t hex = 0;
    bool is_hex = n <= 8;
    for (size_t i = 0; is_hex && i < n; ++i) {
      const int d = HexDigit(s[i]);
      is_hex = d >= 0;
      hex = hex * 16 + d;
    }
    v = is_hex ? hex : kHashBase + Fnv1a64(s, n) % (kMissing - kHashBase);
  }
  return static_cast<int64_t>((static_cast<uint64_t>(field) << kValueBits) | v);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Parses a number field: "" (missing, 0) or [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? with a
// finite value ("12", "-1", "260.0", "1e3"). Plain integers of up to 18 digits (Criteo's
// form) take a fast exact path; the rest go through strtod. False if not a number.
bool ParseNumber(const char* s, size_t n, double* out) {
  *out = 0.0;
  if (n == 0) return true;
  size_t i = 0;
  const bool negative = s[0] == '-';
  if (s[0] == '-' || s[0] == '+') ++i;
  const size_t int_begin = i;
  int64_t integer = 0;
  for (; i < n && IsDigit(s[i]); ++i) {
    if (i - int_begin < 18) integer = integer * 10 + (s[i] - '0');  // past 18 digits: strtod below
  }
  const size_t int_digits = i - int_begin;
  if (i == n && int_digits > 0 && int_digits <= 18) {
    *out = static_cast<double>(negative ? -integer : integer);
    return true;
  }
  size_t frac_digits = 0;
  if (i < n && s[i] == '.') {
    ++i;
    while (i < n && IsDigit(s[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exp_digits = 0;
    while (i < n && IsDigit(s[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  if (i != n) return false;
  // Validated above, so strtod reads exactly these n characters (no locale, hex or inf forms).
  char buf[128];
  if (n >= sizeof(buf)) return false;
  std::memcpy(buf, s, n);
  buf[n] = '\0';
  *out = std::strtod(buf, nullptr);
  return std::isfinite(*out);
}

// Parses one line into its row of the outputs; returns "" or why the line is bad.
std::string ParseLine(const tstring& line, float* label, float* dense, int64_t* ids) {
  const char* p = line.data();
  size_t len = line.size();
  while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r')) --len;
  // The raw Kaggle form is tab separated; a line without a tab is read as CSV.
  const char sep = std::memchr(p, '\t', len) != nullptr ? '\t' : ',';
  size_t start = 0;
  for (int col = 0; col < kColumns; ++col) {
    const char* found = static_cast<const char*>(std::memchr(p + start, sep, len - start));
    const size_t end = found != nullptr ? found - p : len;
    if (found == nullptr && col < kColumns - 1)
      return "has " + std::to_string(col + 1) + " fields, expected " + std::to_string(kColumns);
    const char* f = p + start;
    const size_t n = end - start;
    if (col == 0) {
      double v;
      if (n == 0 || !ParseNumber(f, n, &v) || (v != 0.0 && v != 1.0))
        return "label must be 0 or 1, got '" + std::string(f, std::min<size_t>(n, 40)) + "'";
      *label = v == 1.0 ? 1.0f : 0.0f;
    } else if (col <= kDense) {
      double v;
      if (!ParseNumber(f, n, &v))
        return "integer column I" + std::to_string(col) + " is not a number: '" +
               std::string(f, std::min<size_t>(n, 40)) + "'";
      // log(1 + x): Criteo's counts are heavy tailed; negatives (-1, -2 occur) clip to 0.
      dense[col - 1] = static_cast<float>(std::log1p(std::max(v, 0.0)));
    } else {
      ids[col - 1 - kDense] = CategoricalKey(col - 1 - kDense, f, n);
    }
    start = end + 1;
  }
  if (start <= len) return "has more than " + std::to_string(kColumns) + " fields";
  return "";
}

class ParseCriteoOp : public OpKernel {
 public:
  explicit ParseCriteoOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("strict", &strict_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& lines = ctx->input(0);
    const Tensor& filenames = ctx->input(1);
    const Tensor& line_numbers = ctx->input(2);
    OP_REQUIRES(ctx, lines.dims() == 1,
                errors::InvalidArgument("lines must be rank 1, got shape ", lines.shape().DebugString()));
    OP_REQUIRES(ctx, filenames.dims() == 0 || filenames.shape() == lines.shape(),
                errors::InvalidArgument("filenames must be a scalar or have the shape of lines ",
                                        lines.shape().DebugString(), ", got shape ",
                                        filenames.shape().DebugString()));
    OP_REQUIRES(ctx, line_numbers.shape() == lines.shape(),
                errors::InvalidArgument("line_numbers must have the shape of lines ", lines.shape().DebugString(),
                                        ", got shape ", line_numbers.shape().DebugString()));
    const int64_t n = lines.NumElements();
    const auto text = lines.flat<tstring>();

    // Parse straight into full-size tensors; they become the outputs unless lines were skipped.
    Tensor labels, dense, ids;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({n}), &labels));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({n, kDense}), &dense));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({n, kFields}), &ids));
    float* labels_data = labels.flat<float>().data();
    float* dense_data = dense.flat<float>().data();
    int64_t* ids_data = ids.flat<int64_t>().data();
    std::vector<std::string> problems(n);  // empty (no allocation) for a good line
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost_per_line = 5000;  // ~1 us: 40 fields, 13 log1p
    Shard(workers->num_threads, workers->workers, n, cost_per_line, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        problems[i] = ParseLine(text(i), &labels_data[i], &dense_data[i * kDense], &ids_data[i * kFields]);
    });

    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (problems[i].empty()) continue;
      const tstring& filename = filenames.dims() == 0 ? filenames.scalar<tstring>()() : filenames.flat<tstring>()(i);
      OP_REQUIRES(ctx, !strict_,
                  errors::InvalidArgument(filename, ":", line_numbers.flat<int64_t>()(i), ": bad Criteo line: ",
                                          problems[i], " (read with strict=False to skip and count bad lines)"));
      ++bad;
    }
    Tensor* bad_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &bad_out));
    bad_out->scalar<int64_t>()() = bad;
    if (bad == 0) {
      ctx->set_output(0, labels);
      ctx->set_output(1, dense);
      ctx->set_output(2, ids);
      return;
    }
    const int64_t good = n - bad;
    Tensor *labels_out, *dense_out, *ids_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({good}), &labels_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({good, kDense}), &dense_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({good, kFields}), &ids_out));
    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!problems[i].empty()) continue;
      labels_out->flat<float>()(row) = labels_data[i];
      std::copy(&dense_data[i * kDense], &dense_data[(i + 1) * kDense], dense_out->flat<float>().data() + row * kDense);
      std::copy(&ids_data[i * kFields], &ids_data[(i + 1) * kFields], ids_out->flat<int64_t>().data() + row * kFields);
      ++row;
    }
  }

 private:
  bool strict_;
};
REGISTER_KERNEL_BUILDER(Name("TtfParseCriteo").Device(DEVICE_CPU), ParseCriteoOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
