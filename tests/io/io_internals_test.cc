// The io layer's internal pieces on their own: the byte-swapping copy, UTF-8 validation, the
// quoting of file text in messages and the row-major chunking that the writers use for strided
// views (random views, printed seed).
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "gtest/gtest.h"
#include "src/core/byte_swap.h"
#include "src/io/row_major_chunks.h"
#include "src/io/utf8.h"

namespace ferry::io_internal {
namespace {

std::vector<std::byte> Bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int value : values) out.push_back(static_cast<std::byte>(value));
  return out;
}

TEST(ByteSwapTest, EachUnitSizeReversesTheBytesOfEachUnit) {
  const std::vector<std::byte> input =
      Bytes({0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
             16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31});
  for (int64_t unit : {1, 2, 4, 8, 16}) {
    std::vector<std::byte> out(input.size());
    ByteSwapCopy(input.data(), out.data(), 32 / unit, unit);
    std::vector<std::byte> in_place = input;
    ByteSwapCopy(in_place.data(), in_place.data(), 32 / unit, unit);
    for (int64_t i = 0; i < 32; ++i) {
      const int64_t expected = i / unit * unit + (unit - 1 - i % unit);
      EXPECT_EQ(static_cast<int>(out[i]), expected) << "unit " << unit << " byte " << i;
      EXPECT_EQ(static_cast<int>(in_place[i]), expected) << "in place, unit " << unit;
    }
  }
}

TEST(ByteSwapTest, UnalignedPointersAreFine) {
  std::vector<std::byte> buffer = Bytes({9, 1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<std::byte> out(9);
  ByteSwapCopy(buffer.data() + 1, out.data() + 1, 1, 8);
  EXPECT_EQ(out, Bytes({0, 8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(ByteSwapTest, ComplexTypesSwapEachPartAndOneByteTypesNothing) {
  EXPECT_EQ(ByteSwapUnit(DType::kC64), 4);
  EXPECT_EQ(ByteSwapUnit(DType::kC128), 8);
  EXPECT_EQ(ByteSwapUnit(DType::kF64), 8);
  EXPECT_EQ(ByteSwapUnit(DType::kF16), 2);
  EXPECT_EQ(ByteSwapUnit(DType::kBool), 1);
  EXPECT_EQ(ByteSwapUnit(DType::kU8), 1);
}

TEST(Utf8Test, ValidAndInvalidSequences) {
  EXPECT_EQ(FindInvalidUtf8(""), -1);
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), -1);
  EXPECT_EQ(FindInvalidUtf8("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);
  EXPECT_EQ(FindInvalidUtf8("\xF4\x8F\xBF\xBF"), -1);  // U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("ab\x80"), 2);             // stray continuation
  EXPECT_EQ(FindInvalidUtf8("\xC0\xAF"), 0);           // overlong '/'
  EXPECT_EQ(FindInvalidUtf8("\xE0\x80\xAF"), 0);       // overlong
  EXPECT_EQ(FindInvalidUtf8("\xED\xA0\x80"), 0);       // surrogate U+D800
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0);   // above U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("x\xE2\x82"), 1);          // truncated
  EXPECT_EQ(FindInvalidUtf8("\xFF"), 0);
}

TEST(EscapeForMessageTest, KeepsWholePrintableCharactersAndEscapesTheRest) {
  EXPECT_EQ(EscapeForMessage("w.0 \xC3\xA9\xE6\xA8\xA1\xF0\x9F\x98\x80"),
            "w.0 \xC3\xA9\xE6\xA8\xA1\xF0\x9F\x98\x80");
  EXPECT_EQ(EscapeForMessage("a\\b\n\t\r\x1B[31m\x7F"), "a\\\\b\\n\\t\\r\\x1b[31m\\x7f");
  // C1 controls, a bidirectional override, the line separator and the byte-order mark.
  EXPECT_EQ(EscapeForMessage("\xC2\x85\xE2\x80\xAEx\xE2\x80\xA8\xEF\xBB\xBF"),
            "\\u0085\\u202ex\\u2028\\ufeff");
  // Bytes that do not start a valid sequence, each on its own; a truncated sequence too.
  EXPECT_EQ(EscapeForMessage("a\xFF\xC3(\xE6\xA8"), "a\\xff\\xc3(\\xe6\\xa8");
  // Cut after whole characters, never inside one.
  EXPECT_EQ(EscapeForMessage("\xE6\xA8\xA1\xE5\x9E\x8B\xE6\x9D\x83", 2),
            "\xE6\xA8\xA1\xE5\x9E\x8B...");
  EXPECT_EQ(EscapeForMessage("abc", 3), "abc");
  EXPECT_EQ(EscapeForMessage("", 3), "");
  // Whatever goes in, what comes out is valid UTF-8 without control characters.
  std::mt19937 rng(1818);
  for (int round = 0; round < 2000; ++round) {
    std::string text(rng() % 16, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    const std::string escaped = EscapeForMessage(text, 1 + rng() % 20);
    EXPECT_EQ(FindInvalidUtf8(escaped), -1) << "seed 1818, round " << round;
    for (char c : escaped) {
      EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7F) << "round " << round;
    }
  }
}

// A random strided view into `storage` (f32 or other dtype): permuted, stepped, reversed and
// broadcast dims.
HostView RandomView(const HostTensor& storage, std::mt19937& rng) {
  const int64_t rank = storage.dims().size();
  std::vector<int64_t> order(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const Dims storage_strides = storage.view().byte_strides;
  Dims dims, strides;
  const auto* data = reinterpret_cast<const std::byte*>(storage.data());
  for (int64_t source_dim : order) {
    const int64_t size = storage.dims()[source_dim];
    const int64_t step = 1 + static_cast<int64_t>(rng() % 2);
    const int64_t count = (size + step - 1) / step;
    int64_t stride = storage_strides[source_dim] * step;
    if (rng() % 3 == 0) {  // reversed: start at the last selected element
      data += (count - 1) * stride;
      stride = -stride;
    }
    dims.push_back(count);
    strides.push_back(stride);
    if (rng() % 5 == 0) {  // a broadcast dim
      dims.push_back(1 + static_cast<int64_t>(rng() % 3));
      strides.push_back(0);
    }
  }
  return HostView(data, storage.dtype(), dims, strides);
}

TEST(RowMajorChunksTest, RandomStridedViewsStreamTheirRowMajorBytesForAnyChunkSize) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const DType dtype =
        std::vector<DType>{DType::kU8, DType::kF16, DType::kF32, DType::kC128}[rng() % 4];
    std::vector<int64_t> storage_dims;
    const int64_t rank = 1 + static_cast<int64_t>(rng() % 4);
    for (int64_t i = 0; i < rank; ++i) storage_dims.push_back(1 + static_cast<int64_t>(rng() % 7));
    HostTensor storage = HostTensor::Allocate(dtype, storage_dims).value();
    for (int64_t i = 0; i < storage.size_bytes(); ++i)
      storage.data()[i] = static_cast<std::byte>(rng());
    const HostView view = RandomView(storage, rng);
    ASSERT_TRUE(view.ValidateWithin(storage.data(), storage.size_bytes(), "v").ok())
        << view.DebugString();

    std::string expected(static_cast<size_t>(view.dense_size_bytes()), '\0');
    ASSERT_TRUE(CopyConvert(view, MutableHostView::Dense(expected.data(), dtype, view.dims)).ok());
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000}, int64_t{1} << 20}) {
      std::string streamed;
      int64_t largest = 0;
      Status status = ForEachRowMajorChunk(view, chunk, [&](const std::byte* bytes, int64_t size) {
        streamed.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(size));
        largest = std::max(largest, size);
        return OkStatus();
      });
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(streamed, expected) << view.DebugString() << " chunk " << chunk;
      EXPECT_LE(largest, std::max(chunk, view.element_size())) << view.DebugString();
    }
  }
}

TEST(RowMajorChunksTest, ConsumerErrorStopsTheStream) {
  std::vector<float> values(100);
  // Named dims: GCC 12 with ASan reports a false maybe-uninitialized on a temporary InlinedVector.
  const Dims dims = {100};
  const Dims strides = {4};
  const HostView view(values.data(), DType::kF32, dims, strides);
  int calls = 0;
  Status status = ForEachRowMajorChunk(view, 40, [&](const std::byte*, int64_t) {
    ++calls;
    return InvalidArgumentError("disk full");
  });
  EXPECT_EQ(status.message(), "disk full");
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace ferry::io_internal
