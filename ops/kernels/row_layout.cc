#include "row_layout.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace tensorflow {
namespace ttf {
namespace {
int64_t RoundUp4(int64_t bytes) { return (bytes + 3) / 4 * 4; }

const char* SlotFormatName(SlotFormat slot) {
  switch (slot) {
    case SlotFormat::kBf16: return "bf16";
    case SlotFormat::kFp32Row: return "fp32row";
    default: return "fp32";
  }
}

int64_t SlotBytes(SlotFormat slot, int64_t dim) {
  switch (slot) {
    case SlotFormat::kBf16: return RoundUp4(2 * dim);
    case SlotFormat::kFp32Row: return 4 * RowwiseMomentFloats(dim);
    default: return 4 * dim;
  }
}
}  // namespace

bool ParseRowFormat(const std::string& name, RowFormat* format) {
  if (name == "fp32") *format = RowFormat::kFp32;
  else if (name == "bf16") *format = RowFormat::kBf16;
  else if (name == "int8") *format = RowFormat::kInt8;
  else return false;
  return true;
}

const char* RowFormatName(RowFormat format) {
  switch (format) {
    case RowFormat::kBf16: return "bf16";
    case RowFormat::kInt8: return "int8";
    default: return "fp32";
  }
}

std::vector<SlotFormat> SlotFormats(RowFormat format, const std::string& optimizer, int64_t num_slots) {
  std::vector<SlotFormat> slots(num_slots, format == RowFormat::kFp32 ? SlotFormat::kFp32 : SlotFormat::kBf16);
  if (format == RowFormat::kInt8 && optimizer == "adagrad" && num_slots == 1) slots[0] = SlotFormat::kFp32Row;
  if (format == RowFormat::kInt8 && optimizer == "adam" && num_slots == 2) slots[1] = SlotFormat::kFp32Row;
  return slots;
}

RowLayout::RowLayout(RowFormat format, int64_t dim, const std::string& optimizer, int64_t num_slots)
    : format_(format), dim_(dim), optimizer_(optimizer), slots_(SlotFormats(format, optimizer, num_slots)) {
  part_offset_.assign(1, 0);
  part_offset_.push_back(RoundUp4(RowValueBytes(format, dim)));
  work_floats_ = dim;
  for (int k = 0; k < num_slots; ++k) {
    part_offset_.push_back(part_offset_.back() + SlotBytes(slots_[k], dim));
    work_floats_ += SlotWorkFloats(k);
    rowwise_ = rowwise_ || slots_[k] == SlotFormat::kFp32Row;
  }
  words_ = part_offset_.back() / 4;
}

void RowLayout::Decode(const float* stored, float* work) const {
  DecodeValue(stored, work);
  const char* bytes = reinterpret_cast<const char*>(stored);
  float* out = work + dim_;
  for (int k = 0; k < num_slots(); ++k) {
    const char* part = bytes + part_offset_[k + 1];
    if (slots_[k] == SlotFormat::kBf16) {
      kernels_->decode_bf16(reinterpret_cast<const uint16_t*>(part), dim_, out);
    } else {
      std::memcpy(out, part, SlotWorkFloats(k) * sizeof(float));
    }
    out += SlotWorkFloats(k);
  }
}

void RowLayout::EncodeValue(const float* value, const RoundingDraws* draws, float* stored) const {
  const RoundingDraws rounding = draws != nullptr ? *draws : RoundingDraws::Nearest();
  char* bytes = reinterpret_cast<char*>(stored);
  switch (format_) {
    case RowFormat::kBf16: kernels_->encode_bf16(value, dim_, rounding, 0, reinterpret_cast<uint16_t*>(bytes)); break;
    case RowFormat::kInt8: kernels_->encode_int8(value, dim_, rounding, reinterpret_cast<int8_t*>(bytes)); break;
    default: std::memcpy(stored, value, dim_ * sizeof(float));
  }
}

void RowLayout::Encode(const float* work, const RoundingDraws* draws, float* stored) const {
  EncodeValue(work, draws, stored);
  const RoundingDraws rounding = draws != nullptr ? *draws : RoundingDraws::Nearest();
  char* bytes = reinterpret_cast<char*>(stored);
  const float* in = work + dim_;
  for (int k = 0; k < num_slots(); ++k) {
    char* part = bytes + part_offset_[k + 1];
    if (slots_[k] == SlotFormat::kBf16) {
      // This slot's draws start at (k + 1) * dim.
      kernels_->encode_bf16(in, dim_, rounding, (k + 1) * dim_, reinterpret_cast<uint16_t*>(part));
    } else {
      std::memcpy(part, in, SlotWorkFloats(k) * sizeof(float));
    }
    in += SlotWorkFloats(k);
  }
}

void RowLayout::ToFull(const float* work, float* full) const {
  std::memcpy(full, work, dim_ * sizeof(float));
  const float* in = work + dim_;
  for (int k = 0; k < num_slots(); ++k) {
    float* out = full + (k + 1) * dim_;
    if (slots_[k] == SlotFormat::kFp32Row) {  // the leading moment, then the last element's
      std::fill(out, out + dim_ - 1, in[0]);
      out[dim_ - 1] = in[SlotWorkFloats(k) - 1];
    } else {
      std::memcpy(out, in, dim_ * sizeof(float));
    }
    in += SlotWorkFloats(k);
  }
}

void RowLayout::FromFull(const float* full, float* work) const {
  std::memcpy(work, full, dim_ * sizeof(float));
  float* out = work + dim_;
  for (int k = 0; k < num_slots(); ++k) {
    const float* in = full + (k + 1) * dim_;
    if (slots_[k] == SlotFormat::kFp32Row) {
      const int64_t leading = std::max<int64_t>(dim_ - 1, 1);  // dim 1: the one float is the last's
      double sum = 0.0;  // in double: equal floats give back that float exactly
      for (int64_t j = 0; j < leading; ++j) sum += in[j];
      out[0] = static_cast<float>(sum / static_cast<double>(leading));
      out[SlotWorkFloats(k) - 1] = in[dim_ - 1];
    } else {
      std::memcpy(out, in, dim_ * sizeof(float));
    }
    out += SlotWorkFloats(k);
  }
}

void RowLayout::RoundValue(float* value) const {
  if (fp32()) return;
  thread_local std::vector<float> stored;
  stored.resize(value_words());
  EncodeValue(value, nullptr, stored.data());
  DecodeValue(stored.data(), value);
}

void RowLayout::InitSlots(const std::vector<float>& slot_init, float* stored) const {
  char* bytes = reinterpret_cast<char*>(stored);
  for (int k = 0; k < num_slots(); ++k) {
    char* part = bytes + part_offset_[k + 1];
    const float init = slot_init[k];
    if (slots_[k] == SlotFormat::kBf16) {
      const uint16_t h = Bf16Stochastic(init, 0x8000u);  // to nearest
      std::fill_n(reinterpret_cast<uint16_t*>(part), dim_, h);
    } else {
      std::fill_n(reinterpret_cast<float*>(part), SlotWorkFloats(k), init);
    }
  }
}

std::string RowLayout::Tag() const {
  std::ostringstream tag;
  tag << "rows=" << RowFormatName(format_) << " dim=" << dim_ << " optimizer=" << optimizer_ << " slots=";
  for (int k = 0; k < num_slots(); ++k) tag << (k > 0 ? "," : "") << SlotFormatName(slots_[k]);
  tag << " words=" << words_;
  return tag.str();
}

bool LayoutOfTag(const std::string& tag, RowLayout* layout, std::string* why) {
  // Five fields key=value: the format, dim and optimizer give the layout; the slot formats and
  // words it gives must be the tag's (rows another ttf stores otherwise do not fit).
  static const char* kKeys[] = {"rows", "dim", "optimizer", "slots", "words"};
  std::istringstream in(tag);
  std::string field, value[5];
  int n = 0;
  for (; in >> field; ++n) {
    const std::string key = field.substr(0, field.find('='));
    if (n >= 5 || key != kKeys[n] || key.size() == field.size()) break;
    value[n] = field.substr(key.size() + 1);
  }
  RowFormat format;
  char* end = nullptr;
  const int64_t dim = n == 5 ? std::strtoll(value[1].c_str(), &end, 10) : 0;
  if (n != 5 || !in.eof() || !ParseRowFormat(value[0], &format) || dim < 1 || *end != '\0') {
    *why = "cannot be read (expected 'rows=<fp32|bf16|int8> dim=<n> optimizer=<name> slots=<formats> words=<n>')";
    return false;
  }
  const int64_t num_slots = value[3].empty() ? 0 : std::count(value[3].begin(), value[3].end(), ',') + 1;
  *layout = RowLayout(format, dim, value[2], num_slots);
  if (layout->Tag() != tag) {
    *why = "does not fit this ttf's rows, which store that format, dim and optimizer as '" + layout->Tag() + "'";
    return false;
  }
  return true;
}

const float* FullRow(const RowLayout& layout, const float* stored, std::vector<float>* scratch) {
  if (layout.fp32()) return stored;
  scratch->resize(layout.work_floats() + layout.full_floats());
  float* work = scratch->data();
  float* full = work + layout.work_floats();
  layout.Decode(stored, work);
  layout.ToFull(work, full);
  return full;
}

}  // namespace ttf
}  // namespace tensorflow
