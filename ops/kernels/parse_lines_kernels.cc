// Kernel of TtfParseLines (ops/parse_lines_ops.cc): one call parses a block of lines by a
// schema, in parallel over lines on TensorFlow's CPU pool. The Python statement of the same
// contract (the test reference) is ttf/data/_schema.py (field_key) and tests/data.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"
#include "parse_values.h"
#include "parsed_rows.h"

namespace tensorflow {
namespace ttf {
namespace {

using namespace parse_values;  // NOLINT: the shared value rules (parse_values.h)

// The position of the next `sep` at or after i, or len. CTR fields are short (Criteo's are at
// most 8 bytes), where a plain loop beats a call to memchr; long fields go to memchr.
inline size_t FindSeparator(const char* p, size_t i, size_t len, char sep) {
  const size_t short_end = std::min(len, i + 16);
  for (; i < short_end; ++i)
    if (p[i] == sep) return i;
  if (i == len) return len;
  const void* found = std::memchr(p + i, sep, len - i);
  return found != nullptr ? static_cast<const char*>(found) - p : len;
}

// One column of the schema, kept small: the per-line loop walks these.
struct Column {
  int8_t kind, value_mode;
  bool log1p;
  char separator;
  int32_t slot;
  double default_value;
};

class ParseLinesOp : public OpKernel {
 public:
  explicit ParseLinesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    SchemaAttrs a;
    OP_REQUIRES_OK(ctx, a.Read(ctx, /*skip_allowed=*/true));
    std::string separators;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("separators", &separators));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("delimiter", &delimiter_));
    num_dense_ = a.num_dense, num_fields_ = a.num_fields, num_multi_hot_ = a.num_multi_hot;
    schema_name_ = a.schema_name, strict_ = a.strict;
    const size_t n = a.kinds.size();
    OP_REQUIRES(ctx, separators.size() == n,
                errors::InvalidArgument("separators must have one entry per column (", n, "), got ",
                                        separators.size()));
    OP_REQUIRES(ctx, delimiter_.size() <= 1,
                errors::InvalidArgument("delimiter must be empty (auto) or one character, got '", delimiter_, "'"));
    OP_REQUIRES(ctx, num_fields_ + num_multi_hot_ <= 128,
                errors::InvalidArgument("at most 128 categorical fields, got ", num_fields_ + num_multi_hot_));
    for (size_t c = 0; c < n; ++c) {
      columns_.push_back({static_cast<int8_t>(a.kinds[c]), static_cast<int8_t>(a.value_modes[c]),
                          static_cast<bool>(a.log1p[c]), separators[c], a.slots[c], a.defaults[c]});
      names_.push_back(a.names[c]);
    }
    for (int c = 0; c < static_cast<int>(n); ++c) {
      if (runs_.empty() || runs_.back().kind != columns_[c].kind) runs_.push_back({columns_[c].kind, c, c});
      runs_.back().end = c + 1;
    }
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
    const int D = num_dense_, F = num_fields_, M = num_multi_hot_;
    const auto text = lines.flat<tstring>();

    // Parse straight into full-size tensors; they become the outputs unless lines were skipped.
    ParsedRowTensors parsed;
    OP_REQUIRES_OK(ctx, parsed.Allocate(ctx, n, D, F, M));
    float* labels_data = parsed.label_data();
    float* dense_data = parsed.dense_data();
    int64_t* ids_data = parsed.id_data();
    int64_t* lengths_data = parsed.length_data();
    std::vector<std::string> problems(n);  // empty (no allocation) for a good line
    // Multi-hot keys per shard of lines (shards are contiguous ranges), joined in line order below.
    std::mutex pieces_mu;
    MultiHotPieces pieces;
    const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost_per_line = 125 * static_cast<int64_t>(columns_.size());  // ~1 us for Criteo's 40 columns
    Shard(workers->num_threads, workers->workers, n, cost_per_line, [&](int64_t begin, int64_t end) {
      std::vector<std::vector<int64_t>> values(M);
      for (int64_t i = begin; i < end; ++i) {
        problems[i] = ParseLine(text(i), &labels_data[i], &dense_data[i * D], &ids_data[i * F],
                                &lengths_data[i * M], &values);
      }
      if (M > 0) {
        std::lock_guard<std::mutex> lock(pieces_mu);
        pieces.emplace_back(begin, std::move(values));
      }
    });

    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (problems[i].empty()) continue;
      const tstring& filename = filenames.dims() == 0 ? filenames.scalar<tstring>()() : filenames.flat<tstring>()(i);
      OP_REQUIRES(ctx, !strict_,
                  errors::InvalidArgument(filename, ":", line_numbers.flat<int64_t>()(i), ": bad ", schema_name_,
                                          " line: ", problems[i],
                                          " (read with strict=False to skip and count bad lines)"));
      for (int m = 0; m < M; ++m) lengths_data[i * M + m] = 0;  // ParseLine rolled its keys back
      ++bad;
    }
    Tensor* bad_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output("bad_lines", TensorShape({}), &bad_out));
    bad_out->scalar<int64_t>()() = bad;

    OP_REQUIRES_OK(ctx, OutputParsedRows(ctx, parsed, &pieces, problems, n, bad, D, F, M));
  }

 private:
  // Parses one line into its row of the outputs; returns "" or why the line is bad. On a
  // bad line the multi-hot keys it appended are removed again.
  std::string ParseLine(const tstring& line, float* label, float* dense, int64_t* ids, int64_t* lengths,
                        std::vector<std::vector<int64_t>>* values) const {
    std::vector<size_t> sizes_before;
    if (!values->empty()) {
      for (const auto& v : *values) sizes_before.push_back(v.size());
    }
    std::string problem = ParseFields(line, label, dense, ids, lengths, values);
    if (!problem.empty()) {
      for (size_t m = 0; m < sizes_before.size(); ++m) (*values)[m].resize(sizes_before[m]);
    }
    return problem;
  }

  std::string ParseFields(const tstring& line, float* label, float* dense, int64_t* ids, int64_t* lengths,
                          std::vector<std::vector<int64_t>>* values) const {
    const char* p = line.data();
    size_t len = line.size();
    while (len > 0 && (p[len - 1] == '\n' || p[len - 1] == '\r')) --len;
    // auto: a line with a tab is tab separated (Criteo's raw form), otherwise CSV.
    const char sep = !delimiter_.empty() ? delimiter_[0] : std::memchr(p, '\t', len) != nullptr ? '\t' : ',';
    const int num_columns = static_cast<int>(columns_.size());
    size_t start = 0;
    // Columns go run by run (consecutive columns of one kind), so the switch below jumps to
    // the same case many times in a row: a well-predicted branch, as in a parser written for
    // one fixed layout.
    for (const Run& run : runs_) {
      for (int col = run.begin; col < run.end; ++col) {
        const Column& column = columns_[col];
        // Fast paths for Criteo's fields (up to 8 hex digits, a plain count): read in the
        // same pass that finds the field's end. Anything else (and any problem) takes the
        // general path below, which gives the same result for these fields.
        const bool more = col < num_columns - 1;
        if (run.kind == kCategorical && column.value_mode == kAuto) {
          size_t i = start;
          uint64_t hex = 0;
          bool is_hex = true;
          for (; i < len && i - start < 9 && p[i] != sep; ++i) {
            const int d = kHexTable.value[static_cast<unsigned char>(p[i])];
            is_hex &= d >= 0;
            hex = hex * 16 + (d & 15);
          }
          if (is_hex && i - start <= 8 && (i < len ? p[i] == sep : !more)) {
            ids[column.slot] = Tag(column.slot, i == start ? kMissing : hex);
            start = i + 1;
            continue;
          }
        } else if (run.kind == kDense) {
          size_t i = start;
          int64_t count = 0;
          for (; i < len && i - start < 18 && IsDigit(p[i]); ++i) count = count * 10 + (p[i] - '0');
          if (i > start && (i < len ? p[i] == sep : !more)) {
            const double v = static_cast<double>(count);
            dense[column.slot] = static_cast<float>(column.log1p ? std::log1p(v) : v);
            start = i + 1;
            continue;
          }
        }
        const size_t end = FindSeparator(p, start, len, sep);
        if (end == len && col < num_columns - 1)
          return "has " + std::to_string(col + 1) + " columns, the schema declares " + std::to_string(num_columns);
        const char* f = p + start;
        const size_t n = end - start;
        const std::string& name = names_[col];  // only read to explain a bad line
        switch (run.kind) {
          case kLabel: {
            double v;
            if (n == 0 || !ParseNumber(f, n, &v) || (v != 0.0 && v != 1.0)) {
              if (n == name.size() && std::memcmp(f, name.data(), n) == 0)
                return "looks like a header (label column '" + name +
                       "' holds its own name), but the schema declares no header: give it header=True or 'auto'";
              return "label column " + name + " must be 0 or 1, got " + Quote(f, n);
            }
            *label = v == 1.0 ? 1.0f : 0.0f;
            break;
          }
          case kDense: {
            double v = column.default_value;
            if (n > 0 && !ParseNumber(f, n, &v))
              return "dense column " + name + " is not a number: " + Quote(f, n);
            // log(1 + x): counts are heavy tailed; negatives (Criteo has -1, -2) clip to 0.
            const float value = static_cast<float>(column.log1p ? std::log1p(std::max(v, 0.0)) : v);
            // A finite double can still overflow float32 (1e39 -> inf): a bad value, not an inf.
            if (!std::isfinite(value))
              return "dense column " + name + " overflows float32 (|value| > 3.4e38): " + Quote(f, n);
            dense[column.slot] = value;
            break;
          }
          case kCategorical: {
            uint64_t v;
            if (!CategoricalValue(column.value_mode, f, n, &v))
              return "categorical column " + name + " is not an integer in [0, 2^56 - 1): " + Quote(f, n);
            ids[column.slot] = Tag(column.slot, v);
            break;
          }
          case kHour: {
            int hour, weekday;
            if (n == 0) {
              ids[column.slot] = Tag(column.slot, kMissing);
              ids[column.slot + 1] = Tag(column.slot + 1, kMissing);
            } else if (ParseHour(f, n, &hour, &weekday)) {
              ids[column.slot] = Tag(column.slot, hour);
              ids[column.slot + 1] = Tag(column.slot + 1, weekday);
            } else {
              return "column " + name + " is not a YYMMDDHH time stamp: " + Quote(f, n);
            }
            break;
          }
          case kMultiHot: {
            std::vector<int64_t>& out = (*values)[column.slot];
            const int field = num_fields_ + column.slot;
            int64_t count = 0;
            size_t item = 0;
            while (item < n) {  // empty items ("a||b", a trailing separator) are skipped
              const char* next = static_cast<const char*>(std::memchr(f + item, column.separator, n - item));
              const size_t item_end = next != nullptr ? next - f : n;
              if (item_end > item) {
                uint64_t v;
                if (!CategoricalValue(column.value_mode, f + item, item_end - item, &v))
                  return "multi-hot column " + name + " holds a value that is not an integer in [0, 2^56 - 1): " +
                         Quote(f + item, item_end - item);
                out.push_back(Tag(field, v));
                ++count;
              }
              item = item_end + 1;
            }
            lengths[column.slot] = count;
            break;
          }
          default:
            break;  // kSkip
        }
        start = end + 1;
      }
    }
    if (start <= len) {
      int64_t columns = num_columns + 1;
      for (size_t i = start; i < len; ++i) columns += p[i] == sep;
      return "has " + std::to_string(columns) + " columns, the schema declares " + std::to_string(num_columns);
    }
    return "";
  }

  struct Run {
    int8_t kind;
    int begin, end;  // columns [begin, end)
  };
  std::vector<Column> columns_;
  std::vector<Run> runs_;
  std::vector<std::string> names_;
  std::string delimiter_, schema_name_;
  int num_dense_, num_fields_, num_multi_hot_;
  bool strict_;
};
REGISTER_KERNEL_BUILDER(Name("TtfParseLines").Device(DEVICE_CPU), ParseLinesOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
