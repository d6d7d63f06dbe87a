#include "ferry/core/copy_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "gtest/gtest.h"
#include "src/core/byte_swap.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace ferry {
namespace {

// The naive reference: visit every index in row-major order and convert one element at a time.
void ReferenceCopy(const HostView& src, const MutableHostView& dst) {
  ConvertKernel kernel = GetConvertKernel(src.dtype, dst.dtype).value();
  const int64_t count = src.num_elements();
  std::vector<int64_t> index(src.dims.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    int64_t src_offset = 0, dst_offset = 0;
    for (size_t d = 0; d < index.size(); ++d) {
      src_offset += index[d] * src.byte_strides[d];
      dst_offset += index[d] * dst.byte_strides[d];
    }
    kernel(static_cast<const std::byte*>(src.data) + src_offset, 0,
           static_cast<std::byte*>(dst.data) + dst_offset, 0, 1);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < src.dims[d]) break;
      index[d] = 0;
    }
  }
}

// Runs `plan` in pieces of `chunk` elements, as a transfer does.
void CopyInChunks(const CopyConvertPlan& plan, int64_t chunk) {
  for (int64_t begin = 0; begin < plan.num_elements(); begin += chunk) {
    plan.CopyElements(begin, std::min(begin + chunk, plan.num_elements()));
  }
}

std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t size) {
  std::vector<std::byte> bytes(size);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

#if defined(__x86_64__)
// A thread that flushes denormals (MXCSR's flush-to-zero and denormals-are-zero bits, as XLA's
// compute threads set them, and as every thread they start inherits) still converts exactly:
// ferry's conversions run on plugin threads (event continuations) and on ferry threads started
// from them.
TEST(CopyConvertTest, DenormalsConvertExactlyOnAThreadThatFlushesThem) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  const std::vector<float> tiny = {-1.0e-40f, 1.4e-45f, 5.0e-39f, -0.0f, 1.0f};
  std::vector<double> widened(tiny.size(), 7.0);
  StatusOr<CopyConvertPlan> widen =
      CopyConvertPlan::Create(HostView::Dense(tiny.data(), DType::kF32, {5}),
                              MutableHostView::Dense(widened.data(), DType::kF64, {5}));
  std::vector<double> narrow_source = {-1.0e-40, 1.0e-44, 3.0e-39};
  std::vector<float> narrowed(narrow_source.size(), 7.0f);
  StatusOr<CopyConvertPlan> narrow =
      CopyConvertPlan::Create(HostView::Dense(narrow_source.data(), DType::kF64, {3}),
                              MutableHostView::Dense(narrowed.data(), DType::kF32, {3}));
  if (widen.ok()) widen->CopyAll();
  if (narrow.ok()) narrow->CopyAll();
  const unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  ASSERT_TRUE(widen.ok()) << widen.status();
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(after & 0x8040u, 0x8040u) << "the caller's mode is given back as it was";
  for (size_t i = 0; i < tiny.size(); ++i) {
    EXPECT_EQ(widened[i], static_cast<double>(tiny[i])) << "element " << i;
    EXPECT_EQ(std::signbit(widened[i]), std::signbit(tiny[i])) << "element " << i;
  }
  for (size_t i = 0; i < narrow_source.size(); ++i) {
    EXPECT_EQ(narrowed[i], static_cast<float>(narrow_source[i])) << "element " << i;
    EXPECT_NE(narrowed[i], 0.0f) << "element " << i << " flushed to zero";
  }
}
#endif

TEST(CopyConvertTest, ContiguousSameDtypeIsOneRun) {
  std::vector<float> src(100), dst(100);
  for (int i = 0; i < 100; ++i) src[i] = i * 1.5f;
  auto plan = CopyConvertPlan::Create(HostView::Dense(src.data(), DType::kF32, {10, 10}),
                                      MutableHostView::Dense(dst.data(), DType::kF32, {10, 10}));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->is_contiguous());
  EXPECT_EQ(plan->row_elements(), 100);
  plan->CopyAll();
  EXPECT_EQ(src, dst);
}

TEST(CopyConvertTest, TransposeMatchesReference) {
  std::vector<float> src(12), dst(12);
  for (int i = 0; i < 12; ++i) src[i] = static_cast<float>(i);
  HostView transposed(src.data(), DType::kF32, {4, 3}, {4, 16});
  ASSERT_TRUE(
      CopyConvert(transposed, MutableHostView::Dense(dst.data(), DType::kF32, {4, 3})).ok());
  EXPECT_EQ(dst, (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST(CopyConvertTest, ConvertsWhileReadingNegativeStrides) {
  std::vector<double> src = {1.5, 2.5, -3.25, 4.0};
  std::vector<float> dst(4);
  HostView reversed(src.data() + 3, DType::kF64, {4}, {-8});
  ASSERT_TRUE(CopyConvert(reversed, MutableHostView::Dense(dst.data(), DType::kF32, {4})).ok());
  EXPECT_EQ(dst, (std::vector<float>{4.0f, -3.25f, 2.5f, 1.5f}));
}

TEST(CopyConvertTest, DimsMismatchIsInvalidArgument) {
  std::vector<float> a(6), b(6);
  auto plan = CopyConvertPlan::Create(HostView::Dense(a.data(), DType::kF32, {2, 3}),
                                      MutableHostView::Dense(b.data(), DType::kF32, {3, 2}));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CopyConvertTest, ComplexToRealIsRefused) {
  std::vector<float> a(4), b(2);
  auto plan = CopyConvertPlan::Create(HostView::Dense(a.data(), DType::kC64, {2}),
                                      MutableHostView::Dense(b.data(), DType::kF32, {2}));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

// Random shapes, strides (permuted, stepped, negative, broadcast) and dtype pairs, copied in
// random chunks, against the element-by-element reference.
TEST(CopyConvertTest, RandomStridedChunkedCopiesMatchReference) {
  const uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << "\n";
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const auto dtypes = AllDTypes();
  for (int trial = 0; trial < 300; ++trial) {
    const DType src_dtype = dtypes[rng() % dtypes.size()];
    const DType dst_dtype = dtypes[rng() % dtypes.size()];
    if (!CheckConvertible(src_dtype, dst_dtype).ok()) continue;
    const int rank = static_cast<int>(rng() % 5);
    Dims dims;
    for (int d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(rng() % 6));
    // Source: a random layout inside a bigger buffer (steps 1..3, some negative, some 0).
    const int64_t esize = DTypeSize(src_dtype);
    Dims steps(rank), src_strides(rank);
    std::vector<int> order(rank);
    for (int d = 0; d < rank; ++d) {
      order[d] = d;
      steps[d] = rng() % 8 == 0 ? 0 : static_cast<int64_t>(1 + rng() % 3);
    }
    std::shuffle(order.begin(), order.end(), rng);
    int64_t extent = 1;  // in elements
    for (int k = rank; k-- > 0;) {
      const int d = order[k];
      src_strides[d] = steps[d] * extent * esize;
      extent *= std::max<int64_t>(dims[d], 1) * std::max<int64_t>(steps[d], 1);
    }
    std::vector<std::byte> src_bytes = RandomBytes(rng, static_cast<size_t>(extent * esize));
    const std::byte* origin = src_bytes.data();
    for (int d = 0; d < rank; ++d) {
      if (rng() % 3 == 0 && dims[d] > 0) {  // flip this dim
        origin += (dims[d] - 1) * src_strides[d];
        src_strides[d] = -src_strides[d];
      }
    }
    HostView src(origin, src_dtype, dims, src_strides);
    ASSERT_TRUE(src.ValidateWithin(src_bytes.data(), src_bytes.size(), "src").ok())
        << src.DebugString();
    const int64_t count = src.num_elements();
    std::vector<std::byte> expected(count * DTypeSize(dst_dtype) + 1);
    std::vector<std::byte> actual(expected.size());
    MutableHostView expected_view = MutableHostView::Dense(expected.data(), dst_dtype, dims);
    MutableHostView actual_view = MutableHostView::Dense(actual.data(), dst_dtype, dims);
    ReferenceCopy(src, expected_view);
    auto plan = CopyConvertPlan::Create(src, actual_view);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int64_t begin = 0; begin < count;) {  // random chunk boundaries
      const int64_t end = std::min<int64_t>(count, begin + 1 + static_cast<int64_t>(rng() % 17));
      plan->CopyElements(begin, end);
      begin = end;
    }
    ASSERT_EQ(0, std::memcmp(expected.data(), actual.data(), expected.size()))
        << DTypeName(src_dtype) << " -> " << DTypeName(dst_dtype) << " " << src.DebugString();
  }
}

// A byte-swapped source: the plan reverses each element (each complex part) as it reads, in the
// same pass, whatever the strides, the conversion and the chunking. The reference swaps a native
// copy first, with its own byte loop, then converts element by element.
TEST(CopyConvertTest, ByteSwappedSourcesAreReversedOnTheWay) {
  std::mt19937_64 rng(20261202);
  struct Case {
    DType from;
    DType to;
  };
  const Case cases[] = {{DType::kU32, DType::kU32},   {DType::kF32, DType::kBF16},
                        {DType::kF64, DType::kF32},   {DType::kS16, DType::kS64},
                        {DType::kF16, DType::kF32},   {DType::kC64, DType::kC128},
                        {DType::kC128, DType::kC128}, {DType::kU8, DType::kF32}};
  for (const Case& c : cases) {
    for (const bool transposed : {false, true}) {
      SCOPED_TRACE(fmt::format("{} -> {}{}", DTypeName(c.from), DTypeName(c.to),
                               transposed ? " transposed" : ""));
      const int64_t rows = 37, columns = 300;  // rows > the plan's 4 KiB swap block
      const int64_t size = DTypeSize(c.from);
      const int64_t unit = ByteSwapUnit(c.from);
      std::vector<std::byte> stored = RandomBytes(rng, static_cast<size_t>(rows * columns * size));
      // Finite floats keep NaN payload rules out of the comparison: clear the top exponent bit
      // of each unit, which is the first stored byte of a big-endian unit.
      if (c.from != DType::kU32 && c.from != DType::kS16 && c.from != DType::kU8) {
        for (size_t i = 0; i < stored.size(); i += static_cast<size_t>(unit))
          stored[i] &= std::byte{0xBF};
      }
      std::vector<std::byte> native = stored;
      for (size_t i = 0; i < native.size(); i += static_cast<size_t>(unit)) {
        std::reverse(native.begin() + static_cast<std::ptrdiff_t>(i),
                     native.begin() + static_cast<std::ptrdiff_t>(i + static_cast<size_t>(unit)));
      }
      Dims dims = {rows, columns};
      Dims strides = {columns * size, size};
      if (transposed) {
        dims = {columns, rows};
        strides = {size, columns * size};
      }
      HostView swapped(stored.data(), c.from, dims, strides);
      swapped.byte_swapped = true;
      const HostView reference_src(native.data(), c.from, dims, strides);
      std::vector<std::byte> got(static_cast<size_t>(rows * columns * DTypeSize(c.to)));
      std::vector<std::byte> want(got.size());
      ReferenceCopy(reference_src, MutableHostView::Dense(want.data(), c.to, dims));
      auto plan = CopyConvertPlan::Create(swapped, MutableHostView::Dense(got.data(), c.to, dims));
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_FALSE(plan->is_contiguous() && size > 1);
      CopyInChunks(*plan, 1001);  // uneven chunks
      EXPECT_EQ(got, want);
    }
  }
}

TEST(CopyConvertTest, ByteSwappedDestinationsAreRefused) {
  float value = 1.0f, out = 0.0f;
  MutableHostView dst = MutableHostView::Dense(&out, DType::kF32, {1});
  dst.byte_swapped = true;
  EXPECT_EQ(CopyConvert(HostView::Dense(&value, DType::kF32, {1}), dst).code(),
            absl::StatusCode::kInvalidArgument);
}

// Transposed same-dtype 4-byte views take whole 16x16 vector blocks (at the AVX2 level and above)
// and the strided path for the columns left over; every shape and chunking must match the
// reference, edges included (CopyConvertLevelTest below runs the same paths at every level).
TEST(CopyConvertTest, TransposedTilesMatchTheReferenceAtEveryEdge) {
  std::mt19937_64 rng(77);
  for (const DType dtype : {DType::kF32, DType::kS32, DType::kF64, DType::kF16}) {
    for (const auto& [rows, columns] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 16}, {8, 8}, {37, 53}, {64, 13}, {24, 100}, {129, 71}}) {
      SCOPED_TRACE(fmt::format("{} {}x{}", DTypeName(dtype), rows, columns));
      const int64_t size = DTypeSize(dtype);
      // A (columns x rows) row-major tensor, viewed transposed as (rows x columns).
      std::vector<std::byte> stored = RandomBytes(rng, static_cast<size_t>(rows * columns * size));
      const HostView transposed(stored.data(), dtype, {rows, columns}, {size, rows * size});
      std::vector<std::byte> got(stored.size()), want(stored.size());
      ReferenceCopy(transposed, MutableHostView::Dense(want.data(), dtype, {rows, columns}));
      auto plan = CopyConvertPlan::Create(
          transposed, MutableHostView::Dense(got.data(), dtype, {rows, columns}));
      ASSERT_TRUE(plan.ok()) << plan.status();
      CopyInChunks(*plan, plan->num_elements() / 3 + 5);
      EXPECT_EQ(got, want);
    }
  }
}

// Dense copies of a megabyte or more are streamed from the destination's first 64-byte boundary
// on: every alignment of either side and every tail length must still copy every byte.
TEST(CopyConvertTest, LongDenseCopiesAreExactAtEveryAlignment) {
  std::mt19937_64 rng(5);
  for (const DType dtype : {DType::kU8, DType::kS16, DType::kF32, DType::kC128}) {
    const int64_t size = DTypeSize(dtype);
    const int64_t count = ((int64_t{1} << 20) + 77 * size) / size;
    std::vector<std::byte> src = RandomBytes(rng, static_cast<size_t>(count * size + 128));
    for (const int64_t src_shift : {int64_t{0}, size, 5 * size}) {
      for (const int64_t dst_shift : {int64_t{0}, size, 3 * size, 64 - size}) {
        SCOPED_TRACE(fmt::format("{} src+{} dst+{}", DTypeName(dtype), src_shift, dst_shift));
        std::vector<std::byte> dst(static_cast<size_t>(count * size + 128), std::byte{0x11});
        ConvertKernel copy = GetConvertKernel(dtype, dtype).value();
        copy(src.data() + src_shift, size, dst.data() + dst_shift, size, count);
        EXPECT_EQ(0, std::memcmp(dst.data() + dst_shift, src.data() + src_shift,
                                 static_cast<size_t>(count * size)));
        // Nothing outside the row is touched.
        EXPECT_EQ(dst[static_cast<size_t>(dst_shift + count * size)], std::byte{0x11});
        if (dst_shift > 0) {
          EXPECT_EQ(dst[static_cast<size_t>(dst_shift - 1)], std::byte{0x11});
        }
      }
    }
  }
}

// The same-dtype vector paths of a plan, at each kernel level whatever FERRY_CONVERT_KERNELS says:
// transposed bands of 4-byte elements (16x16 blocks in registers) and rows read every other
// element (a [::2] slice), both streamed once the destination reaches a megabyte. Each copy must
// give the reference's bytes and write nothing outside its destination.
class CopyConvertLevelTest : public testing::TestWithParam<ConvertKernelLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > BestConvertKernelLevel()) {
      const StatusOr<CopyConvertPlan> refused =
          CopyConvertPlan::Create(HostView::Dense(nullptr, DType::kF32, {0}),
                                  MutableHostView::Dense(nullptr, DType::kF32, {0}), GetParam());
      ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
      GTEST_SKIP() << "this CPU lacks the " << ConvertKernelLevelName(GetParam())
                   << " level: " << refused.status().message();
    }
  }

  // Copies `src` with a plan at this level, `chunk` elements at a time, into a dense destination
  // placed `dst_shift` bytes into a buffer of guard bytes.
  void ExpectCopyMatchesReference(const HostView& src, int64_t dst_shift, int64_t chunk) {
    SCOPED_TRACE(fmt::format("{} dims [{}] strides [{}] dst+{} chunk {}", DTypeName(src.dtype),
                             fmt::join(src.dims, ","), fmt::join(src.byte_strides, ","), dst_shift,
                             chunk));
    constexpr std::byte kGuard{0x5A};
    const int64_t bytes = src.num_elements() * DTypeSize(src.dtype);
    std::vector<std::byte> want(static_cast<size_t>(bytes));
    ReferenceCopy(src, MutableHostView::Dense(want.data(), src.dtype, src.dims));
    // 64-byte aligned storage, so that a shift of 0 is a streamable destination.
    std::vector<std::byte> storage(static_cast<size_t>(bytes + dst_shift + 192), kGuard);
    const auto misalignment = reinterpret_cast<uintptr_t>(storage.data()) % 64;
    std::byte* const base = storage.data() + (64 - misalignment) % 64;
    std::byte* const dst = base + dst_shift;
    StatusOr<CopyConvertPlan> plan =
        CopyConvertPlan::Create(src, MutableHostView::Dense(dst, src.dtype, src.dims), GetParam());
    ASSERT_TRUE(plan.ok()) << plan.status();
    CopyInChunks(*plan, chunk);
    EXPECT_EQ(0, std::memcmp(dst, want.data(), static_cast<size_t>(bytes)));
    EXPECT_TRUE(std::all_of(storage.data(), dst, [&](std::byte b) { return b == kGuard; }))
        << "a byte before the destination was written";
    EXPECT_TRUE(std::all_of(dst + bytes, storage.data() + storage.size(), [&](std::byte b) {
      return b == kGuard;
    })) << "a byte after the destination was written";
  }

  std::mt19937_64 rng_{std::hash<std::string_view>{}(ConvertKernelLevelName(GetParam()))};
};

TEST_P(CopyConvertLevelTest, TransposedBandsMatchTheReference) {
  for (const DType dtype : {DType::kF32, DType::kS32, DType::kF64, DType::kBF16}) {
    const int64_t size = DTypeSize(dtype);
    // Whole blocks, ragged edges, fewer rows than a block, and one over a megabyte (streamed).
    for (const auto& [rows, columns] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 16}, {32, 48}, {17, 33}, {48, 35}, {15, 64}, {1040, 272}}) {
      if (rows * columns * size > (int64_t{1} << 20) && dtype != DType::kF32) continue;
      // A (columns x rows) row-major tensor, viewed transposed as (rows x columns).
      std::vector<std::byte> stored = RandomBytes(rng_, static_cast<size_t>(rows * columns * size));
      const HostView transposed(stored.data(), dtype, {rows, columns}, {size, rows * size});
      const int64_t elements = rows * columns;
      for (const int64_t dst_shift : {int64_t{0}, size, int64_t{64}}) {
        ExpectCopyMatchesReference(transposed, dst_shift, elements);
      }
      // Chunks that start and end inside rows and inside bands.
      ExpectCopyMatchesReference(transposed, 0, elements / 3 + 5);
      ExpectCopyMatchesReference(transposed, 0, 16 * columns + 1);
    }
  }
  // A batch of transposed matrices (rank 3), and a transpose read backwards along its rows.
  std::vector<std::byte> stored = RandomBytes(rng_, 3 * 48 * 64 * 4);
  ExpectCopyMatchesReference(
      HostView(stored.data(), DType::kF32, {3, 48, 64}, {48 * 64 * 4, 4, 48 * 4}), 0, 3 * 48 * 64);
  ExpectCopyMatchesReference(
      HostView(stored.data() + 63 * 48 * 4, DType::kF32, {48, 64}, {4, -48 * 4}), 0, 48 * 64);
}

TEST_P(CopyConvertLevelTest, EveryOtherElementRowsMatchTheReference) {
  for (const DType dtype :
       {DType::kU8, DType::kF16, DType::kBF16, DType::kF32, DType::kF64, DType::kC128}) {
    const int64_t size = DTypeSize(dtype);
    for (const auto& [rows, columns] : std::vector<std::pair<int64_t, int64_t>>{{1, 1},
                                                                                {3, 7},
                                                                                {5, 16},
                                                                                {4, 33},
                                                                                {2, 1000},
                                                                                {7, 64},
                                                                                {1, 150000},
                                                                                {300, 1100},
                                                                                {301, 1024}}) {
      if (rows * columns * size > (int64_t{1} << 20) && size != 4) continue;
      // x[::2, ::2] of a (2 rows x 2 columns) tensor, and x[:, ::2] of a (rows x 2 columns) one.
      // Destination rows of a multiple of 64 bytes are gathered two at a time.
      std::vector<std::byte> stored =
          RandomBytes(rng_, static_cast<size_t>(4 * rows * columns * size));
      const HostView every_other_row(stored.data(), dtype, {rows, columns},
                                     {4 * columns * size, 2 * size});
      const HostView every_row(stored.data() + size, dtype, {rows, columns},
                               {2 * columns * size, 2 * size});
      for (const int64_t dst_shift : {int64_t{0}, size, int64_t{60}}) {
        ExpectCopyMatchesReference(every_other_row, dst_shift, rows * columns);
      }
      ExpectCopyMatchesReference(every_row, 0, rows * columns);
      ExpectCopyMatchesReference(every_other_row, 0, columns / 2 + 3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, CopyConvertLevelTest,
                         testing::Values(ConvertKernelLevel::kPortable, ConvertKernelLevel::kAvx2,
                                         ConvertKernelLevel::kAvx512),
                         [](const testing::TestParamInfo<ConvertKernelLevel>& info) {
                           return std::string(ConvertKernelLevelName(info.param));
                         });

}  // namespace
}  // namespace ferry
