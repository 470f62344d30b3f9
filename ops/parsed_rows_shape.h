// The shape function of every op that yields the parser's outputs (TtfParseLines,
// TtfEncodeColumns, TtfParseExamples): labels [N], dense [N, num_dense], ids [N, num_fields],
// num_multi_hot values [?] and lengths [N], bad rows []. N is unknown: bad rows may be skipped.
#ifndef TTF_OPS_PARSED_ROWS_SHAPE_H_
#define TTF_OPS_PARSED_ROWS_SHAPE_H_

#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

inline Status ParsedRowsShape(shape_inference::InferenceContext* c) {
  using shape_inference::InferenceContext;
  int num_dense, num_fields, num_multi_hot;
  TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
  TF_RETURN_IF_ERROR(c->GetAttr("num_fields", &num_fields));
  TF_RETURN_IF_ERROR(c->GetAttr("num_multi_hot", &num_multi_hot));
  const auto rows = InferenceContext::kUnknownDim;
  c->set_output(0, c->Vector(rows));
  c->set_output(1, c->Matrix(rows, num_dense));
  c->set_output(2, c->Matrix(rows, num_fields));
  for (int m = 0; m < num_multi_hot; ++m) {
    c->set_output(3 + m, c->Vector(InferenceContext::kUnknownDim));
    c->set_output(3 + num_multi_hot + m, c->Vector(rows));
  }
  c->set_output(3 + 2 * num_multi_hot, c->Scalar());
  return OkStatus();
}

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_PARSED_ROWS_SHAPE_H_
