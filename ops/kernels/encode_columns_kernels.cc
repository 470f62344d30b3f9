// Kernel of TtfEncodeColumns (ops/encode_columns_ops.cc): rows of Parquet or TFRecord
// columns -> labels, dense, ids, multi-hot keys, by the value rules of parse_values.h (the
// text parser's), in parallel over rows on TensorFlow's CPU pool.
#include <algorithm>
#include <cmath>
#include <cstdio>
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

enum Source { kInts = 0, kFloats = 1, kArrowStrings = 2, kStrings = 3, kDictionary = 4 };

// One column's inputs, as raw pointers (read by every row).
struct ColumnData {
  int8_t kind, source, value_mode;
  bool log1p;
  int32_t slot;
  double default_value;
  const uint8_t* valid;  // nullptr: all valid
  const int64_t* splits;  // nullptr: item r is row r
  const int64_t* ints;  // the values, or (kDictionary) each item's index into offsets / bytes
  const double* floats;
  const int64_t* offsets;
  const char* bytes;
  const tstring* strings;
  int64_t num_items;
  std::vector<int64_t> dictionary_keys;  // kDictionary categorical: each entry's key; -1: not a value
};

// An item's text: an integer as its decimal digits (what a text file holds), a string as its bytes.
struct Text {
  char buf[24];
  const char* data;
  size_t size;
};

inline void EntryText(const ColumnData& c, int64_t e, Text* t) {
  t->data = c.bytes + c.offsets[e];
  t->size = c.offsets[e + 1] - c.offsets[e];
}

inline void ItemText(const ColumnData& c, int64_t i, Text* t) {
  if (c.source == kInts) {
    t->size = std::snprintf(t->buf, sizeof(t->buf), "%lld", static_cast<long long>(c.ints[i]));
    t->data = t->buf;
  } else if (c.source == kArrowStrings) {
    EntryText(c, i, t);
  } else if (c.source == kDictionary) {
    EntryText(c, c.ints[i], t);
  } else {
    t->data = c.strings[i].data();
    t->size = c.strings[i].size();
  }
}

inline double ItemNumber(const ColumnData& c, int64_t i) {
  return c.source == kInts ? static_cast<double>(c.ints[i]) : c.floats[i];
}

class EncodeColumnsOp : public OpKernel {
 public:
  explicit EncodeColumnsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    SchemaAttrs a;
    OP_REQUIRES_OK(ctx, a.Read(ctx, /*skip_allowed=*/false));
    kinds_ = a.kinds, slots_ = a.slots, value_modes_ = a.value_modes, log1p_ = a.log1p, defaults_ = a.defaults;
    names_ = a.names, num_dense_ = a.num_dense, num_fields_ = a.num_fields, num_multi_hot_ = a.num_multi_hot;
    schema_name_ = a.schema_name, strict_ = a.strict;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sources", &sources_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_word", &row_word_));
    int n;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    OP_REQUIRES(ctx, static_cast<int>(kinds_.size()) == n && static_cast<int>(sources_.size()) == n,
                errors::InvalidArgument("kinds and sources must have one entry per column (", n, "), got ",
                                        kinds_.size(), " and ", sources_.size()));
    for (int c = 0; c < n; ++c) {
      OP_REQUIRES(ctx, sources_[c] >= kInts && sources_[c] <= kDictionary,
                  errors::InvalidArgument("column '", names_[c], "': source ", sources_[c], " out of range"));
      const bool numeric = kinds_[c] == kLabel || kinds_[c] == kDense;
      OP_REQUIRES(ctx, numeric ? sources_[c] <= kFloats : sources_[c] != kFloats,
                  errors::InvalidArgument("column '", names_[c], "': source ", sources_[c], " cannot hold its values"));
    }
  }

  void Compute(OpKernelContext* ctx) override;

 private:
  Status Gather(OpKernelContext* ctx, int64_t rows, std::vector<ColumnData>* columns) const;
  void EncodeColumn(const ColumnData& c, const std::string& name, int64_t begin, int64_t end, float* labels,
                    float* dense, int64_t* ids, int64_t* lengths, std::vector<int64_t>* values,
                    std::vector<std::string>* problems) const;

  std::vector<int> kinds_, sources_, slots_, value_modes_;
  std::vector<bool> log1p_;
  std::vector<float> defaults_;
  std::vector<std::string> names_;
  std::string row_word_, schema_name_;
  int num_dense_, num_fields_, num_multi_hot_;
  bool strict_;
};

// Checks every column's inputs against num_rows and takes their pointers.
Status EncodeColumnsOp::Gather(OpKernelContext* ctx, int64_t rows, std::vector<ColumnData>* columns) const {
  OpInputList valid, splits, ints, floats, offsets, bytes, strings;
  TF_RETURN_IF_ERROR(ctx->input_list("valid", &valid));
  TF_RETURN_IF_ERROR(ctx->input_list("splits", &splits));
  TF_RETURN_IF_ERROR(ctx->input_list("ints", &ints));
  TF_RETURN_IF_ERROR(ctx->input_list("floats", &floats));
  TF_RETURN_IF_ERROR(ctx->input_list("offsets", &offsets));
  TF_RETURN_IF_ERROR(ctx->input_list("bytes", &bytes));
  TF_RETURN_IF_ERROR(ctx->input_list("strings", &strings));
  for (int c = 0; c < static_cast<int>(kinds_.size()); ++c) {
    ColumnData d{};
    d.kind = kinds_[c];
    d.source = sources_[c];
    d.value_mode = value_modes_[c];
    d.log1p = log1p_[c];
    d.slot = slots_[c];
    d.default_value = defaults_[c];
    d.num_items = d.source == kInts || d.source == kDictionary ? ints[c].NumElements()
                  : d.source == kFloats ? floats[c].NumElements()
                  : d.source == kArrowStrings ? std::max<int64_t>(offsets[c].NumElements() - 1, 0)
                                              : strings[c].NumElements();
    if (splits[c].NumElements() > 0) {
      if (splits[c].NumElements() != rows + 1)
        return errors::InvalidArgument("column '", names_[c], "': splits must have num_rows + 1 = ", rows + 1,
                                       " entries, got ", splits[c].NumElements());
      d.splits = splits[c].flat<int64_t>().data();
      for (int64_t r = 0; r <= rows; ++r) {
        if (d.splits[r] < 0 || d.splits[r] > d.num_items || (r > 0 && d.splits[r] < d.splits[r - 1]))
          return errors::InvalidArgument("column '", names_[c], "': splits are not ascending in [0, ", d.num_items,
                                         "]");
      }
    } else if (d.num_items != rows) {
      return errors::InvalidArgument("column '", names_[c], "' has ", d.num_items, " values for ", rows, " rows");
    }
    if (valid[c].NumElements() > 0) {
      if (valid[c].NumElements() != d.num_items)
        return errors::InvalidArgument("column '", names_[c], "': valid must have one entry per value");
      d.valid = valid[c].flat<uint8_t>().data();
    }
    d.ints = ints[c].flat<int64_t>().data();
    d.floats = floats[c].flat<double>().data();
    d.offsets = offsets[c].flat<int64_t>().data();
    d.bytes = reinterpret_cast<const char*>(bytes[c].flat<uint8_t>().data());
    d.strings = strings[c].flat<tstring>().data();
    const int64_t entries = d.source == kDictionary ? std::max<int64_t>(offsets[c].NumElements() - 1, 0)
                            : d.source == kArrowStrings ? d.num_items : 0;
    if (d.source == kArrowStrings || d.source == kDictionary) {
      for (int64_t i = 0; i < offsets[c].NumElements(); ++i) {
        if (d.offsets[i] < 0 || d.offsets[i] > bytes[c].NumElements() || (i > 0 && d.offsets[i] < d.offsets[i - 1]))
          return errors::InvalidArgument("column '", names_[c], "': string offsets out of range");
      }
    }
    if (d.source == kDictionary) {
      for (int64_t i = 0; i < d.num_items; ++i) {
        if ((d.valid == nullptr || d.valid[i]) && (d.ints[i] < 0 || d.ints[i] >= entries))
          return errors::InvalidArgument("column '", names_[c], "': dictionary index out of range");
      }
      if (d.kind == kCategorical) {  // each distinct value's key once; rows then look it up
        d.dictionary_keys.resize(entries);
        Text t;
        for (int64_t e = 0; e < entries; ++e) {
          EntryText(d, e, &t);
          uint64_t v;
          d.dictionary_keys[e] = CategoricalValue(d.value_mode, t.data, t.size, &v) ? Tag(d.slot, v) : -1;
        }
      }
    }
    columns->push_back(std::move(d));
  }
  return OkStatus();
}

// Encodes rows [begin, end) of one column, column by column (one kind per loop: a
// well-predicted branch). A row's first problem is kept (columns go in schema order, as in text).
void EncodeColumnsOp::EncodeColumn(const ColumnData& c, const std::string& name, int64_t begin, int64_t end,
                                   float* labels, float* dense, int64_t* ids, int64_t* lengths,
                                   std::vector<int64_t>* values, std::vector<std::string>* problems) const {
  const int D = num_dense_, F = num_fields_, M = num_multi_hot_;
  auto fail = [problems](int64_t r, std::string why) {
    if ((*problems)[r].empty()) (*problems)[r] = std::move(why);
  };
  Text t;
  for (int64_t r = begin; r < end; ++r) {
    int64_t b = r, e = r + 1;
    if (c.splits != nullptr) b = c.splits[r], e = c.splits[r + 1];
    if (c.kind == kMultiHot) {
      const int field = num_fields_ + c.slot;
      int64_t count = 0;
      for (int64_t i = b; i < e; ++i) {
        if (c.valid != nullptr && !c.valid[i]) continue;  // a null item, as an empty item in text: skipped
        ItemText(c, i, &t);
        if (t.size == 0) continue;
        uint64_t v;
        if (!CategoricalValue(c.value_mode, t.data, t.size, &v)) {
          fail(r, "multi-hot column " + name + " holds a value that is not an integer in [0, 2^56 - 1): " +
                      Quote(t.data, t.size));
          break;
        }
        values->push_back(Tag(field, v));
        ++count;
      }
      lengths[r * M + c.slot] = count;
      continue;
    }
    if (e - b > 1) {
      fail(r, "column " + name + " holds " + std::to_string(e - b) + " values; a " +
                  (c.kind == kDense ? "dense" : c.kind == kLabel ? "label" : "categorical") + " column takes one");
      continue;
    }
    const bool missing = e == b || (c.valid != nullptr && !c.valid[b]);
    switch (c.kind) {
      case kLabel: {
        const double v = missing ? -1.0 : ItemNumber(c, b);
        if (missing) fail(r, "label column " + name + " is missing (null)");
        else if (v != 0.0 && v != 1.0) fail(r, "label column " + name + " must be 0 or 1, got " + std::to_string(v));
        labels[r] = v == 1.0 ? 1.0f : 0.0f;
        break;
      }
      case kDense: {
        const double v = missing ? c.default_value : ItemNumber(c, b);
        const float value = static_cast<float>(c.log1p ? std::log1p(std::max(v, 0.0)) : v);
        if (!std::isfinite(v)) fail(r, "dense column " + name + " is not a finite number: " + std::to_string(v));
        else if (!std::isfinite(value))
          fail(r, "dense column " + name + " overflows float32 (|value| > 3.4e38): " + std::to_string(v));
        dense[r * D + c.slot] = value;
        break;
      }
      case kCategorical: {
        int64_t key = Tag(c.slot, kMissing);
        if (missing) {
        } else if (c.source == kDictionary) {
          key = c.dictionary_keys[c.ints[b]];
        } else {
          ItemText(c, b, &t);
          uint64_t v;
          key = CategoricalValue(c.value_mode, t.data, t.size, &v) ? Tag(c.slot, v) : -1;
        }
        if (key < 0) {
          ItemText(c, b, &t);
          fail(r, "categorical column " + name + " is not an integer in [0, 2^56 - 1): " + Quote(t.data, t.size));
        }
        ids[r * F + c.slot] = key;
        break;
      }
      case kHour: {
        int hour = 0, weekday = 0;
        uint64_t h = kMissing, w = kMissing;
        if (!missing) {
          ItemText(c, b, &t);
          if (ParseHour(t.data, t.size, &hour, &weekday)) h = hour, w = weekday;
          else fail(r, "column " + name + " is not a YYMMDDHH time stamp: " + Quote(t.data, t.size));
        }
        ids[r * F + c.slot] = Tag(c.slot, h);
        ids[r * F + c.slot + 1] = Tag(c.slot + 1, w);
        break;
      }
      default:
        break;
    }
  }
}

void EncodeColumnsOp::Compute(OpKernelContext* ctx) {
  const std::string location(ctx->input(0).scalar<tstring>()());
  const Tensor& row_numbers = ctx->input(1);
  const int64_t n = row_numbers.NumElements();
  const std::string error(ctx->input(2).scalar<tstring>()());
  const int D = num_dense_, F = num_fields_, M = num_multi_hot_;
  OP_REQUIRES(ctx, error.empty() || !strict_,
              errors::InvalidArgument(location, ": ", error, " (read with strict=False to skip and count bad rows)"));
  std::vector<ColumnData> columns;
  std::vector<std::string> problems;
  if (error.empty()) {
    OP_REQUIRES_OK(ctx, Gather(ctx, n, &columns));
    problems.resize(n);
  }
  const int64_t rows = error.empty() ? n : 0;  // an undecodable unit: all its rows are bad
  ParsedRowTensors parsed;
  OP_REQUIRES_OK(ctx, parsed.Allocate(ctx, rows, D, F, M));
  float* labels_data = parsed.label_data();
  float* dense_data = parsed.dense_data();
  int64_t* ids_data = parsed.id_data();
  int64_t* lengths_data = parsed.length_data();
  // Multi-hot keys per shard of rows (contiguous ranges), joined in row order below without the bad rows'.
  std::mutex pieces_mu;
  MultiHotPieces pieces;
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t cost_per_row = 20 * static_cast<int64_t>(columns.size() + 1);
  Shard(workers->num_threads, workers->workers, rows, cost_per_row, [&](int64_t begin, int64_t end) {
    std::vector<std::vector<int64_t>> values(M);
    for (size_t c = 0; c < columns.size(); ++c) {
      const ColumnData& column = columns[c];
      EncodeColumn(column, names_[c], begin, end, labels_data, dense_data, ids_data, lengths_data,
                   column.kind == kMultiHot ? &values[column.slot] : nullptr, &problems);
    }
    if (M > 0) {
      std::lock_guard<std::mutex> lock(pieces_mu);
      pieces.emplace_back(begin, std::move(values));
    }
  });
  int64_t bad = error.empty() ? 0 : n;
  for (int64_t r = 0; r < rows; ++r) {
    if (problems[r].empty()) continue;
    OP_REQUIRES(ctx, !strict_,
                errors::InvalidArgument(location, ", ", row_word_, " ", row_numbers.flat<int64_t>()(r), ": bad ", schema_name_, " ",
                                        row_word_, ": ", problems[r],
                                        " (read with strict=False to skip and count bad rows)"));
    ++bad;
  }
  Tensor* bad_out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output("bad_rows", TensorShape({}), &bad_out));
  bad_out->scalar<int64_t>()() = bad;
  const int64_t dropped = bad - (n - rows);  // bad rows among the decoded ones
  OP_REQUIRES_OK(ctx, OutputParsedRows(ctx, parsed, &pieces, problems, rows, dropped, D, F, M));
}

REGISTER_KERNEL_BUILDER(Name("TtfEncodeColumns").Device(DEVICE_CPU), EncodeColumnsOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
