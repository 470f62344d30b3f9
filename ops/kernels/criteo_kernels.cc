// Kernel of TtfParseCriteo (ops/criteo_ops.cc): one call parses a batch of lines, in
// parallel over lines on TensorFlow's CPU pool.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace ttf {
namespace {

constexpr int kDense = 13, kFields = 26, kColumns = 1 + kDense + kFields;
constexpr int64_t kValueBits = 56;
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

// Parses a number field ("", "12", "-1", "260.0"); false if it is not a number.
bool ParseNumber(const char* s, size_t n, double* out) {
  if (n == 0) {
    *out = 0.0;
    return true;
  }
  char buf[64];
  if (n >= sizeof(buf)) return false;
  std::memcpy(buf, s, n);
  buf[n] = '\0';
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(buf, &end);
  return end == buf + n && errno == 0 && std::isfinite(*out);
}

// Parses one line into row outputs; returns "" or the reason it is bad.
std::string ParseLine(const tstring& line, float* label, float* dense, int64_t* ids) {
  const char* p = line.data();
  size_t len = line.size();
  while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r')) --len;
  const char sep = std::memchr(p, '\t', len) != nullptr ? '\t' : ',';
  size_t start = 0;
  for (int col = 0; col < kColumns; ++col) {
    size_t end = start;
    while (end < len && p[end] != sep) ++end;
    if (end == len && col < kColumns - 1)
      return "has " + std::to_string(col + 1) + " fields, expected " + std::to_string(kColumns);
    const char* f = p + start;
    const size_t n = end - start;
    if (col == 0) {
      double v;
      if (n == 0 || !ParseNumber(f, n, &v) || (v != 0.0 && v != 1.0))
        return "label must be 0 or 1, got '" + std::string(f, n) + "'";
      *label = static_cast<float>(v);
    } else if (col <= kDense) {
      double v;
      if (!ParseNumber(f, n, &v))
        return "integer column I" + std::to_string(col) + " is not a number: '" + std::string(f, std::min<size_t>(n, 40)) + "'";
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
    OP_REQUIRES(ctx, filenames.shape() == lines.shape() && line_numbers.shape() == lines.shape(),
                errors::InvalidArgument("filenames and line_numbers must have the shape of lines ",
                                        lines.shape().DebugString(), ", got ", filenames.shape().DebugString(),
                                        " and ", line_numbers.shape().DebugString()));
    const int64_t n = lines.NumElements();
    const auto text = lines.flat<tstring>();
    std::vector<float> labels(n), dense(n * kDense);
    std::vector<int64_t> ids(n * kFields);
    std::vector<std::string> problems(n);
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, n, 5000, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        problems[i] = ParseLine(text(i), &labels[i], &dense[i * kDense], &ids[i * kFields]);
    });
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (problems[i].empty()) continue;
      OP_REQUIRES(ctx, !strict_,
                  errors::InvalidArgument(filenames.flat<tstring>()(i), ":", line_numbers.flat<int64_t>()(i),
                                          ": bad Criteo line: ", problems[i],
                                          " (read with strict=False to skip and count bad lines)"));
      ++bad;
    }
    const int64_t good = n - bad;
    Tensor *labels_out, *dense_out, *ids_out, *bad_out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({good}), &labels_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({good, kDense}), &dense_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({good, kFields}), &ids_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &bad_out));
    bad_out->scalar<int64_t>()() = bad;
    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!problems[i].empty()) continue;
      labels_out->flat<float>()(row) = labels[i];
      std::copy(&dense[i * kDense], &dense[(i + 1) * kDense], dense_out->flat<float>().data() + row * kDense);
      std::copy(&ids[i * kFields], &ids[(i + 1) * kFields], ids_out->flat<int64_t>().data() + row * kFields);
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
