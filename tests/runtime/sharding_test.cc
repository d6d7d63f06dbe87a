#include "ferry/runtime/sharding.h"

#include <atomic>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>

#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/transfer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class ShardingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClientOptions options;
    options.num_devices = 8;
    client_ = CreateClient("host", options).value();
  }
  std::vector<Device*> Devices(int count) {
    auto all = client_->devices();
    return std::vector<Device*>(all.begin(), all.begin() + count);
  }
  std::unique_ptr<Client> client_;
};

std::shared_ptr<const TensorSource> Iota(DType dtype, std::vector<int64_t> dims) {
  HostTensor tensor = HostTensor::Allocate(dtype, dims).value();
  for (int64_t i = 0; i < tensor.size_bytes(); ++i) {
    tensor.data()[i] = static_cast<std::byte>(i * 131 + 7);
  }
  return TensorSource::FromHostTensor(std::move(tensor), "iota");
}

TEST_F(ShardingTest, InvalidMeshesAndSpecsAreInvalidArgument) {
  EXPECT_EQ(Mesh::Create(Devices(4), {2, 3}, {"x", "y"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mesh::Create(Devices(4), {2, 2}, {"x", "x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto devices = Devices(2);
  devices[1] = devices[0];
  EXPECT_EQ(Mesh::Create(devices, {2}, {"x"}).status().code(), absl::StatusCode::kInvalidArgument);

  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"x", "y"}).value();
  auto unknown = Sharding::Create(mesh, {{"z"}, {}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("'z'"));
  EXPECT_EQ(Sharding::Create(mesh, {{"x"}, {"x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  Sharding sharding = Sharding::Create(mesh, {{"x"}, {"y"}}).value();
  // A spec longer than the rank (a shorter one is padded: below).
  auto longer = sharding.ShardIndices({4});
  EXPECT_EQ(longer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(longer.status().message()), HasSubstr("rank 1"));
}

// As JAX pads a PartitionSpec with None: the dims a short spec does not reach are replicated.
TEST_F(ShardingTest, ShortSpecsReplicateTheDimsTheyDoNotReach) {
  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"x", "y"}).value();
  Sharding short_spec = Sharding::Create(mesh, {{"x"}}).value();
  Sharding padded = Sharding::Create(mesh, {{"x"}, {}, {}}).value();
  auto indices = short_spec.ShardIndices({4, 6, 2}).value();
  EXPECT_EQ(indices, padded.ShardIndices({4, 6, 2}).value());
  EXPECT_EQ(indices[2], (ShardIndex{{2, 4}, {0, 6}, {0, 2}}));  // x=1, y=0
  Sharding empty_spec = Sharding::Create(mesh, {}).value();
  const std::vector<ShardIndex> replicated = empty_spec.ShardIndices({3, 5}).value();
  ASSERT_EQ(replicated.size(), 4u);
  for (const ShardIndex& index : replicated) {
    EXPECT_EQ(index, (ShardIndex{{0, 3}, {0, 5}}));
  }
}

// AssembleShardsInto: every distinct shard read straight into its part of the caller's strided
// (here transposed) view of the whole; a view of other dims is refused before any read.
TEST_F(ShardingTest, AssembleShardsIntoFillsACallerStridedView) {
  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"x", "y"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"x"}}).value();  // replicated over y
  auto source = Iota(DType::kS32, {6, 5});
  const HostView& whole = source->view();
  auto data = TransferShardsToDevice(source, sharding).value();
  // A transposed destination: element (i, j) at byte (j * 6 + i) * 4 of a 5 x 6 buffer.
  std::vector<int32_t> memory(30, -1);
  const MutableHostView dst(memory.data(), DType::kS32, {6, 5}, {4, 6 * 4});
  ASSERT_TRUE(AssembleShardsInto(*data, dst).Await().ok());
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      int32_t want;
      std::memcpy(&want, static_cast<const std::byte*>(whole.data) + (i * 5 + j) * 4, 4);
      EXPECT_EQ(memory[j * 6 + i], want) << i << "," << j;
    }
  }
  std::vector<int32_t> untouched(30, -1);
  const Status wrong =
      AssembleShardsInto(*data, MutableHostView::Dense(untouched.data(), DType::kS32, {5, 6}))
          .Await();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(untouched, std::vector<int32_t>(30, -1));
}

TEST_F(ShardingTest, UnevenDimsGiveSmallerOrEmptyTrailingShards) {
  Mesh mesh = Mesh::Create(Devices(4), {4}, {"x"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"x"}}).value();
  auto ten = sharding.ShardIndices({10}).value();
  EXPECT_EQ(ten, (std::vector<ShardIndex>{{{0, 3}}, {{3, 6}}, {{6, 9}}, {{9, 10}}}));
  auto five = sharding.ShardIndices({5}).value();
  EXPECT_EQ(five, (std::vector<ShardIndex>{{{0, 2}}, {{2, 4}}, {{4, 5}}, {{5, 5}}}));
}

TEST_F(ShardingTest, DimsNear2To63GiveInRangeShards) {
  // ceil(n / ways) and shard * chunk overflowed int64 for n near 2^63: negative ranges.
  Mesh mesh = Mesh::Create(Devices(4), {4}, {"x"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"x"}}).value();
  const int64_t n = INT64_MAX;
  const int64_t chunk = n / 4 + 1;
  auto indices = sharding.ShardIndices({n}).value();
  EXPECT_EQ(indices,
            (std::vector<ShardIndex>{
                {{0, chunk}}, {{chunk, 2 * chunk}}, {{2 * chunk, 3 * chunk}}, {{3 * chunk, n}}}));
}

TEST_F(ShardingTest, AwaitReadyRefusesANullHandle) {
  // ShardedData::shards() holds null for another process's shards: AwaitReady says so.
  const Status status = AwaitReady({nullptr});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

TEST_F(ShardingTest, UnnamedMeshAxesReplicate) {
  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"x", "y"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"y"}, {}}).value();
  auto indices = sharding.ShardIndices({4, 3}).value();
  // Devices (0,0) and (1,0) hold rows 0-1; (0,1) and (1,1) rows 2-3; columns are whole.
  EXPECT_EQ(indices[0], (ShardIndex{{0, 2}, {0, 3}}));
  EXPECT_EQ(indices[1], (ShardIndex{{2, 4}, {0, 3}}));
  EXPECT_EQ(indices[2], indices[0]);
  EXPECT_EQ(indices[3], indices[1]);
}

TEST_F(ShardingTest, MultipleAxesOnOneDimSplitMajorToMinor) {
  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"x", "y"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"y", "x"}}).value();
  auto indices = sharding.ShardIndices({8}).value();
  // Shard number = y * 2 + x; device order is row-major over (x, y).
  EXPECT_EQ(indices[0], (ShardIndex{{0, 2}}));  // x=0,y=0 -> 0
  EXPECT_EQ(indices[1], (ShardIndex{{4, 6}}));  // x=0,y=1 -> 2
  EXPECT_EQ(indices[2], (ShardIndex{{2, 4}}));  // x=1,y=0 -> 1
  EXPECT_EQ(indices[3], (ShardIndex{{6, 8}}));  // x=1,y=1 -> 3
}

TEST_F(ShardingTest, ShardsAreSentFromSubViewsAndReleaseTheSourceOnceAfterTheLast) {
  ResetMetrics();
  std::atomic<int> released{0};
  auto owner = std::shared_ptr<std::vector<float>>(new std::vector<float>(64 * 64),
                                                   [&](std::vector<float>* p) {
                                                     released++;
                                                     delete p;
                                                   });
  std::iota(owner->begin(), owner->end(), 0.0f);
  const float* base = owner->data();
  auto source = TensorSource::Borrow(HostView::Dense(base, DType::kF32, {64, 64}), base,
                                     64 * 64 * 4, owner, "weights")
                    .value();
  owner.reset();
  Mesh mesh = Mesh::Create(Devices(4), {2, 2}, {"rows", "cols"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"rows"}, {"cols"}}).value();
  TransferToDeviceOptions options;
  options.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  auto data = TransferShardsToDevice(std::move(source), sharding, options).value();
  ASSERT_TRUE(AwaitReady(data->shards()).ok());
  EXPECT_EQ(released.load(), 1);
  EXPECT_EQ(GetCounter("StagingBytes")->Value(), 0);
  auto shards = LocalShards(*data).value();
  ASSERT_EQ(shards.size(), 4u);
  // Device (1, 0): rows 32..63, columns 0..31.
  EXPECT_EQ(shards[2].index, (ShardIndex{{32, 64}, {0, 32}}));
  const float* shard = reinterpret_cast<const float*>(shards[2].data.data());
  EXPECT_EQ(shard[0], 32 * 64);
  EXPECT_EQ(shard[31 * 32 + 31], 63 * 64 + 31);
  EXPECT_EQ(shards[2].device, client_->devices()[2]);
}

TEST_F(ShardingTest, MakeArrayFromShardsChecksDimsAndAssembles) {
  Mesh mesh = Mesh::Create(Devices(2), {2}, {"x"}).value();
  Sharding sharding = Sharding::Create(mesh, {{"x"}, {}}).value();
  auto wrong =
      MakeArrayFromShards({5, 3}, sharding, {Iota(DType::kS32, {3, 3}), Iota(DType::kS32, {3, 3})});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  auto data = MakeArrayFromCallback({5, 3}, sharding, [](const ShardIndex& index) {
                auto tensor = HostTensor::Allocate(DType::kS32, {index[0].size(), 3}).value();
                auto* values = reinterpret_cast<int32_t*>(tensor.data());
                for (int64_t r = 0; r < index[0].size(); ++r) {
                  for (int c = 0; c < 3; ++c) values[r * 3 + c] = (index[0].begin + r) * 10 + c;
                }
                return StatusOr<std::shared_ptr<const TensorSource>>(
                    TensorSource::FromHostTensor(std::move(tensor)));
              }).value();
  HostTensor whole = AssembleShards(*data).value();
  auto* values = reinterpret_cast<const int32_t*>(whole.data());
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(values[r * 3 + c], r * 10 + c);
  }
}

// Random meshes (1-d to 3-d, up to 8 devices), specs and uneven shapes, on strided sources:
// every shard equals the naive slice of the source, and assembling gives the source back.
TEST_F(ShardingTest, RandomMeshesSpecsAndShapesRoundTripBitExact) {
  const uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << "\n";
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int mesh_rank = 1 + static_cast<int>(rng() % 3);
    std::vector<int64_t> mesh_shape;
    int64_t devices = 1;
    for (int a = 0; a < mesh_rank; ++a) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 3);
      if (devices * size > 8) break;
      mesh_shape.push_back(size);
      devices *= size;
    }
    std::vector<std::string> names;
    for (size_t a = 0; a < mesh_shape.size(); ++a) names.push_back("a" + std::to_string(a));
    Mesh mesh = Mesh::Create(Devices(static_cast<int>(devices)), mesh_shape, names).value();
    const int rank = 1 + static_cast<int>(rng() % 3);
    std::vector<std::vector<std::string>> spec(rank);
    for (const std::string& name : names) {
      if (rng() % 3 != 0) spec[rng() % rank].push_back(name);
    }
    Sharding sharding = Sharding::Create(mesh, spec).value();
    std::vector<int64_t> dims;
    for (int d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(rng() % 9));
    const DType dtype =
        std::vector<DType>{DType::kU8, DType::kS16, DType::kF32, DType::kC128}[rng() % 4];
    // A transposed source: reverse the dims of a dense tensor.
    std::vector<int64_t> reversed(dims.rbegin(), dims.rend());
    auto dense = Iota(dtype, reversed);
    HostView transposed = dense->view();
    std::reverse(transposed.dims.begin(), transposed.dims.end());
    std::reverse(transposed.byte_strides.begin(), transposed.byte_strides.end());
    auto source = TensorSource::Borrow(transposed, dense->view().data,
                                       dense->view().dense_size_bytes(), dense, "t")
                      .value();
    auto data = TransferShardsToDevice(source, sharding).value();
    auto shards = LocalShards(*data).value();
    for (const LocalShard& shard : shards) {
      HostTensor expected = HostTensor::Allocate(dtype, shard.data.dims()).value();
      ASSERT_TRUE(CopyConvert(SubView(transposed, shard.index), expected.mutable_view()).ok());
      ASSERT_EQ(0, std::memcmp(expected.data(), shard.data.data(), expected.size_bytes()));
    }
    HostTensor whole = AssembleShards(*data).value();
    HostTensor expected = HostTensor::Allocate(dtype, dims).value();
    ASSERT_TRUE(CopyConvert(transposed, expected.mutable_view()).ok());
    ASSERT_EQ(0, std::memcmp(expected.data(), whole.data(), expected.size_bytes()));
  }
}

}  // namespace
}  // namespace ferry
