// Kernels of TtfParseExamples and TtfParseExampleSpans (ops/parse_examples_ops.cc): serialized
// tf.train.Example records (strings, or spans of one block read by TtfReadRecords) -> labels, dense, ids, multi-hot keys, by the value rules of parse_values.h (the text
// parser's). The protobuf wire format is read in place, every read bounds-checked, and each
// categorical value hashed where it lies: no string tensor, no protobuf object, no copy.
//
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }   // entries: { string key = 1; Feature value = 2; }
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1; }  (packed or not)
//   Int64List { repeated int64 value = 1; }
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"
#include "parse_values.h"
#include "parsed_rows.h"

namespace tensorflow {
namespace ttf {
namespace {

using namespace parse_values;  // NOLINT: the shared value rules (parse_values.h)

enum ListKind { kNoList = 0, kBytesList = 1, kFloatList = 2, kInt64List = 3 };
const char* const kListNames[] = {"no list", "bytes_list", "float_list", "int64_list"};

// ---- the wire format: every read checks the end of its span

inline bool ReadVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  if (*p < end && **p < 0x80) {  // one byte: nearly every tag and length of a record
    *v = *(*p)++;
    return true;
  }
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    const uint8_t b = *(*p)++;
    result |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = result;
      return true;
    }
  }
  return false;
}

// A length-delimited field's bytes [*begin, *end).
inline bool ReadSpan(const uint8_t** p, const uint8_t* end, const uint8_t** span_begin, const uint8_t** span_end) {
  uint64_t n;
  if (!ReadVarint(p, end, &n) || n > static_cast<uint64_t>(end - *p)) return false;
  *span_begin = *p;
  *p += n;
  *span_end = *p;
  return true;
}

inline bool SkipField(const uint8_t** p, const uint8_t* end, int wire_type) {
  uint64_t v;
  const uint8_t *b, *e;
  switch (wire_type) {
    case 0: return ReadVarint(p, end, &v);
    case 1: if (end - *p < 8) return false; *p += 8; return true;
    case 2: return ReadSpan(p, end, &b, &e);
    case 5: if (end - *p < 4) return false; *p += 4; return true;
    default: return false;  // groups (3, 4) and unknown wire types are not in a tf.train.Example
  }
}

// One value of a feature's list.
struct Value {
  int kind;  // ListKind
  int64_t integer;
  float number;
  const char* bytes;
  size_t size;
};

// Calls visit(value) for each value of a list of `kind` held in [p, end); false if malformed.
template <typename Visit>
bool VisitList(int kind, const uint8_t* p, const uint8_t* end, Visit&& visit) {
  Value v{kind, 0, 0.0f, nullptr, 0};
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(&p, end, &tag)) return false;
    const int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field != 1) {
      if (!SkipField(&p, end, wire)) return false;
      continue;
    }
    const uint8_t *b, *e;
    if (kind == kBytesList && wire == 2) {
      if (!ReadSpan(&p, end, &b, &e)) return false;
      v.bytes = reinterpret_cast<const char*>(b);
      v.size = e - b;
      visit(v);
    } else if (kind == kFloatList && wire == 5) {
      if (end - p < 4) return false;
      std::memcpy(&v.number, p, 4);
      p += 4;
      visit(v);
    } else if (kind == kFloatList && wire == 2) {  // packed
      if (!ReadSpan(&p, end, &b, &e) || (e - b) % 4 != 0) return false;
      for (; b < e; b += 4) {
        std::memcpy(&v.number, b, 4);
        visit(v);
      }
    } else if (kind == kInt64List && wire == 0) {
      uint64_t x;
      if (!ReadVarint(&p, end, &x)) return false;
      v.integer = static_cast<int64_t>(x);
      visit(v);
    } else if (kind == kInt64List && wire == 2) {  // packed
      if (!ReadSpan(&p, end, &b, &e)) return false;
      while (b < e) {
        uint64_t x;
        if (!ReadVarint(&b, e, &x)) return false;
        v.integer = static_cast<int64_t>(x);
        visit(v);
      }
    } else if (!SkipField(&p, end, wire)) {
      return false;
    }
  }
  return true;
}

// The list of a Feature message in [p, end): its kind (kNoList: none set) and bytes; false if malformed.
inline bool FeatureList(const uint8_t* p, const uint8_t* end, int* kind, const uint8_t** b, const uint8_t** e) {
  *kind = kNoList;
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(&p, end, &tag)) return false;
    const int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field >= kBytesList && field <= kInt64List && wire == 2) {
      if (!ReadSpan(&p, end, b, e)) return false;
      *kind = field;  // a oneof: the last one set wins
    } else if (!SkipField(&p, end, wire)) {
      return false;
    }
  }
  return true;
}

// The decimal text of an integer (what a text file holds for it).
inline size_t IntegerText(int64_t v, char* out) {
  char digits[24];
  size_t n = 0;
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  do {
    digits[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  size_t size = 0;
  if (v < 0) out[size++] = '-';
  while (n > 0) out[size++] = digits[--n];
  return size;
}

// A value's text: bytes as they are, an integer as its decimal digits (in buf).
inline absl::string_view ValueText(const Value& v, char* buf) {
  if (v.kind == kBytesList) return absl::string_view(v.bytes, v.size);
  return absl::string_view(buf, IntegerText(v.integer, buf));
}

inline double ValueNumber(const Value& v) {
  return v.kind == kInt64List ? static_cast<double>(v.integer) : static_cast<double>(v.number);
}

// Sets why a record is bad; false, for `return Fail(problem, ...)`.
inline bool Fail(std::string* problem, std::string why) {
  *problem = std::move(why);
  return false;
}

// The schema's columns by feature name: open addressing on the name's first 8 bytes (one word,
// little-endian as x86 and ARM hosts are) and its length, so a lookup is a multiply and a compare
// (a memcmp only for names past 8 bytes). Writers order a record's features as they like (Python's
// protobuf: a map's hash order, different in each record), so no guess from the last record.
class NameTable {
 public:
  // Adds `names`; the index of the first name given twice, or -1.
  int Build(const std::vector<std::string>& names) {
    size_t size = 16;
    while (size < 4 * names.size()) size *= 2;
    slots_.assign(size, Slot{0, 0, -1});
    shift_ = 64 - __builtin_ctzll(size);
    names_ = &names;
    for (size_t c = 0; c < names.size(); ++c) {
      const std::string& name = names[c];
      if (Find(name.data(), name.size(), name.size()) >= 0) return static_cast<int>(c);
      const uint64_t head = Head(name.data(), name.size(), name.size());
      size_t i = Hash(head, name.size());
      while (slots_[i].column >= 0) i = (i + 1) & (size - 1);
      slots_[i] = Slot{head, name.size(), static_cast<int>(c)};
    }
    return -1;
  }

  // The column named s[0:n), or -1; s[0:readable) may be read (readable >= n).
  int Find(const char* s, size_t n, size_t readable) const {
    const uint64_t head = Head(s, n, readable);
    for (size_t i = Hash(head, n);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& slot = slots_[i];
      if (slot.column < 0) return -1;
      if (slot.head == head && slot.size == n &&
          (n <= 8 || std::memcmp((*names_)[slot.column].data() + 8, s + 8, n - 8) == 0))
        return slot.column;
    }
  }

 private:
  struct Slot {
    uint64_t head, size;
    int column;  // -1: empty
  };

  static uint64_t Head(const char* s, size_t n, size_t readable) {
    uint64_t word = 0;
    if (readable >= 8) {  // one load, the bytes past the name masked off
      std::memcpy(&word, s, 8);
      if (n < 8) word &= (uint64_t{1} << (8 * n)) - 1;
    } else {
      std::memcpy(&word, s, n);
    }
    return word;
  }
  size_t Hash(uint64_t head, size_t n) const {
    return ((head ^ (uint64_t{n} << 56)) * 0x9e3779b97f4a7c15ULL) >> shift_;
  }

  std::vector<Slot> slots_;
  int shift_ = 60;
  const std::vector<std::string>* names_ = nullptr;
};

// log1p of the small integers that counts mostly are, computed once (DenseValue).
constexpr int kLog1pTable = 1024;

struct Column {
  int8_t kind, value_mode;
  bool log1p;
  int32_t slot;
  float missing_dense;  // a dense column's value when absent: its default, transformed
  std::string name;
};

// Where one record's row goes.
struct Row {
  float* label;
  float* dense;
  int64_t* ids;
  int64_t* lengths;
  std::vector<std::vector<int64_t>>* values;  // per multi-hot column, the shard's keys
  const size_t* values_before;                // their sizes when this row began
};

// The parser of both ops; Records: the i-th record's bytes as an absl::string_view.
class ParseExamplesOp : public OpKernel {
 public:
  explicit ParseExamplesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    SchemaAttrs a;
    OP_REQUIRES_OK(ctx, a.Read(ctx, /*skip_allowed=*/false));
    num_dense_ = a.num_dense, num_fields_ = a.num_fields, num_multi_hot_ = a.num_multi_hot;
    schema_name_ = a.schema_name, strict_ = a.strict;
    for (int i = 0; i < kLog1pTable; ++i) log1p_[i] = static_cast<float>(std::log1p(std::max<double>(i, 0.0)));
    // A row before its record is read: every column missing, each dense one its default.
    missing_dense_.assign(num_dense_, 0.0f);
    for (int f = 0; f < num_fields_; ++f) missing_ids_.push_back(Tag(f, kMissing));
    columns_.reserve(a.kinds.size());
    for (size_t c = 0; c < a.kinds.size(); ++c) {
      const double d = a.defaults[c];
      columns_.push_back({static_cast<int8_t>(a.kinds[c]), static_cast<int8_t>(a.value_modes[c]),
                          static_cast<bool>(a.log1p[c]), a.slots[c],
                          static_cast<float>(a.log1p[c] ? std::log1p(std::max(d, 0.0)) : d), a.names[c]});
      if (a.kinds[c] == kDense) missing_dense_[a.slots[c]] = columns_.back().missing_dense;
      if (a.kinds[c] == kLabel) label_ = static_cast<int>(c);
    }
    names_list_ = a.names;  // names_ reads the list it was built from
    const int twice = names_.Build(names_list_);
    OP_REQUIRES(ctx, twice < 0, errors::InvalidArgument("column '", names_list_[twice], "' is named twice"));
  }

 protected:
  // Parses n records (records(i): the bytes of record i), numbered `numbers` in `location`.
  template <typename Records>
  void Parse(OpKernelContext* ctx, int64_t n, const Records& records, const Tensor& location,
             const Tensor& numbers) const;

 private:
  bool ParseRecord(absl::string_view record, const Row& row, std::string* problem) const;
  bool ParseFeatures(const uint8_t* p, const uint8_t* end, const Row& row, std::string* problem) const;
  bool TakeOne(const Column& c, const uint8_t* b, const uint8_t* e, const Row& row) const;
  bool TakeFeature(const Column& column, int kind, const uint8_t* b, const uint8_t* e, const Row& row,
                   std::string* problem) const;

  // A dense column's value: log1p(max(v, 0)) or v, as a float.
  float DenseValue(const Column& c, double v) const {
    if (!c.log1p) return static_cast<float>(v);
    if (v > 0.0 && v < kLog1pTable && static_cast<int>(v) == v) return log1p_[static_cast<int>(v)];
    return static_cast<float>(std::log1p(std::max(v, 0.0)));
  }

  std::vector<Column> columns_;
  std::vector<std::string> names_list_;
  NameTable names_;
  std::vector<float> missing_dense_;
  std::vector<int64_t> missing_ids_;
  float log1p_[kLog1pTable];
  int label_ = 0;
  std::string schema_name_;
  int num_dense_, num_fields_, num_multi_hot_;
  bool strict_;
};

// One record into its row; false (and why in *problem) if it is bad.
bool ParseExamplesOp::ParseRecord(absl::string_view record, const Row& row, std::string* problem) const {
  std::copy(missing_dense_.begin(), missing_dense_.end(), row.dense);  // missing until its feature is found
  std::copy(missing_ids_.begin(), missing_ids_.end(), row.ids);
  std::fill(row.lengths, row.lengths + num_multi_hot_, 0);
  *row.label = -1.0f;  // not yet seen
  const uint8_t* p = reinterpret_cast<const uint8_t*>(record.data());
  const uint8_t* end = p + record.size();
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(&p, end, &tag)) return Fail(problem, "is not a tf.train.Example (its bytes end inside a field): a corrupt record");
    const int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    const uint8_t *b, *e;
    if (field == 1 && wire == 2) {
      if (!ReadSpan(&p, end, &b, &e))
        return Fail(problem, "is not a tf.train.Example (its features end past the record): a corrupt record");
      if (!ParseFeatures(b, e, row, problem)) return false;
    } else if (!SkipField(&p, end, wire)) {
      return Fail(problem, "is not a tf.train.Example (a field of wire type " + std::to_string(wire) + "): a corrupt record");
    }
  }
  if (*row.label < 0.0f) return Fail(problem, "label feature '" + columns_[label_].name + "' is absent or empty");
  return true;
}

// The entries of a Features message: each feature the schema reads taken into the row.
bool ParseExamplesOp::ParseFeatures(const uint8_t* p, const uint8_t* end, const Row& row,
                                    std::string* problem) const {
  static const char kCorrupt[] = "is not a tf.train.Example (a feature entry ends past its message): a corrupt record";
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(&p, end, &tag)) return Fail(problem, kCorrupt);
    const int field = static_cast<int>(tag >> 3), wire = static_cast<int>(tag & 7);
    if (field != 1 || wire != 2) {
      if (!SkipField(&p, end, wire)) return Fail(problem, kCorrupt);
      continue;
    }
    const uint8_t *entry, *entry_end;
    if (!ReadSpan(&p, end, &entry, &entry_end)) return Fail(problem, kCorrupt);
    absl::string_view key(reinterpret_cast<const char*>(entry), 0);  // no key field: the empty name
    const uint8_t *value = nullptr, *value_end = nullptr;
    while (entry < entry_end) {  // map entry { key = 1; value = 2; }, either order
      if (!ReadVarint(&entry, entry_end, &tag)) return Fail(problem, kCorrupt);
      const int f = static_cast<int>(tag >> 3), w = static_cast<int>(tag & 7);
      const uint8_t *b, *e;
      if ((f == 1 || f == 2) && w == 2) {
        if (!ReadSpan(&entry, entry_end, &b, &e)) return Fail(problem, kCorrupt);
        if (f == 1) key = absl::string_view(reinterpret_cast<const char*>(b), e - b);
        else value = b, value_end = e;
      } else if (!SkipField(&entry, entry_end, w)) {
        return Fail(problem, kCorrupt);
      }
    }
    const int column = names_.Find(key.data(), key.size(), reinterpret_cast<const char*>(end) - key.data());
    if (column < 0) continue;  // a feature the schema does not read
    if (value != nullptr && TakeOne(columns_[column], value, value_end, row)) continue;
    int kind = kNoList;
    const uint8_t *b = nullptr, *e = nullptr;
    if (value != nullptr && !FeatureList(value, value_end, &kind, &b, &e))
      return Fail(problem, "feature '" + columns_[column].name + "' is not a tf.train.Feature: a corrupt record");
    if (!TakeFeature(columns_[column], kind, b, e, row, problem)) return false;
  }
  return true;
}

// The commonest form of a feature, its column's one value in a bytes list, a packed float list or
// a packed int64 list (what TensorFlow's writers give a list of one), taken without TakeFeature's
// visits: the same result. False, the row untouched, for any other form and for a bad value:
// TakeFeature takes the feature then, or names its problem.
bool ParseExamplesOp::TakeOne(const Column& c, const uint8_t* b, const uint8_t* e, const Row& row) const {
  // Feature { list (field 1..3, length size - 2) { value or packed values (field 1, length size - 4) } }
  const ptrdiff_t size = e - b;
  if (size < 4 || size > 129 || (b[0] & 7) != 2 || b[1] != size - 2 || b[2] != 0x0a || b[3] != size - 4)
    return false;
  const int list = b[0] >> 3;
  const uint8_t* v = b + 4;
  if (list == kBytesList) {
    uint64_t x;
    if (c.kind != kCategorical || !CategoricalValue(c.value_mode, reinterpret_cast<const char*>(v), size - 4, &x))
      return false;
    row.ids[c.slot] = Tag(c.slot, x);
    return true;
  }
  double number;
  int64_t integer = 0;
  if (list == kFloatList && size == 8) {
    float f;
    std::memcpy(&f, v, 4);
    number = f;
  } else if (list == kInt64List) {
    uint64_t x;
    if (!ReadVarint(&v, e, &x) || v != e) return false;
    integer = static_cast<int64_t>(x);
    number = static_cast<double>(integer);
  } else {
    return false;
  }
  switch (c.kind) {
    case kLabel:
      if (number != 0.0 && number != 1.0) return false;
      *row.label = static_cast<float>(number);
      return true;
    case kDense:
      if (!std::isfinite(number)) return false;
      row.dense[c.slot] = DenseValue(c, number);
      return true;
    case kCategorical: {  // an integer: its decimal text's key (an int column's: the integer itself)
      uint64_t x;
      char buf[24];
      if (list != kInt64List || !CategoricalValue(c.value_mode, buf, IntegerText(integer, buf), &x)) return false;
      row.ids[c.slot] = Tag(c.slot, x);
      return true;
    }
    default:
      return false;
  }
}

// One feature's list into the row (a later entry of the same feature replaces an earlier one).
bool ParseExamplesOp::TakeFeature(const Column& c, int kind, const uint8_t* b, const uint8_t* e, const Row& row,
                                  std::string* problem) const {
  const bool numeric = c.kind == kLabel || c.kind == kDense;
  const bool wrong_type = kind == (numeric ? kBytesList : kFloatList);
  const std::string& name = c.name;
  char buf[24];
  bool ok = true;
  int64_t count = 0;
  Value first{kNoList, 0, 0.0f, nullptr, 0};
  if (c.kind == kMultiHot) {
    std::vector<int64_t>& out = (*row.values)[c.slot];
    out.resize(row.values_before[c.slot]);  // a repeated feature: its last entry wins
    const int field = num_fields_ + c.slot;
    if (kind != kNoList && !wrong_type) {
      ok = VisitList(kind, b, e, [&](const Value& v) {
        uint64_t x;
        const absl::string_view text = ValueText(v, buf);
        if (count >= 0 && CategoricalValue(c.value_mode, text.data(), text.size(), &x)) {
          out.push_back(Tag(field, x));
          ++count;
        } else if (count >= 0) {
          first = v;
          count = -1;  // a bad value: reported below
        }
      });
    }
    if (count < 0)
      return Fail(problem, "multi-hot feature '" + name + "' holds a value that is not an integer in [0, 2^56 - 1): " +
             Quote(ValueText(first, buf).data(), ValueText(first, buf).size()));
    row.lengths[c.slot] = count;
  } else if (kind != kNoList && !wrong_type) {
    ok = VisitList(kind, b, e, [&](const Value& v) {
      if (count++ == 0) first = v;
    });
  }
  if (!ok) return Fail(problem, "feature '" + name + "' is not a well-formed " + kListNames[kind] + ": a corrupt record");
  if (wrong_type) {
    int64_t items = 0;
    if (!VisitList(kind, b, e, [&](const Value&) { ++items; }))
      return Fail(problem, "feature '" + name + "' is not a well-formed " + kListNames[kind] + ": a corrupt record");
    if (items == 0) return true;  // an empty list of any type is missing
    return Fail(problem, "feature '" + name + "' is a " + kListNames[kind] + "; a " +
           (c.kind == kLabel ? "label" : c.kind == kDense ? "dense" : c.kind == kHour ? "hour" : "categorical") +
           " column takes " + (numeric ? "an int64_list or float_list" : "an int64_list or bytes_list"));
  }
  if (c.kind == kMultiHot) return true;
  if (count > 1)
    return Fail(problem, "feature '" + name + "' holds " + std::to_string(count) + " values; a " +
           (c.kind == kDense ? "dense" : c.kind == kLabel ? "label" : c.kind == kHour ? "hour" : "categorical") +
           " column takes one");
  switch (c.kind) {
    case kLabel: {
      if (count == 0) {
        *row.label = -1.0f;
        break;
      }
      const double v = ValueNumber(first);
      if (v != 0.0 && v != 1.0) return Fail(problem, "label feature '" + name + "' must be 0 or 1, got " + std::to_string(v));
      *row.label = static_cast<float>(v);
      break;
    }
    case kDense: {
      if (count == 0) {
        row.dense[c.slot] = c.missing_dense;
        break;
      }
      const double v = ValueNumber(first);
      const float value = DenseValue(c, v);
      if (!std::isfinite(v)) return Fail(problem, "dense feature '" + name + "' is not a finite number: " + std::to_string(v));
      row.dense[c.slot] = value;
      break;
    }
    case kCategorical: {
      uint64_t x = kMissing;
      if (count == 1) {
        const absl::string_view text = ValueText(first, buf);
        if (!CategoricalValue(c.value_mode, text.data(), text.size(), &x))
          return Fail(problem, "categorical feature '" + name + "' is not an integer in [0, 2^56 - 1): " +
                 Quote(text.data(), text.size()));
      }
      row.ids[c.slot] = Tag(c.slot, x);
      break;
    }
    case kHour: {
      uint64_t h = kMissing, w = kMissing;
      if (count == 1) {
        int hour = 0, weekday = 0;
        const absl::string_view text = ValueText(first, buf);
        if (!ParseHour(text.data(), text.size(), &hour, &weekday))
          return Fail(problem, "feature '" + name + "' is not a YYMMDDHH time stamp: " + Quote(text.data(), text.size()));
        h = hour, w = weekday;
      }
      row.ids[c.slot] = Tag(c.slot, h);
      row.ids[c.slot + 1] = Tag(c.slot + 1, w);
      break;
    }
    default:
      break;
  }
  return true;
}

template <typename Records>
void ParseExamplesOp::Parse(OpKernelContext* ctx, int64_t n, const Records& records, const Tensor& location,
                            const Tensor& numbers) const {
  const int D = num_dense_, F = num_fields_, M = num_multi_hot_;
  ParsedRowTensors parsed;
  OP_REQUIRES_OK(ctx, parsed.Allocate(ctx, n, D, F, M));
  float* labels_data = parsed.label_data();
  float* dense_data = parsed.dense_data();
  int64_t* ids_data = parsed.id_data();
  int64_t* lengths_data = parsed.length_data();
  std::vector<std::string> problems(n);
  std::mutex pieces_mu;
  MultiHotPieces pieces;
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t cost_per_record = 60 * static_cast<int64_t>(columns_.size());
  Shard(workers->num_threads, workers->workers, n, cost_per_record, [&](int64_t begin, int64_t end) {
    std::vector<std::vector<int64_t>> values(M);
    std::vector<size_t> before(M);
    for (int64_t i = begin; i < end; ++i) {
      for (int m = 0; m < M; ++m) before[m] = values[m].size();
      const Row row{&labels_data[i], &dense_data[i * D], &ids_data[i * F], &lengths_data[i * M], &values,
                    before.data()};
      if (!ParseRecord(records(i), row, &problems[i])) {  // its keys stay in the shard's list; its lengths say how many
        for (int m = 0; m < M; ++m) lengths_data[i * M + m] = static_cast<int64_t>(values[m].size() - before[m]);
      }
    }
    if (M > 0) {
      std::lock_guard<std::mutex> lock(pieces_mu);
      pieces.emplace_back(begin, std::move(values));
    }
  });
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (problems[i].empty()) continue;
    OP_REQUIRES(ctx, !strict_,
                errors::InvalidArgument(location.scalar<tstring>()(), ", record ", numbers.flat<int64_t>()(i),
                                        ": bad ", schema_name_, " record: ", problems[i],
                                        " (read with strict=False to skip and count bad records)"));
    ++bad;
  }
  Tensor* bad_out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output("bad_records", TensorShape({}), &bad_out));
  bad_out->scalar<int64_t>()() = bad;
  OP_REQUIRES_OK(ctx, OutputParsedRows(ctx, parsed, &pieces, problems, n, bad, D, F, M));
}

// TtfParseExamples: records [N], a string each.
class ParseExampleStringsOp : public ParseExamplesOp {
 public:
  using ParseExamplesOp::ParseExamplesOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& records = ctx->input(0);
    const Tensor& location = ctx->input(1);
    const Tensor& numbers = ctx->input(2);
    OP_REQUIRES(ctx, records.dims() == 1,
                errors::InvalidArgument("records must be rank 1, got shape ", records.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(location.shape()),
                errors::InvalidArgument("location must be a scalar, got shape ", location.shape().DebugString()));
    OP_REQUIRES(ctx, numbers.shape() == records.shape(),
                errors::InvalidArgument("record_numbers must have the shape of records ",
                                        records.shape().DebugString(), ", got ", numbers.shape().DebugString()));
    const auto text = records.flat<tstring>();
    Parse(ctx, records.NumElements(), [&text](int64_t i) { return absl::string_view(text(i)); }, location,
          numbers);
  }
};

// TtfParseExampleSpans: record i is data[starts[i]:ends[i]] (TtfReadRecords' block, read in place).
class ParseExampleSpansOp : public ParseExamplesOp {
 public:
  using ParseExamplesOp::ParseExamplesOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& data = ctx->input(0);
    const Tensor& starts = ctx->input(1);
    const Tensor& ends = ctx->input(2);
    const Tensor& location = ctx->input(3);
    const Tensor& numbers = ctx->input(4);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(data.shape()),
                errors::InvalidArgument("data must be a scalar, got shape ", data.shape().DebugString()));
    OP_REQUIRES(ctx, starts.dims() == 1 && ends.shape() == starts.shape() && numbers.shape() == starts.shape(),
                errors::InvalidArgument("starts, ends and record_numbers must be vectors of one shape, got ",
                                        starts.shape().DebugString(), ", ", ends.shape().DebugString(), ", ",
                                        numbers.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(location.shape()),
                errors::InvalidArgument("location must be a scalar, got shape ", location.shape().DebugString()));
    const absl::string_view bytes(data.scalar<tstring>()());
    const auto b = starts.flat<int64_t>(), e = ends.flat<int64_t>();
    const int64_t n = starts.NumElements(), size = static_cast<int64_t>(bytes.size());
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, 0 <= b(i) && b(i) <= e(i) && e(i) <= size,
                  errors::InvalidArgument("record span ", i, " [", b(i), ", ", e(i), ") is not inside data (",
                                          size, " bytes)"));
    }
    Parse(ctx, n, [&](int64_t i) { return bytes.substr(b(i), e(i) - b(i)); }, location, numbers);
  }
};

REGISTER_KERNEL_BUILDER(Name("TtfParseExamples").Device(DEVICE_CPU), ParseExampleStringsOp);
REGISTER_KERNEL_BUILDER(Name("TtfParseExampleSpans").Device(DEVICE_CPU), ParseExampleSpansOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
