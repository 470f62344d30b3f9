// The outputs every row parser yields (TtfEncodeColumns, TtfParseExamples): rows parsed into
// full-size temporaries, then the bad rows left out. Multi-hot keys come per shard of rows
// (contiguous ranges, in any order), each shard's keys in row order with a bad row's keys
// still in it (its lengths entry says how many to skip).
#ifndef TTF_OPS_KERNELS_PARSED_ROWS_H_
#define TTF_OPS_KERNELS_PARSED_ROWS_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace ttf {

// (first row of the shard, its keys per multi-hot column).
using MultiHotPieces = std::vector<std::pair<int64_t, std::vector<std::vector<int64_t>>>>;

// Sets the outputs from `rows` parsed rows: labels [rows], dense [rows, D], ids [rows, F],
// lengths [rows, M]; problems[r] non-empty for a bad row, of which there are `dropped`.
inline Status OutputParsedRows(OpKernelContext* ctx, const Tensor& labels, const Tensor& dense, const Tensor& ids,
                               const Tensor& lengths, MultiHotPieces* pieces, const std::vector<std::string>& problems,
                               int64_t rows, int64_t dropped, int D, int F, int M) {
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
