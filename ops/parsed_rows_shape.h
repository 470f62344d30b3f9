// What every op that yields the parser's outputs (TtfParseLines, TtfEncodeColumns,
// TtfParseExamples, TtfParseExampleSpans) registers alike: those outputs, the schema attrs, and
// their shapes: labels [N], dense [N, num_dense], ids [N, num_fields], num_multi_hot values [?]
// and lengths [N], bad rows []. N is unknown: bad rows may be skipped.
#ifndef TTF_OPS_PARSED_ROWS_SHAPE_H_
#define TTF_OPS_PARSED_ROWS_SHAPE_H_

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ttf {

// Registers `op` (its inputs, own attrs, shape function and doc) with the parser's outputs, `bad`
// naming the count of skipped rows, and the schema attrs (read by SchemaAttrs, kernels/parsed_rows.h).
//   static const InitOnStartupMarker kRegistered = ParsedRowsOp(register_op::OpDefBuilderWrapper("X")
//       .Input(...).SetShapeFn(...).Doc(...), "bad_rows");
inline InitOnStartupMarker ParsedRowsOp(register_op::OpDefBuilderWrapper& op, const char* bad) {
  op.Output("labels: float")
      .Output("dense: float")
      .Output("ids: int64")
      .Output("multi_hot_values: num_multi_hot * int64")
      .Output("multi_hot_lengths: num_multi_hot * int64")
      .Output(std::string(bad) + ": int64")
      .Attr("kinds: list(int)")
      .Attr("slots: list(int)")
      .Attr("value_modes: list(int)")
      .Attr("log1p: list(bool)")
      .Attr("defaults: list(float)")
      .Attr("names: list(string)")
      .Attr("num_dense: int >= 0")
      .Attr("num_fields: int >= 0")
      .Attr("num_multi_hot: int >= 0")
      .Attr("schema_name: string = 'custom'")
      .Attr("strict: bool = true");
  return op();
}

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
