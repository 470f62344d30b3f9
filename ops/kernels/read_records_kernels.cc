// Kernel of TtfReadRecords (ops/read_records_ops.cc): the TFRecord framing of a plain file,
//
//   uint64 length; uint32 masked_crc32c(length); bytes data[length]; uint32 masked_crc32c(data)
//
// read in large pieces through TensorFlow's file systems (Env: local, ram://, gs://, ...) into
// one string, the records left where they lie (their spans given): no string per record, and
// no tf.data element per record, which is what TFRecordDataset costs.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/lib/hash/crc32c.h"
#include "crc32c_sse42.h"

namespace tensorflow {
namespace ttf {
namespace {

constexpr size_t kHeader = 12, kFooter = 4;
constexpr size_t kMinRead = 256 << 10, kMaxRead = 64 << 20;

inline uint64_t Fixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian, as TFRecord writes it (x86 and ARM hosts)
  return v;
}

inline uint32_t Fixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The CRC32C of data[0:n): by the SSE4.2 instruction where the CPU has it (crc32c_sse42.h), else TensorFlow's.
inline uint32_t Crc32c(const char* data, size_t n) {
#ifdef TTF_CRC32C_SSE42
  static const bool sse42 = crc32c_hw::Available();
  if (sse42) return crc32c_hw::Sse42Value(data, n);
#endif
  return crc32c::Value(data, n);
}

inline bool CrcMatches(const char* data, size_t n, const char* masked) {
  return crc32c::Unmask(Fixed32(masked)) == Crc32c(data, n);
}

// The bytes of a file from byte `base` on, read as the framing asks for them.
class FileBytes {
 public:
  FileBytes(RandomAccessFile* file, uint64_t base) : file_(file), base_(base) {}

  // Reads until the buffer holds `end` bytes or the file ends: at least `hint` bytes a read (the
  // rest of the block, estimated), at most kMaxRead (a false length cannot allocate past the file).
  Status Fill(size_t end, size_t hint) {
    while (buffer_.size() < end && !at_end_) {
      const size_t have = buffer_.size();
      const size_t want = std::min(std::max({end - have, hint, kMinRead}), kMaxRead);
      buffer_.resize_uninitialized(have + want);
      char* scratch = &buffer_[have];
      StringPiece got;
      const Status s = file_->Read(base_ + have, want, &got, scratch);
      if (!s.ok() && !absl::IsOutOfRange(s)) return s;
      if (got.data() != scratch && !got.empty()) std::memmove(scratch, got.data(), got.size());
      buffer_.resize_uninitialized(have + got.size());
      at_end_ = got.size() < want;
    }
    return OkStatus();
  }

  const char* data() const { return buffer_.data(); }
  size_t size() const { return buffer_.size(); }
  bool at_end() const { return at_end_; }
  tstring* buffer() { return &buffer_; }

 private:
  RandomAccessFile* file_;
  uint64_t base_;
  tstring buffer_;
  bool at_end_ = false;
};

class ReadRecordsOp : public OpKernel {
 public:
  explicit ReadRecordsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_bytes", &max_bytes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("strict", &strict_));
    OP_REQUIRES(ctx, max_bytes_ > 0, errors::InvalidArgument("max_bytes must be > 0, got ", max_bytes_));
  }

  void Compute(OpKernelContext* ctx) override {
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  errors::InvalidArgument(ctx->op_kernel().def().input(i), " must be a scalar, got shape ",
                                          ctx->input(i).shape().DebugString()));
    }
    const std::string path(ctx->input(0).scalar<tstring>()());
    const int64_t offset = ctx->input(1).scalar<int64_t>()();
    int64_t number = ctx->input(2).scalar<int64_t>()();
    const int64_t max_records = ctx->input(3).scalar<int64_t>()();
    OP_REQUIRES(ctx, max_records > 0, errors::InvalidArgument("max_records must be > 0, got ", max_records));
    std::vector<int64_t> starts, ends, numbers;
    int64_t bad = 0;
    size_t pos = 0;
    bool finished = offset < 0;  // -1: the file was read to its end
    std::unique_ptr<RandomAccessFile> file;
    if (!finished) {
      const Status s = ctx->env()->NewRandomAccessFile(path, &file);
      OP_REQUIRES(ctx, s.ok(), absl::IsNotFound(s)
                                   ? errors::NotFound(path, ": no such TFRecord file (", s.message(), ")")
                                   : errors::Unavailable(path, ": cannot open the TFRecord file (", s.message(), ")"));
    }
    FileBytes bytes(file.get(), std::max<int64_t>(offset, 0));
    while (!finished && static_cast<int64_t>(starts.size()) < max_records &&
           (starts.empty() || static_cast<int64_t>(pos) < max_bytes_)) {
      // The rest of the block, estimated from the records read so far.
      const size_t hint = starts.empty() ? 0 : pos / starts.size() * (max_records - starts.size()) + kHeader;
      OP_REQUIRES_OK(ctx, Read(&bytes, pos + kHeader, hint, path));
      const size_t left = bytes.size() - pos;
      if (left == 0) {
        finished = true;
        break;
      }
      std::string problem;
      bool resumable = false;  // a bad data CRC: the next record is still found
      size_t frame = 0;
      if (left < kHeader) {
        problem = "the file ends inside the record's header (" + std::to_string(left) + " bytes left): a truncated file";
      } else if (!CrcMatches(bytes.data() + pos, 8, bytes.data() + pos + 8)) {
        problem = "the record's length does not match its CRC32C: a corrupt file";
      } else {
        const uint64_t length = Fixed64(bytes.data() + pos);
        OP_REQUIRES_OK(ctx, Read(&bytes, pos + kHeader + length + kFooter, hint, path));
        frame = kHeader + length + kFooter;
        if (length > bytes.size() - pos - kHeader || bytes.size() - pos < frame) {
          problem = "the file ends inside the record (" + std::to_string(length) + " bytes of data, " +
                    std::to_string(bytes.size() - pos - kHeader) + " left): a truncated file";
        } else if (!CrcMatches(bytes.data() + pos + kHeader, length, bytes.data() + pos + kHeader + length)) {
          problem = "the record's data does not match its CRC32C: a corrupt file";
          resumable = true;
        } else {
          starts.push_back(pos + kHeader);
          ends.push_back(pos + kHeader + length);
          numbers.push_back(number);
        }
      }
      if (!problem.empty()) {
        OP_REQUIRES(ctx, !strict_,
                    errors::DataLoss(path, ", record ", number, " (byte ", std::max<int64_t>(offset, 0) + pos, "): ",
                                     problem, " (write or copy the file again, or read with strict=False to skip ",
                                     "and count bad records)"));
        ++bad;
        if (!resumable) {
          finished = true;  // nothing after a bad length or a truncation can be framed
          break;
        }
      }
      pos += frame;
      ++number;
    }
    if (!finished && bytes.at_end() && pos == bytes.size()) finished = true;
    Tensor* data = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &data));
    data->scalar<tstring>()() = std::move(*bytes.buffer());  // the records stay where they were read
    const int64_t n = static_cast<int64_t>(starts.size());
    for (int i = 0; i < 3; ++i) {
      const std::vector<int64_t>& from = i == 0 ? starts : i == 1 ? ends : numbers;
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1 + i, TensorShape({n}), &out));
      std::copy(from.begin(), from.end(), out->flat<int64_t>().data());
    }
    const int64_t scalars[] = {offset < 0 ? offset : offset + static_cast<int64_t>(pos), number, bad};
    for (int i = 0; i < 3; ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(4 + i, TensorShape({}), &out));
      out->scalar<int64_t>()() = scalars[i];
    }
    Tensor* done = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(7, TensorShape({}), &done));
    done->scalar<bool>()() = finished;
  }

 private:
  static Status Read(FileBytes* bytes, size_t end, size_t hint, const std::string& path) {
    const Status s = bytes->Fill(end, hint);
    if (s.ok()) return s;
    return errors::Unavailable(path, ": cannot read the TFRecord file (", s.message(), ")");
  }

  int64_t max_bytes_;
  bool strict_;
};

REGISTER_KERNEL_BUILDER(Name("TtfReadRecords").Device(DEVICE_CPU), ReadRecordsOp);

}  // namespace
}  // namespace ttf
}  // namespace tensorflow
