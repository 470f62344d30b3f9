// What every row parser (TtfParseLines, TtfEncodeColumns, TtfParseExamples, TtfParseExampleSpans)
// shares in its kernel: the schema attrs (registered by ParsedRowsOp, ops/parsed_rows_shape.h),
// the full-size temporaries rows are parsed into, and the outputs made of them with the bad rows
// left out. Multi-hot keys come per shard of rows (contiguous ranges, in any order), each shard's
// keys in row order with a bad row's keys still in it (its lengths entry says how many to skip).
#ifndef TTF_OPS_KERNELS_PARSED_ROWS_H_
#define TTF_OPS_KERNELS_PARSED_ROWS_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "parse_values.h"

namespace tensorflow {
namespace ttf {

// The schema attrs, one entry per column in each list, checked: kinds (kSkip only where
// `skip_allowed`), value modes, each slot in range for its kind, exactly one label.
struct SchemaAttrs {
  std::vector<int> kinds, slots, value_modes;
  std::vector<bool> log1p;
  std::vector<float> defaults;
  std::vector<std::string> names;
  int num_dense = 0, num_fields = 0, num_multi_hot = 0;
  std::string schema_name;
  bool strict = true;

  Status Read(OpKernelConstruction* ctx, bool skip_allowed) {
    using namespace parse_values;  // NOLINT: the column kinds
    TF_RETURN_IF_ERROR(ctx->GetAttr("kinds", &kinds));
    TF_RETURN_IF_ERROR(ctx->GetAttr("slots", &slots));
    TF_RETURN_IF_ERROR(ctx->GetAttr("value_modes", &value_modes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("log1p", &log1p));
    TF_RETURN_IF_ERROR(ctx->GetAttr("defaults", &defaults));
    TF_RETURN_IF_ERROR(ctx->GetAttr("names", &names));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_dense", &num_dense));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_fields", &num_fields));
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_multi_hot", &num_multi_hot));
    TF_RETURN_IF_ERROR(ctx->GetAttr("schema_name", &schema_name));
    TF_RETURN_IF_ERROR(ctx->GetAttr("strict", &strict));
    const size_t n = kinds.size();
    if (n == 0) return errors::InvalidArgument("kinds must name at least one column");
    if (slots.size() != n || value_modes.size() != n || log1p.size() != n || defaults.size() != n ||
        names.size() != n) {
      return errors::InvalidArgument("kinds, slots, value_modes, log1p, defaults and names must have one entry per "
                                     "column (", n, "), got ", slots.size(), ", ", value_modes.size(), ", ",
                                     log1p.size(), ", ", defaults.size(), ", ", names.size());
    }
    int labels = 0;
    for (size_t c = 0; c < n; ++c) {
      const int kind = kinds[c], slot = slots[c];
      if (kind < (skip_allowed ? kSkip : kLabel) || kind > kHour)
        return errors::InvalidArgument("kinds[", c, "] must be in [", skip_allowed ? kSkip : kLabel, ", ", kHour,
                                       "], got ", kind);
      if (value_modes[c] < kAuto || value_modes[c] > kString)
        return errors::InvalidArgument("value_modes[", c, "] must be in [0, 2], got ", value_modes[c]);
      const int limit = kind == kDense         ? num_dense
                        : kind == kCategorical ? num_fields
                        : kind == kHour        ? num_fields - 1
                        : kind == kMultiHot    ? num_multi_hot
                                               : 1;
      if (kind != kSkip && kind != kLabel && (slot < 0 || slot >= limit))
        return errors::InvalidArgument("slots[", c, "] = ", slot, " is out of range for column '", names[c], "'");
      labels += kind == kLabel;
    }
    if (labels != 1) return errors::InvalidArgument("exactly one label column, got ", labels);
    return OkStatus();
  }
};

// The full-size temporaries `rows` rows are parsed into: labels [rows], dense [rows, D],
// ids [rows, F], multi-hot lengths [rows, M]. They become the outputs when no row is bad.
struct ParsedRowTensors {
  Tensor labels, dense, ids, lengths;

  Status Allocate(OpKernelContext* ctx, int64_t rows, int D, int F, int M) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_FLOAT, TensorShape({rows}), &labels));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_FLOAT, TensorShape({rows, D}), &dense));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT64, TensorShape({rows, F}), &ids));
    return ctx->allocate_temp(DT_INT64, TensorShape({rows, M}), &lengths);
  }
  float* label_data() { return labels.flat<float>().data(); }
  float* dense_data() { return dense.flat<float>().data(); }
  int64_t* id_data() { return ids.flat<int64_t>().data(); }
  int64_t* length_data() { return lengths.flat<int64_t>().data(); }
};

// (first row of the shard, its keys per multi-hot column).
using MultiHotPieces = std::vector<std::pair<int64_t, std::vector<std::vector<int64_t>>>>;

// Sets the outputs from `rows` parsed rows: labels [rows], dense [rows, D], ids [rows, F],
// lengths [rows, M]; problems[r] non-empty for a bad row, of which there are `dropped`.
inline Status OutputParsedRows(OpKernelContext* ctx, const ParsedRowTensors& parsed, MultiHotPieces* pieces,
                               const std::vector<std::string>& problems, int64_t rows, int64_t dropped, int D, int F,
                               int M) {
  const Tensor &labels = parsed.labels, &dense = parsed.dense, &ids = parsed.ids, &lengths = parsed.lengths;
  const int64_t* lengths_data = lengths.flat<int64_t>().data();
  std::sort(pieces->begin(), pieces->end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  OpOutputList values_out, lengths_out;
  TF_RETURN_IF_ERROR(ctx->output_list("multi_hot_values", &values_out));
  TF_RETURN_IF_ERROR(ctx->output_list("multi_hot_lengths", &lengths_out));
  for (int m = 0; m < M; ++m) {
    int64_t total = 0;
    for (int64_t r = 0; r < rows; ++r) total += problems[r].empty() ? lengths_data[r * M + m] : 0;
    Tensor *v = nullptr, *l = nullptr;
    TF_RETURN_IF_ERROR(values_out.allocate(m, TensorShape({total}), &v));
    TF_RETURN_IF_ERROR(lengths_out.allocate(m, TensorShape({rows - dropped}), &l));
    int64_t* out = v->flat<int64_t>().data();
    int64_t row = 0;
    for (size_t p = 0; p < pieces->size(); ++p) {
      const int64_t piece_end = p + 1 < pieces->size() ? (*pieces)[p + 1].first : rows;
      const int64_t* in = (*pieces)[p].second[m].data();
      for (int64_t r = (*pieces)[p].first; r < piece_end; ++r) {
        const int64_t count = lengths_data[r * M + m];
        if (problems[r].empty()) {
          out = std::copy(in, in + count, out);
          l->flat<int64_t>()(row++) = count;
        }
        in += count;
      }
    }
  }
  if (dropped == 0) {
    ctx->set_output(0, labels);
    ctx->set_output(1, dense);
    ctx->set_output(2, ids);
    return OkStatus();
  }
  const int64_t good = rows - dropped;
  Tensor *labels_out, *dense_out, *ids_out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({good}), &labels_out));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({good, D}), &dense_out));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({good, F}), &ids_out));
  const float* labels_data = labels.flat<float>().data();
  const float* dense_data = dense.flat<float>().data();
  const int64_t* ids_data = ids.flat<int64_t>().data();
  int64_t row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (!problems[r].empty()) continue;
    labels_out->flat<float>()(row) = labels_data[r];
    std::copy(&dense_data[r * D], &dense_data[(r + 1) * D], dense_out->flat<float>().data() + row * D);
    std::copy(&ids_data[r * F], &ids_data[(r + 1) * F], ids_out->flat<int64_t>().data() + row * F);
    ++row;
  }
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_PARSED_ROWS_H_
