// How a table stores a row (issue 49): the value in the table's row format (fp32, bf16 or
// row-wise int8, row_codec.h) and each optimizer slot in a slot format, side by side in the
// row store's 4-byte words. The table's code sees three fp32 forms of a row:
//   stored  the row store's words (fp32 rows: the fp32 floats themselves, so fp32 tables are
//           what they were, bit for bit)
//   work    what the update functor reads and writes: [value (dim) | each slot: dim floats, or
//           RowwiseMomentFloats(dim) for a row-wise slot: the leading dim - 1 elements' moment,
//           then the last element's own]
//   full    the export and checkpoint layout: [value | each slot: dim floats] (a row-wise
//           slot: its leading moment repeated dim - 1 times, then the last element's; read
//           back, the mean of the first dim - 1 floats and the last float)
// Formats by table rows and optimizer:
//   fp32  every slot fp32 (today's rows)
//   bf16  every slot bf16, element-wise
//   int8  adagrad: its accumulator row-wise (two fp32, RowwiseAdagradUpdate); adam: m bf16
//         element-wise, v row-wise (PartialRowwiseAdamUpdate); ftrl: both slots bf16
// The full layout is the same for every format, so a checkpoint written before the row-wise
// slot kept the last element's moment apart (one fp32 for the whole row, written dim times)
// restores as it is: both moments start from that one value.
// An update writes back with stochastic rounding drawn from (seed, key, step): the value's
// element j draws j, slot k's element j draws (k + 1) * dim + j. A new row's initial value,
// the slots' initial values and rows converted from the full layout (an import) round to
// nearest: a new row stays a pure function of (seed, key), and an import of an export of the
// same format gives back the same codes.
#ifndef TTF_OPS_KERNELS_ROW_LAYOUT_H_
#define TTF_OPS_KERNELS_ROW_LAYOUT_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compressed_updates.h"
#include "row_codec.h"
#include "row_kernels.h"

namespace tensorflow {
namespace ttf {

enum class SlotFormat : int { kFp32 = 0, kBf16 = 1, kFp32Row = 2 };

class RowLayout {
 public:
  RowLayout() = default;
  RowLayout(RowFormat format, int64_t dim, const std::string& optimizer, int64_t num_slots);

  RowFormat format() const { return format_; }
  bool fp32() const { return format_ == RowFormat::kFp32; }
  int64_t dim() const { return dim_; }
  const std::string& optimizer() const { return optimizer_; }
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  int64_t words() const { return words_; }  // 4-byte words of a stored row
  int64_t work_floats() const { return work_floats_; }
  int64_t full_floats() const { return dim_ * (1 + num_slots()); }
  bool rowwise() const { return rowwise_; }  // a slot is one float a row: the functor's row-wise form
  int64_t value_words() const { return part_offset_[1] / 4; }

  // The value (dim floats) of a stored row.
  void DecodeValue(const float* stored, float* value) const {
    const char* bytes = reinterpret_cast<const char*>(stored);
    switch (format_) {
      case RowFormat::kBf16: kernels_->decode_bf16(reinterpret_cast<const uint16_t*>(bytes), dim_, value); return;
      case RowFormat::kInt8: kernels_->decode_int8(reinterpret_cast<const int8_t*>(bytes), dim_, value); return;
      default: std::memcpy(value, stored, dim_ * sizeof(float));
    }
  }
  // stored -> work, and back: draws null rounds to nearest.
  void Decode(const float* stored, float* work) const;
  void Encode(const float* work, const RoundingDraws* draws, float* stored) const;
  // The value part alone (dim floats; the slots' words are left as they are).
  void EncodeValue(const float* value, const RoundingDraws* draws, float* stored) const;
  // work <-> full (a row-wise slot's leading moment: repeated; read back as the mean, summed in
  // double).
  void ToFull(const float* work, float* full) const;
  void FromFull(const float* full, float* work) const;
  // A value (dim floats) as a stored row would read it back after rounding to nearest: what a
  // new row's initializer value becomes (identity for fp32).
  void RoundValue(float* value) const;
  // Writes the slots' initial values (slot_init[k] in every element of slot k, rounded to
  // nearest) into a stored row whose value is set.
  void InitSlots(const std::vector<float>& slot_init, float* stored) const;
  // The layout tag a checkpoint of these rows carries (docs/checkpoints.md), e.g.
  // "rows=int8 dim=8 optimizer=adagrad slots=fp32row words=4": what decodes them without the table.
  std::string Tag() const;
  // The codecs it runs (row_kernels.h: the CPU's best unless a test picks the scalar ones).
  const RowKernels& kernels() const { return *kernels_; }
  void UseKernels(const RowKernels& kernels) { kernels_ = &kernels; }

 private:
  int64_t SlotWorkFloats(int k) const { return slots_[k] == SlotFormat::kFp32Row ? RowwiseMomentFloats(dim_) : dim_; }

  RowFormat format_ = RowFormat::kFp32;
  int64_t dim_ = 0;
  std::string optimizer_;
  std::vector<SlotFormat> slots_;
  std::vector<int64_t> part_offset_{0, 0};  // byte offset of the value, each slot, then the end
  int64_t words_ = 0, work_floats_ = 0;
  bool rowwise_ = false;
  const RowKernels* kernels_ = &BestRowKernels();
};

// The slot formats of `optimizer`'s num_slots slots in rows of `format` (see above).
std::vector<SlotFormat> SlotFormats(RowFormat format, const std::string& optimizer, int64_t num_slots);
// "fp32", "bf16" or "int8" -> the format; InvalidArgument-free: false for another name.
bool ParseRowFormat(const std::string& name, RowFormat* format);
const char* RowFormatName(RowFormat format);

// The layout a tag (RowLayout::Tag) names; false with the cause in *why when the tag cannot be
// read or names other bytes than this ttf's layout of its format, dim and optimizer.
bool LayoutOfTag(const std::string& tag, RowLayout* layout, std::string* why);

// The full layout of a stored row: `stored` itself for fp32 rows, else decoded into `scratch`.
const float* FullRow(const RowLayout& layout, const float* stored, std::vector<float>* scratch);

}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_ROW_LAYOUT_H_
