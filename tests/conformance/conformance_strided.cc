// Strided and converting transfers against a naive element-by-element reference written here:
// random shapes (rank 0 to 6, zero-size dims), random byte strides (transposed, stepped,
// negative, broadcast) and random dtype pairs, both into the device and back out of it.
//
// The reference converts one element at a time with the library's scalar kernels
// (GetConvertKernel, count 1), so it checks the strided addressing and the pairing of source and
// device dtypes, not the conversion arithmetic (convert_test covers that).
#include <algorithm>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "conformance_suite.h"
#include "ferry/runtime/transfer.h"

namespace ferry::conformance {
namespace {

struct StridePattern;

class ConformanceStrided : public ConformanceTest {
 protected:
  // Puts `src` as `device_dtype` and checks the dense read-back against the reference; returns
  // the buffer and the reference device bytes for further reads.
  void PutAndCheck(const HostView& src, DType device_dtype, HostBufferSemantics semantics,
                   std::unique_ptr<Buffer>* buffer, std::vector<std::byte>* expected);
  // Reads `buffer` into a random strided destination of `dst_dtype` and checks every byte of the
  // destination memory: converted elements where the view points, untouched bytes elsewhere.
  void ReadIntoStridedAndCheck(Buffer& buffer, absl::Span<const std::byte> device_bytes,
                               DType dst_dtype);
  // Puts a named stride pattern over a few dtype pairs under every semantics and reads it back.
  void RunPattern(const StridePattern& pattern);
};

// Memory with a view over it.
struct Layout {
  HostBytes memory;
  std::byte* data = nullptr;  // element 0
  Dims dims;
  Dims byte_strides;
};

struct LayoutOptions {
  bool allow_broadcast = false;
  bool allow_permute = true;
  bool allow_steps = true;
  bool allow_negative = true;
  // Unaligned element addresses: the data pointer is 1 byte off and strides gain odd padding.
  bool unaligned = false;
};

// Random strides for `dims`: a random nesting order (transposes), steps between elements
// (sliced views), sign flips (negative strides) and, if allowed, zero strides (broadcast).
// Allocates memory (with random margins) covering every addressed byte; fills it with random
// bytes valid for `fill_dtype`.
Layout MakeRandomLayout(std::mt19937_64& rng, absl::Span<const int64_t> dims, DType dtype,
                        const LayoutOptions& options, DType fill_dtype) {
  const int64_t element_size = DTypeSize(dtype);
  const size_t rank = dims.size();
  std::vector<size_t> order(rank);  // outermost to innermost in memory
  std::iota(order.begin(), order.end(), size_t{0});
  if (options.allow_permute && rng() % 2) std::shuffle(order.begin(), order.end(), rng);
  Dims strides(rank, 0);
  int64_t running = element_size + (options.unaligned ? 1 + 2 * int64_t(rng() % 2) : 0);
  for (size_t k = rank; k-- > 0;) {
    const size_t axis = order[k];
    const int64_t step = options.allow_steps ? std::vector<int64_t>{1, 1, 1, 2, 3}[rng() % 5] : 1;
    strides[axis] = running * step;
    running = strides[axis] * std::max<int64_t>(dims[axis], 1);
    if (options.allow_steps && rng() % 3 == 0) running += element_size * int64_t(rng() % 3);
  }
  for (size_t axis = 0; axis < rank; ++axis) {
    if (options.allow_negative && rng() % 4 == 0) strides[axis] = -strides[axis];
    if (options.allow_broadcast && rng() % 6 == 0) strides[axis] = 0;
  }
  int64_t lowest = 0;
  int64_t highest = 0;
  for (size_t axis = 0; axis < rank; ++axis) {
    if (dims[axis] == 0) continue;
    lowest += std::min<int64_t>(0, (dims[axis] - 1) * strides[axis]);
    highest += std::max<int64_t>(0, (dims[axis] - 1) * strides[axis]);
  }
  const int64_t margin_before = element_size * int64_t(rng() % 4);
  const int64_t margin_after = element_size * int64_t(rng() % 4);
  Layout layout;
  layout.memory = HostBytes(margin_before + (highest - lowest) + element_size + margin_after,
                            options.unaligned ? 1 : 0);
  FillRandom(rng, fill_dtype, layout.memory.span());
  layout.data = layout.memory.data() + margin_before - lowest;
  layout.dims = Dims(dims.begin(), dims.end());
  layout.byte_strides = strides;
  return layout;
}

HostView SourceView(const Layout& layout, DType dtype) {
  return HostView(layout.data, dtype, layout.dims, layout.byte_strides);
}

MutableHostView DestinationView(const Layout& layout, DType dtype) {
  return MutableHostView(layout.data, dtype, layout.dims, layout.byte_strides);
}

std::string Describe(DType dtype, absl::Span<const int64_t> dims,
                     absl::Span<const int64_t> strides) {
  return absl::StrFormat("%s dims [%s] byte strides [%s]", DTypeName(dtype),
                         absl::StrJoin(dims, ","), absl::StrJoin(strides, ","));
}

DType RandomDType(std::mt19937_64& rng) { return AllDTypes()[rng() % AllDTypes().size()]; }

// A random dtype `from` converts to (and `device` holds, when given); `from` itself half the time.
DType RandomConvertibleDType(std::mt19937_64& rng, DType from, const Device* device) {
  for (int attempt = 0; attempt < 8 && rng() % 2; ++attempt) {
    const DType to = RandomDType(rng);
    if (!CheckConvertible(from, to).ok()) continue;  // refused pairs are errors_test's business
    if (device != nullptr && !device->capabilities().Holds(to)) continue;
    return to;
  }
  return from;
}

// Rank 0 to 6, a zero dim now and then, at most a few thousand elements (small ranks get
// longer dims, so that rows span several cache lines).
std::vector<int64_t> RandomDims(std::mt19937_64& rng) {
  const int rank = static_cast<int>(rng() % 7);
  const int64_t max_dim = rank <= 2 ? 60 : rank == 3 ? 14 : 5;
  std::vector<int64_t> dims;
  for (int i = 0; i < rank; ++i) {
    dims.push_back(rng() % 16 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % max_dim));
  }
  return dims;
}

HostBufferSemantics RandomSemantics(std::mt19937_64& rng) {
  return static_cast<HostBufferSemantics>(rng() % 3);
}

void ConformanceStrided::PutAndCheck(const HostView& src, DType device_dtype,
                                     HostBufferSemantics semantics, std::unique_ptr<Buffer>* buffer,
                                     std::vector<std::byte>* expected) {
  SCOPED_TRACE(absl::StrFormat("put %s as %s, %s", Describe(src.dtype, src.dims, src.byte_strides),
                               DTypeName(device_dtype), HostBufferSemanticsName(semantics)));
  *expected = ReferenceDeviceBytes(src, device_dtype);
  CT_ASSERT_OK_AND_ASSIGN(
      *buffer, client().BufferFromHostBuffer(src, device_dtype, device(), semantics, nullptr));
  EXPECT_EQ((*buffer)->dims(), src.dims);
  EXPECT_EQ((*buffer)->device_dtype(), device_dtype);
  CT_ASSERT_READY_OK((*buffer)->Ready());
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(**buffer));
  ASSERT_TRUE(BytesEqual(*expected, actual));
}

void ConformanceStrided::ReadIntoStridedAndCheck(Buffer& buffer,
                                                 absl::Span<const std::byte> device_bytes,
                                                 DType dst_dtype) {
  Layout dst = MakeRandomLayout(rng(), buffer.dims(), dst_dtype, LayoutOptions{}, DType::kU8);
  SCOPED_TRACE("read into " + Describe(dst_dtype, dst.dims, dst.byte_strides));
  std::vector<std::byte> expected = dst.memory.ToVector();
  const int64_t device_size = DTypeSize(buffer.device_dtype());
  int64_t i = 0;
  ForEachIndex(dst.dims, [&](absl::Span<const int64_t> index) {
    const int64_t offset = (dst.data - dst.memory.data()) + ByteOffset(index, dst.byte_strides);
    ConvertOneElement(buffer.device_dtype(), device_bytes.data() + device_size * i++, dst_dtype,
                      expected.data() + offset);
  });
  CT_ASSERT_READY_OK(buffer.ToHost(DestinationView(dst, dst_dtype)));
  EXPECT_TRUE(BytesEqual(expected, dst.memory.span()));
}

// Fuzz: random shapes, strides, dtype pairs and semantics into the device.
TEST_P(ConformanceStrided, RandomStridedSourcesMatchNaiveReference) {
  constexpr int kCases = 150;
  int cases_run = 0;
  int conversions = 0;
  int64_t elements = 0;
  for (int n = 0; n < kCases; ++n) {
    SCOPED_TRACE(absl::StrFormat("case %d", n));
    const std::vector<int64_t> dims = RandomDims(rng());
    const DType src_dtype = RandomDType(rng());
    const DType device_dtype = RandomConvertibleDType(rng(), src_dtype, device());
    if (!device()->capabilities().Holds(device_dtype)) continue;
    Layout src = MakeRandomLayout(rng(), dims, src_dtype, {.allow_broadcast = true}, src_dtype);
    std::unique_ptr<Buffer> buffer;
    std::vector<std::byte> expected;
    ASSERT_NO_FATAL_FAILURE(PutAndCheck(SourceView(src, src_dtype), device_dtype,
                                        RandomSemantics(rng()), &buffer, &expected));
    ++cases_run;
    conversions += src_dtype != device_dtype;
    elements += NumElements(dims);
  }
  std::cout << "[     INFO ] " << cases_run << " cases (" << conversions << " converting), "
            << elements << " elements\n";
  EXPECT_GT(cases_run, kCases / 2);
}

// Fuzz: random device buffers read back into random strided destinations of other dtypes.
TEST_P(ConformanceStrided, RandomStridedDestinationsMatchNaiveReference) {
  constexpr int kCases = 150;
  for (int n = 0; n < kCases; ++n) {
    SCOPED_TRACE(absl::StrFormat("case %d", n));
    const std::vector<int64_t> dims = RandomDims(rng());
    const DType device_dtype = RandomDType(rng());
    if (!device()->capabilities().Holds(device_dtype)) continue;
    const DType dst_dtype = RandomConvertibleDType(rng(), device_dtype, nullptr);
    HostBytes src = RandomDenseTensor(rng(), device_dtype, dims);
    std::unique_ptr<Buffer> buffer;
    std::vector<std::byte> device_bytes;
    ASSERT_NO_FATAL_FAILURE(PutAndCheck(HostView::Dense(src.data(), device_dtype, dims),
                                        device_dtype, RandomSemantics(rng()), &buffer,
                                        &device_bytes));
    ASSERT_NO_FATAL_FAILURE(ReadIntoStridedAndCheck(*buffer, device_bytes, dst_dtype));
  }
}

// TransferFromDeviceInto: a batch of handles read into the caller's own random strided views, of
// the logical dtype or another one, with no intermediate copy; the reads hold the handles, so the
// caller drops its references before it waits.
TEST_P(ConformanceStrided, TransferFromDeviceIntoFillsCallerStridedViews) {
  constexpr int kBatches = 12;
  for (int batch = 0; batch < kBatches; ++batch) {
    SCOPED_TRACE(absl::StrFormat("batch %d", batch));
    const int count = 1 + static_cast<int>(rng()() % 5);
    std::vector<DataPtr> handles;
    std::vector<HostBytes> sources;  // a zero-copy buffer aliases its source for its life
    std::vector<Layout> destinations;
    std::vector<MutableHostView> views;
    std::vector<std::vector<std::byte>> expected;
    for (int k = 0; k < count; ++k) {
      const std::vector<int64_t> dims = RandomDims(rng());
      const DType device_dtype = RandomDType(rng());
      if (!device()->capabilities().Holds(device_dtype)) continue;
      const DType dst_dtype = RandomConvertibleDType(rng(), device_dtype, nullptr);
      HostBytes src = RandomDenseTensor(rng(), device_dtype, dims);
      std::unique_ptr<Buffer> buffer;
      std::vector<std::byte> device_bytes;
      ASSERT_NO_FATAL_FAILURE(PutAndCheck(HostView::Dense(src.data(), device_dtype, dims),
                                          device_dtype, RandomSemantics(rng()), &buffer,
                                          &device_bytes));
      Layout dst = MakeRandomLayout(rng(), dims, dst_dtype, LayoutOptions{}, DType::kU8);
      std::vector<std::byte> want = dst.memory.ToVector();
      const int64_t device_size = DTypeSize(device_dtype);
      int64_t i = 0;
      ForEachIndex(dst.dims, [&](absl::Span<const int64_t> index) {
        const int64_t offset = (dst.data - dst.memory.data()) + ByteOffset(index, dst.byte_strides);
        ConvertOneElement(device_dtype, device_bytes.data() + device_size * i++, dst_dtype,
                          want.data() + offset);
      });
      handles.push_back(
          std::make_shared<Data>(std::move(buffer), device_dtype, absl::StrFormat("tensor %d", k)));
      sources.push_back(std::move(src));
      views.push_back(DestinationView(dst, dst_dtype));
      destinations.push_back(std::move(dst));
      expected.push_back(std::move(want));
    }
    Future<> read = TransferFromDeviceInto(handles, views);
    handles.clear();  // the reads hold what they read
    CT_ASSERT_READY_OK(read);
    for (size_t k = 0; k < destinations.size(); ++k) {
      SCOPED_TRACE("destination " + std::to_string(k) + ": " +
                   Describe(views[k].dtype, views[k].dims, views[k].byte_strides));
      EXPECT_TRUE(BytesEqual(expected[k], destinations[k].memory.span()));
    }
  }
}

// TransferFromDeviceInto checks every destination before it starts any read: one bad destination
// in a batch fails the whole call, names its tensor, and leaves every destination unwritten.
TEST_P(ConformanceStrided, TransferFromDeviceIntoWritesNothingWhenADestinationIsBad) {
  if (!Holds({DType::kF32})) return;
  const std::vector<int64_t> dims = {6, 5};
  std::vector<DataPtr> handles;
  for (int k = 0; k < 3; ++k) {
    HostBytes src = RandomDenseTensor(rng(), DType::kF32, dims);
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer,
                            client().BufferFromHostBuffer(
                                HostView::Dense(src.data(), DType::kF32, dims), DType::kF32,
                                device(), HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
    handles.push_back(
        std::make_shared<Data>(std::move(buffer), DType::kF32, absl::StrFormat("tensor %d", k)));
  }
  struct BadCase {
    std::string what;
    Dims dims;
    DType dtype;
    absl::StatusCode code;
  };
  const BadCase cases[] = {
      {"other dims", {5, 6}, DType::kF32, absl::StatusCode::kInvalidArgument},
      {"an inconvertible dtype", {6, 5}, DType::kF8E4M3FN, absl::StatusCode::kUnimplemented},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.what);
    std::vector<HostBytes> memory;
    std::vector<MutableHostView> views;
    for (int k = 0; k < 3; ++k) {
      memory.emplace_back(4 * 30);
      FillRandom(rng(), DType::kU8, memory.back().span());
      views.push_back(k == 2 ? MutableHostView::Dense(memory.back().data(), bad.dtype, bad.dims)
                             : MutableHostView::Dense(memory.back().data(), DType::kF32, dims));
    }
    std::vector<std::vector<std::byte>> before;
    for (const HostBytes& each : memory) before.push_back(each.ToVector());
    const std::optional<Status> status = AwaitFor(TransferFromDeviceInto(handles, views));
    ASSERT_TRUE(status.has_value()) << "TransferFromDeviceInto never completed";
    EXPECT_EQ(status->code(), bad.code) << *status;
    EXPECT_NE(status->message().find("tensor 2"), std::string_view::npos) << *status;
    for (size_t k = 0; k < memory.size(); ++k) {
      EXPECT_TRUE(BytesEqual(before[k], memory[k].span())) << "destination " << k << " written";
    }
  }
  const std::optional<Status> count = AwaitFor(TransferFromDeviceInto(handles, {}));
  ASSERT_TRUE(count.has_value());
  EXPECT_EQ(count->code(), absl::StatusCode::kInvalidArgument) << *count;
}

// The named stride patterns, each on its own, over a few dtype pairs.
struct StridePattern {
  std::string name;
  std::vector<int64_t> memory_dims;  // dense memory the view selects from
  std::vector<int64_t> dims;
  // Strides in elements; the view starts at element `first_element` of the memory.
  std::vector<int64_t> element_strides;
  int64_t first_element = 0;
};

const std::pair<DType, DType> kPatternDTypePairs[] = {
    {DType::kF32, DType::kF32}, {DType::kF64, DType::kF32},  {DType::kF32, DType::kBF16},
    {DType::kU8, DType::kS32},  {DType::kC64, DType::kC128}, {DType::kBool, DType::kF16},
};

void ConformanceStrided::RunPattern(const StridePattern& pattern) {
  for (auto [src_dtype, device_dtype] : kPatternDTypePairs) {
    if (!device()->capabilities().Holds(device_dtype)) continue;
    SCOPED_TRACE(pattern.name);
    const int64_t element_size = DTypeSize(src_dtype);
    HostBytes memory = RandomDenseTensor(rng(), src_dtype, pattern.memory_dims);
    Dims byte_strides;
    for (int64_t stride : pattern.element_strides) byte_strides.push_back(stride * element_size);
    const HostView src(memory.data() + pattern.first_element * element_size, src_dtype,
                       Dims(pattern.dims.begin(), pattern.dims.end()), byte_strides);
    for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                          HostBufferSemantics::kImmutableUntilTransferCompletes,
                                          HostBufferSemantics::kImmutableZeroCopy}) {
      std::unique_ptr<Buffer> buffer;
      std::vector<std::byte> expected;
      ASSERT_NO_FATAL_FAILURE(PutAndCheck(src, device_dtype, semantics, &buffer, &expected));
      // And back out, into the source's own dtype through a strided destination.
      ASSERT_NO_FATAL_FAILURE(ReadIntoStridedAndCheck(*buffer, expected, src_dtype));
    }
  }
}

TEST_P(ConformanceStrided, TransposedSourceMatchesReference) {
  // A [3,4,5] tensor seen with its axes permuted to [5,3,4].
  RunPattern({"transposed", {3, 4, 5}, {5, 3, 4}, {1, 20, 5}});
}

TEST_P(ConformanceStrided, SteppedSliceSourceMatchesReference) {
  // Rows 1, 4, 7 and every second column from column 2 of a [9, 11] tensor.
  RunPattern({"stepped slice", {9, 11}, {3, 5}, {33, 2}, 11 + 2});
}

TEST_P(ConformanceStrided, NegativeStridesMatchReference) {
  // A [6, 7] tensor with both axes reversed ([::-1, ::-1]), and only the rows reversed.
  RunPattern({"both axes reversed", {6, 7}, {6, 7}, {-7, -1}, 6 * 7 - 1});
  RunPattern({"rows reversed", {6, 7}, {6, 7}, {-7, 1}, 5 * 7});
}

TEST_P(ConformanceStrided, BroadcastSourceMatchesReference) {
  // One row broadcast over 8 rows; one element broadcast over a [4, 3, 2] tensor.
  RunPattern({"row broadcast", {1, 10}, {8, 10}, {0, 1}});
  RunPattern({"scalar broadcast", {1}, {4, 3, 2}, {0, 0, 0}});
}

TEST_P(ConformanceStrided, RankZeroScalarMatchesReference) { RunPattern({"scalar", {1}, {}, {}}); }

TEST_P(ConformanceStrided, SizeOneDimsWithOddStridesMatchReference) {
  // Size-1 dims may carry any stride (numpy gives them arbitrary ones).
  RunPattern({"size-1 dims", {4, 6}, {1, 4, 1, 6, 1}, {12345, 6, -999, 1, 0}});
}

// Zero-size dims: a valid empty buffer; reads complete and write nothing.
TEST_P(ConformanceStrided, ZeroSizeDimsTransferNothing) {
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{0}, {4, 0, 3}, {0, 0}, {2, 3, 0}}) {
    SCOPED_TRACE(absl::StrJoin(dims, ","));
    HostBytes memory(64);
    FillRandom(rng(), DType::kU8, memory.span());
    const std::vector<std::byte> before = memory.ToVector();
    Dims strides;
    for (size_t i = 0; i < dims.size(); ++i) strides.push_back(i % 2 ? -8 : 24);
    const HostView src(memory.data() + 32, DType::kF64, Dims(dims.begin(), dims.end()), strides);
    std::unique_ptr<Buffer> buffer;
    std::vector<std::byte> expected;
    ASSERT_NO_FATAL_FAILURE(
        PutAndCheck(src, DType::kF32, HostBufferSemantics::kImmutableZeroCopy, &buffer, &expected));
    EXPECT_EQ(buffer->size_bytes(), 0);
    const MutableHostView dst(memory.data() + 32, DType::kS16, Dims(dims.begin(), dims.end()),
                              strides);
    CT_ASSERT_READY_OK(buffer->ToHost(dst));
    EXPECT_TRUE(BytesEqual(before, memory.span()));
  }
}

// Elements at unaligned addresses (a 1-byte-off data pointer, odd stride padding) are read and
// written byte-correctly: a HostView has no alignment requirement.
TEST_P(ConformanceStrided, UnalignedElementsMatchReference) {
  constexpr int kCases = 20;
  for (int n = 0; n < kCases; ++n) {
    SCOPED_TRACE(absl::StrFormat("case %d", n));
    const std::vector<int64_t> dims = {1 + int64_t(rng()() % 5), 1 + int64_t(rng()() % 7)};
    constexpr std::pair<DType, DType> kPairs[] = {
        {DType::kF32, DType::kF64}, {DType::kF64, DType::kF64},  {DType::kS16, DType::kF32},
        {DType::kS16, DType::kS16}, {DType::kC64, DType::kC128}, {DType::kC64, DType::kC64},
        {DType::kU32, DType::kU32}, {DType::kU32, DType::kS64},  {DType::kF64, DType::kBF16},
        {DType::kF32, DType::kF32}};
    const auto [src_dtype, device_dtype] = kPairs[n % std::size(kPairs)];
    if (!device()->capabilities().Holds(device_dtype)) continue;
    Layout src = MakeRandomLayout(rng(), dims, src_dtype, {.unaligned = true}, src_dtype);
    std::unique_ptr<Buffer> buffer;
    std::vector<std::byte> expected;
    ASSERT_NO_FATAL_FAILURE(PutAndCheck(SourceView(src, src_dtype), device_dtype,
                                        RandomSemantics(rng()), &buffer, &expected));
    Layout dst = MakeRandomLayout(rng(), dims, src_dtype, {.unaligned = true}, DType::kU8);
    std::vector<std::byte> dst_expected = dst.memory.ToVector();
    int64_t i = 0;
    ForEachIndex(dims, [&](absl::Span<const int64_t> index) {
      ConvertOneElement(device_dtype, expected.data() + DTypeSize(device_dtype) * i++, src_dtype,
                        dst_expected.data() + (dst.data - dst.memory.data()) +
                            ByteOffset(index, dst.byte_strides));
    });
    CT_ASSERT_READY_OK(buffer->ToHost(DestinationView(dst, src_dtype)));
    EXPECT_TRUE(BytesEqual(dst_expected, dst.memory.span()));
  }
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceStrided);

}  // namespace
}  // namespace ferry::conformance
