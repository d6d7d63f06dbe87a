// The process group, global devices and sharding across processes. ctest runs this executable
// alone (one process) and under `mpiexec -n 2` and `-n 4` (tests/CMakeLists.txt): every rank runs
// every test, and each test's collective calls are the same on every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "ferry/core/copy_convert.h"
#include "ferry/core/settings.h"
#include "ferry/device/registry.h"
#include "ferry/distributed/global_devices.h"
#include "ferry/distributed/process_group.h"
#include "ferry/io/tensor_file.h"
#include "ferry/io/tensor_writer.h"
#include "ferry/runtime/sharding.h"
#include "fmt/format.h"
#include "src/distributed/mpi_process_group.h"

namespace ferry {
namespace {

using distributed::CurrentProcessGroup;
using distributed::GlobalDevices;
using distributed::ProcessGroup;

constexpr int kLocalDevices = 2;

ProcessGroup& Group() { return CurrentProcessGroup(); }

// One host client per process for the whole run (devices must outlive the global tables).
Client& HostClient() {
  static Client* client = [] {
    ClientOptions options;
    options.num_devices = kLocalDevices;
    return CreateClient("host", options).value().release();
  }();
  return *client;
}

std::shared_ptr<const GlobalDevices> Global() {
  static std::shared_ptr<const GlobalDevices> global = [] {
    return GlobalDevices::Gather(Group(), "host", HostClient().devices()).value();
  }();
  return global;
}

// The same random bytes on every rank (seeded by `seed` alone); bool as 0/1.
HostTensor RandomTensor(DType dtype, const Dims& dims, uint32_t seed) {
  HostTensor tensor = HostTensor::Allocate(dtype, dims).value();
  std::mt19937 random(seed);
  auto* bytes = reinterpret_cast<unsigned char*>(tensor.data());
  for (int64_t i = 0; i < tensor.size_bytes(); ++i) {
    bytes[i] = dtype == DType::kBool ? random() % 2 : static_cast<unsigned char>(random());
  }
  return tensor;
}

// What `view` holds at `index`, dense.
HostTensor Slice(const HostView& view, const ShardIndex& index) {
  HostView part = SubView(view, index);
  HostTensor dense = HostTensor::Allocate(view.dtype, part.dims).value();
  EXPECT_TRUE(CopyConvert(part, dense.mutable_view()).ok());
  return dense;
}

bool SameBytes(const HostTensor& a, const HostTensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size_bytes())) == 0;
}

// Checks every local shard of `data` against slicing `expected`; returns how many it checked.
int CheckLocalShards(const ShardedData& data, const HostView& expected) {
  auto shards = LocalShards(data);
  EXPECT_TRUE(shards.ok()) << shards.status();
  if (!shards.ok()) return 0;
  for (const LocalShard& shard : *shards) {
    EXPECT_TRUE(shard.device->is_addressable());
    EXPECT_TRUE(SameBytes(shard.data, Slice(expected, shard.index)))
        << "shard on " << shard.device->name();
  }
  return static_cast<int>(shards->size());
}

TEST(ProcessGroup, RankAndSizeMatchTheLauncher) {
  const char* size = std::getenv("PMI_SIZE");
  EXPECT_EQ(Group().size(), size == nullptr ? 1 : std::atoi(size));
  EXPECT_GE(Group().rank(), 0);
  EXPECT_LT(Group().rank(), Group().size());
  EXPECT_EQ(Group().engine(), size == nullptr ? "single" : "mpi");
}

TEST(ProcessGroup, AllGatherReturnsEveryRanksBytesInRankOrder) {
  // Sizes differ by rank (including empty) to exercise the variable-length gather.
  const std::string mine(static_cast<size_t>(Group().rank() * 3),
                         static_cast<char>('a' + Group().rank()));
  auto all = Group().AllGather(mine, "test gather");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), static_cast<size_t>(Group().size()));
  for (int rank = 0; rank < Group().size(); ++rank) {
    EXPECT_EQ((*all)[rank],
              std::string(static_cast<size_t>(rank * 3), static_cast<char>('a' + rank)));
  }
  EXPECT_TRUE(Group().Barrier("test barrier").ok());
}

TEST(ProcessGroup, EveryRankGetsTheSameErrorNamingTheFailingRank) {
  const int last = Group().size() - 1;
  const Status local =
      Group().rank() == last ? absl::NotFoundError("no such file 'x'") : OkStatus();
  const Status agreed = distributed::AgreeOnStatus(Group(), local, "opening x");
  EXPECT_EQ(agreed.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      std::string(agreed.message()),
      fmt::format("rank {} of {} failed during opening x: no such file 'x'", last, Group().size()));
  EXPECT_TRUE(distributed::AgreeOnStatus(Group(), OkStatus(), "nothing").ok());
}

TEST(ProcessGroup, AValueThatDiffersBetweenRanksIsAnErrorOnEveryRank) {
  EXPECT_TRUE(distributed::AgreeOnValue(Group(), "mesh 4x2", "the mesh").ok());
  const Status differs =
      distributed::AgreeOnValue(Group(), Group().rank() == 0 ? "mesh 4x2" : "mesh 2x4", "the mesh");
  if (Group().size() == 1) {
    EXPECT_TRUE(differs.ok());
  } else {
    EXPECT_EQ(differs.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(differs.message()).substr(0, 38),
              "the mesh differs between ranks 0 and 1")
        << differs;
    EXPECT_NE(std::string(differs.message()).find("\nfirst at character 6:\n"), std::string::npos)
        << differs;
    EXPECT_NE(std::string(differs.message()).find("\n  rank 0: mesh 4x2\n  rank 1: mesh 2x4\n"),
              std::string::npos)
        << differs;
  }
}

// A process group of `values.size()` ranks in this one process, seen from rank 0: its AllGather
// returns `values` (rank 0's own value is what the caller passes, checked against values[0]).
class FakeGroup final : public ProcessGroup {
 public:
  explicit FakeGroup(std::vector<std::string> values) : values_(std::move(values)) {}
  std::string_view engine() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(values_.size()); }
  Status Barrier(std::string_view) override { return OkStatus(); }
  StatusOr<std::vector<std::string>> AllGather(std::string_view local, std::string_view) override {
    EXPECT_EQ(local, values_[0]);
    return values_;
  }

 private:
  std::vector<std::string> values_;
};

std::vector<std::string> MessageLines(const Status& status) {
  std::vector<std::string> lines;
  std::string message(status.message());
  for (size_t begin = 0; begin <= message.size();) {
    const size_t end = std::min(message.find('\n', begin), message.size());
    lines.push_back(message.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

// Issue 28: a plan of many tensors that differed in one field gave one line of thousands of
// characters holding both plans. The message names the field and the ranks, and stays short.
TEST(AgreeOnValue, NamesTheFirstFieldThatDiffersAndTheRanksOnShortLines) {
  std::string plan;
  for (int t = 0; t < 200; ++t) {
    plan +=
        fmt::format("model.layers.{}.mlp.up_proj.weight: float32 [4096,1024] devices [0,1]\n", t);
  }
  std::string other = plan;
  const std::string field = "model.layers.117.mlp.up_proj.weight";
  const size_t at = other.find(field + ": float32 [4096,1024] devices [0,1]");
  ASSERT_NE(at, std::string::npos);
  other.replace(other.find("[0,1]", at), 5, "[1,0]");
  FakeGroup group({plan, plan, other, plan, other});
  const Status differs = distributed::AgreeOnValue(group, plan, "the tensors and their shardings");
  ASSERT_EQ(differs.code(), absl::StatusCode::kInvalidArgument) << differs;
  const std::vector<std::string> lines = MessageLines(differs);
  ASSERT_EQ(lines.size(), 6u) << differs;
  EXPECT_EQ(lines[0], "the tensors and their shardings differs between ranks 0 and 2");
  EXPECT_EQ(lines[1], "(rank 4 differs from rank 0 too)");
  EXPECT_EQ(lines[2], "first in " + field + ":");
  EXPECT_EQ(lines[3], "  rank 0: float32 [4096,1024] devices [0,1]");
  EXPECT_EQ(lines[4], "  rank 2: float32 [4096,1024] devices [1,0]");
  EXPECT_EQ(lines[5], std::string(lines[3].find("[0,1]") + 1, ' ') + "^");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 80u) << line;
  EXPECT_LT(differs.message().size(), 400u);
}

TEST(AgreeOnValue, ALongLineIsCutAroundItsFirstDifference) {
  // One line of 5000 characters (no fields): the excerpt around the difference, under 80 columns.
  std::string ours(5000, 'a');
  for (size_t i = 0; i < ours.size(); i += 7) ours[i] = static_cast<char>('b' + i % 20);
  std::string theirs = ours;
  theirs[2345] = '#';
  FakeGroup group({ours, theirs});
  const Status differs = distributed::AgreeOnValue(group, ours, "the plan");
  ASSERT_FALSE(differs.ok());
  const std::vector<std::string> lines = MessageLines(differs);
  ASSERT_EQ(lines.size(), 5u) << differs;
  EXPECT_EQ(lines[0], "the plan differs between ranks 0 and 1");
  EXPECT_EQ(lines[1], "first at character 2346:");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 80u) << line;
  const size_t caret = lines[4].find('^');
  ASSERT_NE(caret, std::string::npos);
  EXPECT_EQ(lines[2][caret], ours[2345]);
  EXPECT_EQ(lines[3][caret], '#');
  EXPECT_EQ(lines[2].substr(10, caret - 10), lines[3].substr(10, caret - 10));
  EXPECT_NE(lines[2].find("..."), std::string::npos);
  // The same bytes either side of the difference as the values hold.
  EXPECT_NE(ours.find(lines[2].substr(13, caret - 13)), std::string::npos);
}

// Characters, not bytes: the count and the caret of a difference after multi-byte characters
// (two columns for each wide one, as a terminal shows it).
TEST(AgreeOnValue, CountsCharactersAndPlacesTheCaretUnderWideOnes) {
  const std::string ours = "\u6743\u91cd\u6743\u91cd.a";  // four CJK characters, then ".a"
  const std::string theirs = "\u6743\u91cd\u6743\u91cd.b";
  FakeGroup group({ours, theirs});
  const Status differs = distributed::AgreeOnValue(group, ours, "the names");
  const std::vector<std::string> lines = MessageLines(differs);
  ASSERT_EQ(lines.size(), 5u) << differs;
  EXPECT_EQ(lines[1], "first at character 6:");
  // "  rank 0: " is 10 columns, the four wide characters 8 and the "." one.
  EXPECT_EQ(lines[4], std::string(19, ' ') + "^");
}

// An agreement carries each rank's step: ranks at different steps are told so, the same error on
// every rank, instead of agreeing on the other step's outcome.
TEST(AgreeOnStatus, RanksAtDifferentStepsAreToldSo) {
  auto entry = [](std::string_view step, const std::string& status) {
    return fmt::format("{}:{}{}", step.size(), step, status);
  };
  FakeGroup same({entry("loop", "0\n"), entry("loop", "0\n")});
  EXPECT_TRUE(distributed::AgreeOnStatus(same, OkStatus(), "loop").ok());
  FakeGroup apart({entry("loop", "0\n"), entry("after", "0\n")});
  const Status differs = distributed::AgreeOnStatus(apart, OkStatus(), "loop");
  EXPECT_EQ(differs.code(), absl::StatusCode::kFailedPrecondition) << differs;
  EXPECT_NE(differs.message().find("rank 0 at 'loop', rank 1 at 'after'"), std::string::npos)
      << differs;
  FakeGroup one_other({entry("s", "0\n"), entry("s", "5\nmissing"), entry("s", "5\ngone")});
  const Status failed = distributed::AgreeOnStatus(one_other, OkStatus(), "s");
  EXPECT_EQ(failed.code(), absl::StatusCode::kNotFound) << failed;
  EXPECT_NE(failed.message().find("(rank 2 failed too)"), std::string::npos) << failed;
}

TEST(AgreeOnValue, ValuesOfDifferentLengthAndManyRanks) {
  std::vector<std::string> values(20, "x: 1");
  for (int rank = 3; rank < 20; rank += 1) values[static_cast<size_t>(rank)] = "x: 1\ny: 2";
  FakeGroup group(values);
  const Status differs = distributed::AgreeOnValue(group, values[0], "what");
  const std::vector<std::string> lines = MessageLines(differs);
  ASSERT_EQ(lines.size(), 6u) << differs;
  EXPECT_EQ(lines[0], "what differs between ranks 0 and 3");
  EXPECT_EQ(lines[1], "(ranks 4, 5, 6, 7, 8, 9, 10, 11 and 8 more differ from rank 0 too)");
  EXPECT_EQ(lines[2], "first on line 2, at character 1:");
  EXPECT_EQ(lines[3], "  rank 0: ");
  EXPECT_EQ(lines[4], "  rank 3: y: 2");
}

TEST(ProcessGroup, AllReduceSumAddsEveryRanksValues) {
  auto sums = distributed::AllReduceSum(
      Group(), {static_cast<uint64_t>(Group().rank() + 1), ~uint64_t{0}}, "sum");
  ASSERT_TRUE(sums.ok()) << sums.status();
  const uint64_t n = static_cast<uint64_t>(Group().size());
  EXPECT_EQ((*sums)[0], n * (n + 1) / 2);
  EXPECT_EQ((*sums)[1], ~uint64_t{0} * n);  // wraps
}

// Item 8 of issue 25: a collective that gave up (here: its deadline) must not free the buffers MPI
// may still write a late peer's data into. On a group of its own (the process-wide one must stay
// whole for the other tests), the last rank joins an all-gather after the others gave up on its
// first step (the sizes); the early ranks' group keeps that step's buffers after AllGather
// returned, and releases them once MPI completes it, which the late rank's arrival allows (the
// process-wide barrier below drives MPI's progress). The late rank then waits in the second step,
// which no rank will ever join: its group keeps that one for good.
TEST(ProcessGroup, ATimedOutCollectiveKeepsItsBuffersUntilMpiHasCompletedIt) {
  if (Group().size() == 1) GTEST_SKIP() << "needs mpiexec: a one-process group never waits";
  ASSERT_TRUE(Group().Barrier("before the side group").ok());
  auto side = distributed::internal::MakeMpiProcessGroup();
  ASSERT_TRUE(side.ok()) << side.status();
  const bool late = Group().rank() == Group().size() - 1;
  ASSERT_TRUE(SetSetting("FERRY_DISTRIBUTED_TIMEOUT_S", "2").ok());
  if (late) std::this_thread::sleep_for(std::chrono::seconds(6));
  auto gathered = (*side)->AllGather(std::string(1000, 'x'), "the late gather");
  EXPECT_EQ(gathered.status().code(), absl::StatusCode::kDeadlineExceeded) << gathered.status();
  if (!late) {
    EXPECT_EQ(distributed::internal::AbandonedCollectivesForTesting(**side), 1)
        << "the timed-out step's buffers were released while MPI still held its request";
  }
  ASSERT_TRUE(ClearSetting("FERRY_DISTRIBUTED_TIMEOUT_S").ok());
  ASSERT_TRUE(Group().Barrier("after the late gather").ok());
  if (late) {
    EXPECT_EQ(distributed::internal::AbandonedCollectivesForTesting(**side), 1);
  } else {
    // MPI completes the early ranks' step once the late rank has joined it; the bound only
    // detects a step that never completes (a hang), it measures nothing.
    int abandoned = distributed::internal::AbandonedCollectivesForTesting(**side);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (abandoned != 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      abandoned = distributed::internal::AbandonedCollectivesForTesting(**side);
    }
    EXPECT_EQ(abandoned, 0) << "MPI never completed the step the late rank joined";
  }
  ASSERT_TRUE(Group().Barrier("after the side group").ok());
}

TEST(GlobalDevices, ListEveryProcessesDevicesInProcessOrder) {
  auto global = Global();
  ASSERT_EQ(global->devices().size(), static_cast<size_t>(kLocalDevices * Group().size()));
  for (size_t id = 0; id < global->devices().size(); ++id) {
    Device* device = global->devices()[id];
    const int process = static_cast<int>(id) / kLocalDevices;
    EXPECT_EQ(global->ProcessIndexOf(device), process);
    EXPECT_EQ(global->GlobalIdOf(device), static_cast<int64_t>(id));
    EXPECT_EQ(device->index(), static_cast<int>(id) % kLocalDevices);
    EXPECT_EQ(device->is_addressable(), process == Group().rank());
    if (process == Group().rank()) {
      EXPECT_EQ(device, HostClient().devices()[id % kLocalDevices]);
    } else {
      EXPECT_EQ(device->client(), nullptr);
      EXPECT_TRUE(device->capabilities().Holds(DType::kF64));
    }
  }
  const auto local = HostClient().devices();
  EXPECT_EQ(global->local_devices(), std::vector<Device*>(local.begin(), local.end()));
}

// Issue 28: every process names its devices from 0, so in a job of several processes a device's
// name in the job carries its process; in a job of one it is the device's own name.
// A job of two processes in one (rank 0 of 2; rank 1 lists the same devices as this one): its
// devices are this process's p0/host:0, p0/host:1 and the RemoteDevices p1/host:0, p1/host:1. No
// collective: the same on every rank of an mpiexec run.
class FakeTwoProcesses final : public ProcessGroup {
 public:
  std::string_view engine() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Barrier(std::string_view) override { return OkStatus(); }
  StatusOr<std::vector<std::string>> AllGather(std::string_view local, std::string_view) override {
    return std::vector<std::string>{std::string(local), std::string(local)};
  }
};

std::shared_ptr<const GlobalDevices> FakeTwoProcessJob() {
  FakeTwoProcesses two_processes;
  return GlobalDevices::Gather(two_processes, "host", HostClient().devices()).value();
}

TEST(GlobalDevices, NamesInAJobCarryTheirProcess) {
  auto global = Global();
  for (Device* device : global->devices()) {
    EXPECT_EQ(global->NameOf(device),
              Group().size() == 1
                  ? device->name()
                  : fmt::format("p{}/{}", global->ProcessIndexOf(device), device->name()));
    // Without the table (the process-wide group is the one the table was gathered over).
    EXPECT_EQ(distributed::NameInJob(*device), global->NameOf(device));
  }
  EXPECT_EQ(global->NameOf(nullptr), "");
  auto job = FakeTwoProcessJob();
  std::vector<std::string> names;
  for (Device* device : job->devices()) names.push_back(job->NameOf(device));
  EXPECT_EQ(names, (std::vector<std::string>{"p0/host:0", "p0/host:1", "p1/host:0", "p1/host:1"}));
  // Another process's device carries its process without the table too.
  EXPECT_EQ(distributed::NameInJob(*job->devices()[2]), "p1/host:0");
  EXPECT_EQ(distributed::NameInJob(*job->devices()[3]), "p1/host:1");
  // Device::name() itself is unchanged: the API's own names stay the client's.
  EXPECT_EQ(job->devices()[2]->name(), "host:0");
}

// Every process has a host:0: a mesh's errors name a device that spans processes by its name in
// the job, so the message says which process's host:0 it means.
TEST(ShardingAcrossProcesses, MeshErrorsNameDevicesWithTheirProcess) {
  auto job = FakeTwoProcessJob();
  Device* remote = job->devices()[2];  // p1/host:0
  auto twice = Mesh::Create({remote, job->devices()[0], remote}, {3}, {"x"});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(twice.status().message()), "device p1/host:0 appears twice in the mesh");

  auto mesh = Mesh::Create(job->devices(), {4}, {"x"}).value();
  auto sharding = Sharding::Create(mesh, {{"x"}, {}}).value();
  HostTensor tensor = RandomTensor(DType::kF32, {8, 3}, 28);
  auto source = TensorSource::FromHostTensor(std::move(tensor), "random");
  auto data = TransferShardsToDevice(source, sharding);
  ASSERT_TRUE(data.ok()) << data.status();
  auto whole = AssembleShards(**data);
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(whole.status().message())
                .find("shard 2 [4:6, 0:3] lives only on device p1/host:0 of another process"),
            std::string::npos)
      << whole.status();
}

// Every dtype, uneven shapes, a 1-d mesh over every device of every process: each process holds
// exactly its devices' shards, bit for bit.
TEST(ShardingAcrossProcesses, EveryDtypeUnevenShapesMatchSlicing) {
  auto global = Global();
  auto mesh =
      Mesh::Create(global->devices(), {static_cast<int64_t>(global->devices().size())}, {"all"})
          .value();
  auto sharding = Sharding::Create(mesh, {{"all"}, {}}).value();
  int checked = 0;
  for (DType dtype : DeviceCapabilities::All().HeldDTypes()) {
    HostTensor tensor = RandomTensor(dtype, {2 * mesh.size() + 3, 5}, static_cast<uint32_t>(dtype));
    const HostView view = tensor.view();
    auto source = TensorSource::FromHostTensor(std::move(tensor), "random");
    auto data = TransferShardsToDevice(source, sharding);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ((*data)->is_fully_addressable(), Group().size() == 1);
    checked += CheckLocalShards(**data, view);
    for (size_t i = 0; i < (*data)->shards().size(); ++i) {
      EXPECT_EQ((*data)->shards()[i] != nullptr, mesh.devices()[i]->is_addressable());
    }
    if (Group().size() > 1) {
      auto whole = AssembleShards(**data);
      EXPECT_EQ(whole.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(std::string(whole.status().message()).find("another process"), std::string::npos);
      // The first shard this process lacks is on rank 0's first neighbour: p1/host:0 or p0/host:0.
      const std::string device = fmt::format("device p{}/host:0 ", Group().rank() == 0 ? 1 : 0);
      EXPECT_NE(std::string(whole.status().message()).find(device), std::string::npos)
          << whole.status();
    }
  }
  EXPECT_EQ(checked,
            static_cast<int>(DeviceCapabilities::All().HeldDTypes().size()) * kLocalDevices);
}

// A 2-d mesh (process x local device), a strided (transposed) source, and replication: a tensor
// replicated over the mesh is whole on every process, so AssembleShards works everywhere.
TEST(ShardingAcrossProcesses, MultiAxisMeshStridedSourceAndReplication) {
  auto global = Global();
  auto mesh =
      Mesh::Create(global->devices(), {Group().size(), kLocalDevices}, {"proc", "local"}).value();
  HostTensor tensor = RandomTensor(DType::kF32, {11, 7, 3}, 99);
  HostView transposed = tensor.view();
  std::swap(transposed.dims[0], transposed.dims[2]);
  std::swap(transposed.byte_strides[0], transposed.byte_strides[2]);
  auto source =
      TensorSource::Borrow(transposed, tensor.data(), tensor.size_bytes(), nullptr, "transposed")
          .value();
  auto split = Sharding::Create(mesh, {{"local"}, {"proc"}, {}}).value();
  auto data = TransferShardsToDevice(source, split);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(CheckLocalShards(**data, transposed), kLocalDevices);

  auto replicated = Sharding::Create(mesh, {{}, {}, {}}).value();
  auto copies = TransferShardsToDevice(source, replicated);
  ASSERT_TRUE(copies.ok()) << copies.status();
  auto whole = AssembleShards(**copies);
  ASSERT_TRUE(whole.ok()) << whole.status();
  HostTensor expected = Slice(transposed, {{0, 3}, {0, 7}, {0, 11}});
  EXPECT_TRUE(SameBytes(*whole, expected));
}

TEST(ShardingAcrossProcesses, MakeArrayFromCallbackAsksOnlyForLocalShards) {
  auto global = Global();
  auto mesh =
      Mesh::Create(global->devices(), {static_cast<int64_t>(global->devices().size())}, {"all"})
          .value();
  auto sharding = Sharding::Create(mesh, {{"all"}}).value();
  HostTensor tensor = RandomTensor(DType::kS64, {3 * mesh.size()}, 5);
  const HostView view = tensor.view();
  int calls = 0;
  auto data = MakeArrayFromCallback(
      {3 * mesh.size()}, sharding,
      [&](const ShardIndex& index) -> StatusOr<std::shared_ptr<const TensorSource>> {
        ++calls;
        return TensorSource::FromHostTensor(Slice(view, index));
      });
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(calls, kLocalDevices);
  EXPECT_EQ(CheckLocalShards(**data, view), kLocalDevices);
}

// A checkpoint written by rank 0 and mapped by every rank: each sends only its shards, straight
// from the mapping.
TEST(ShardingAcrossProcesses, ShardedCheckpointFromAMappedFile) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("ferry_distributed_test_{}.safetensors",
                                        std::getenv("PMI_SIZE") ? std::getenv("PMI_SIZE") : "1"))
                               .string();
  HostTensor a = RandomTensor(DType::kBF16, {17, 4}, 1);
  HostTensor b = RandomTensor(DType::kU8, {5}, 2);
  Status written =
      Group().rank() == 0 ? WriteSafetensors(path, {{"a", a.view()}, {"b", b.view()}}) : OkStatus();
  ASSERT_TRUE(distributed::AgreeOnStatus(Group(), written, "writing").ok());
  auto file = TensorFile::Open(path);
  ASSERT_TRUE(distributed::AgreeOnStatus(Group(), file.status(), "opening").ok());
  auto global = Global();
  auto mesh =
      Mesh::Create(global->devices(), {static_cast<int64_t>(global->devices().size())}, {"all"})
          .value();
  auto split = Sharding::Create(mesh, {{"all"}, {}}).value();
  auto data = TransferShardsToDevice(file->Find("a")->source, split);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(CheckLocalShards(**data, a.view()), kLocalDevices);
  auto replicated =
      TransferShardsToDevice(file->Find("b")->source, Sharding::Create(mesh, {{}}).value());
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  auto whole = AssembleShards(**replicated);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(SameBytes(*whole, Slice(b.view(), {{0, 5}})));
  ASSERT_TRUE(Group().Barrier("done reading").ok());
  if (Group().rank() == 0) std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  auto group = ferry::distributed::Initialize();
  if (!group.ok()) {
    fmt::print(stderr, "distributed_test: {}\n", group.status().ToString());
    return 1;
  }
  // Every rank prints its results (interleaved) and exits non-zero on a failure; mpiexec passes
  // the worst exit code on.
  const int result = RUN_ALL_TESTS();
  ferry::distributed::Finalize();
  return result;
}
