// The value rules shared by every input format (ops/kernels/parse_lines_kernels.cc for
// delimited text, encode_columns_kernels.cc for Parquet and TFRecord columns): one
// statement of how a value becomes a key, a number or an hour, so that the same value
// gives the same key in every format. The Python statement of the contract (the test
// reference) is field_key in ttf/data/_schema.py.
#ifndef TTF_OPS_KERNELS_PARSE_VALUES_H_
#define TTF_OPS_KERNELS_PARSE_VALUES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tensorflow {
namespace ttf {
namespace parse_values {

enum Kind { kSkip = 0, kLabel = 1, kDense = 2, kCategorical = 3, kMultiHot = 4, kHour = 5 };
enum ValueMode { kAuto = 0, kInt = 1, kString = 2 };

constexpr int kValueBits = 56;
constexpr uint64_t kMissing = (uint64_t{1} << kValueBits) - 1;
constexpr uint64_t kHashBase = uint64_t{1} << 32;

inline uint64_t Fnv1a64(const char* s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ULL;
  return h;
}

inline int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Hex digit values by byte, -1 for other bytes: one lookup per byte in the fast path.
struct HexTable {
  int8_t value[256];
  constexpr HexTable() : value() {
    for (int i = 0; i < 256; ++i) value[i] = -1;
    for (int i = 0; i < 10; ++i) value['0' + i] = static_cast<int8_t>(i);
    for (int i = 0; i < 6; ++i) value['a' + i] = value['A' + i] = static_cast<int8_t>(10 + i);
  }
};
constexpr HexTable kHexTable;

inline int64_t Tag(int field, uint64_t v) {
  return static_cast<int64_t>((static_cast<uint64_t>(field) << kValueBits) | v);
}

// 8 hex digits (Criteo's form) decoded in one word of 8 bytes (s[0] its low byte,
// little-endian): no branch a byte, no table. False if the 8 bytes are not all hex digits.
inline bool Hex8(const char* s, uint64_t* v) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
  uint64_t w;
  std::memcpy(&w, s, 8);
  if (w & kHigh) return false;
  // Each byte x < 0x80: bit 7 of x + (0x80 - lo) says x >= lo, of x + (0x7f - hi) says x > hi.
  const uint64_t digit = (w + kOnes * (0x80 - '0')) & ~(w + kOnes * (0x7f - '9'));
  const uint64_t folded = w | kOnes * 0x20;  // 'A'-'F' onto 'a'-'f'
  const uint64_t letter = (folded + kOnes * (0x80 - 'a')) & ~(folded + kOnes * (0x7f - 'f'));
  if (((digit | letter) & kHigh) != kHigh) return false;
  // A digit's value is its low nibble; a letter's (bit 6 set) its low nibble + 9.
  uint64_t n = (w & kOnes * 0x0f) + ((w >> 6) & kOnes) * 9;
  // s[0] is the most significant digit: join pairs of bytes, then of 16-bit lanes, then the halves.
  n = ((n & 0x000f000f000f000fULL) << 4) | ((n >> 8) & 0x000f000f000f000fULL);
  n = ((n & 0x000000ff000000ffULL) << 8) | ((n >> 16) & 0x000000ff000000ffULL);
  *v = ((n & 0xffff) << 16) | ((n >> 32) & 0xffff);
  return true;
}

// The low 56 bits of a categorical value's key (see field_key in ttf/data/_schema.py):
// auto: up to 8 hex digits are their own value (Criteo's form, exact and collision-free,
// below 2^32), other strings hash above 2^32 so they never meet a hex value; int: the
// decimal integer, exact; string: always the hash. Empty: 2^56 - 1, one missing key per
// field. False for an int-mode value that is not an integer in [0, 2^56 - 1).
inline bool CategoricalValue(int mode, const char* s, size_t n, uint64_t* v) {
  if (n == 0) {
    *v = kMissing;
    return true;
  }
  if (mode == kInt) {
    if (n > 17) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!IsDigit(s[i])) return false;
      x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return x < kMissing;
  }
  if (mode == kAuto && n == 8 && Hex8(s, v)) return true;  // the commonest key, decoded at once
  if (mode == kAuto && n <= 8) {
    uint64_t hex = 0;
    size_t i = 0;
    for (; i < n; ++i) {
      const int d = HexDigit(s[i]);
      if (d < 0) break;
      hex = hex * 16 + d;
    }
    if (i == n) {
      *v = hex;
      return true;
    }
  }
  *v = kHashBase + Fnv1a64(s, n) % (kMissing - kHashBase);
  return true;
}

// Parses a number field: "" (missing) or [+-]?(D+(.D*)?|.D+)([eE][+-]?D+)? with a finite
// value ("12", "-1", "260.0", "1e3"). Plain integers of up to 18 digits (Criteo's form)
// take a fast exact path; the rest go through strtod. False if not a number.
inline bool ParseNumber(const char* s, size_t n, double* out) {
  if (n == 0) return false;
  size_t i = 0;
  const bool negative = s[0] == '-';
  if (s[0] == '-' || s[0] == '+') ++i;
  const size_t int_begin = i;
  int64_t integer = 0;
  for (; i < n && IsDigit(s[i]); ++i) {
    if (i - int_begin < 18) integer = integer * 10 + (s[i] - '0');  // past 18 digits: strtod below
  }
  const size_t int_digits = i - int_begin;
  if (i == n && int_digits > 0 && int_digits <= 18) {
    *out = static_cast<double>(negative ? -integer : integer);
    return true;
  }
  size_t frac_digits = 0;
  if (i < n && s[i] == '.') {
    ++i;
    while (i < n && IsDigit(s[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exp_digits = 0;
    while (i < n && IsDigit(s[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  if (i != n) return false;
  // Validated above, so strtod reads exactly these n characters (no locale, hex or inf forms).
  char buf[128];
  if (n >= sizeof(buf)) return false;
  std::memcpy(buf, s, n);
  buf[n] = '\0';
  *out = std::strtod(buf, nullptr);
  return std::isfinite(*out);
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
inline int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// YYMMDDHH (20YY) -> hour of day and day of week (0 Monday); false if not a valid stamp.
inline bool ParseHour(const char* s, size_t n, int* hour, int* weekday) {
  if (n != 8) return false;
  int digits[8];
  for (int i = 0; i < 8; ++i) {
    if (!IsDigit(s[i])) return false;
    digits[i] = s[i] - '0';
  }
  const int year = 2000 + digits[0] * 10 + digits[1], month = digits[2] * 10 + digits[3];
  const int day = digits[4] * 10 + digits[5];
  *hour = digits[6] * 10 + digits[7];
  static const int kDaysIn[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (month < 1 || month > 12 || day < 1 || day > kDaysIn[month - 1] || *hour > 23) return false;
  const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
  if (month == 2 && day == 29 && !leap) return false;
  *weekday = static_cast<int>((DaysFromCivil(year, month, day) + 3) % 7);  // 1970-01-01 was a Thursday
  return true;
}

// A field's text for a message: at most 40 bytes, bytes outside printable ASCII as \xNN
// (a message must be valid UTF-8 to reach Python).
inline std::string Quote(const char* s, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < std::min<size_t>(n, 40); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (n > 40) out += "...";
  return out + "'";
}


}  // namespace parse_values
}  // namespace ttf
}  // namespace tensorflow

#endif  // TTF_OPS_KERNELS_PARSE_VALUES_H_
