// The single-process group, the process-wide group, and error agreement (engine-independent: built
// on AllGather).
#include "ferry/distributed/process_group.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/distributed/mpi_process_group.h"

namespace ferry::distributed {
namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  std::string_view engine() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Barrier(std::string_view) override { return OkStatus(); }
  StatusOr<std::vector<std::string>> AllGather(std::string_view local, std::string_view) override {
    return std::vector<std::string>{std::string(local)};
  }
};

struct CurrentGroup {
  Mutex mutex;
  std::unique_ptr<ProcessGroup> group ABSL_GUARDED_BY(mutex);
  bool initialized ABSL_GUARDED_BY(mutex) = false;
};

CurrentGroup& Current() {
  static auto* current = new CurrentGroup();  // lives until exit: groups are used from atexit
  return *current;
}

// "<code>\n<message>": a status as bytes for the all-gather.
std::string Encode(const Status& status) {
  return fmt::format("{}\n{}", static_cast<int>(status.code()), std::string(status.message()));
}

Status Decode(std::string_view bytes) {
  const size_t newline = bytes.find('\n');
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (newline == std::string_view::npos ||
      !absl::SimpleAtoi(std::string(bytes.substr(0, newline)), &code)) {
    return absl::UnknownError(fmt::format("a malformed status from a peer: '{}'", bytes));
  }
  return Status(static_cast<absl::StatusCode>(code), std::string(bytes.substr(newline + 1)));
}

}  // namespace

std::unique_ptr<ProcessGroup> MakeSingleProcessGroup() {
  return std::make_unique<SingleProcessGroup>();
}

double CollectiveTimeoutSeconds() {
  // A bad value was refused by Initialize, which every multi-process group comes from; the
  // default stands in only for a value that went bad since (the environment changed under us).
  return settings::DistributedTimeoutSeconds().value_or(300);
}

bool StartedByMpiLauncher() {
  for (const char* name : {"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

bool HaveMpi() { return internal::kHaveMpi; }

StatusOr<ProcessGroup*> Initialize() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.initialized) return current.group.get();
  FERRY_RETURN_IF_ERROR(CheckSettings());
  if (StartedByMpiLauncher()) {
    if (!HaveMpi()) {
      return UnavailableError(
          "this process was started by an MPI launcher (mpiexec), but this build of ferry has no "
          "MPI: rebuild it with MPI found by CMake (Debian: libmpich-dev)");
    }
    FERRY_ASSIGN_OR_RETURN(current.group, internal::MakeMpiProcessGroup());
  } else {
    current.group = MakeSingleProcessGroup();
  }
  current.initialized = true;
  return current.group.get();
}

ProcessGroup& CurrentProcessGroup() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.group == nullptr) current.group = MakeSingleProcessGroup();
  return *current.group;
}

void Finalize() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.initialized && current.group != nullptr) internal::FinalizeIfMpi(*current.group);
}

Status AgreeOnStatus(ProcessGroup& group, const Status& local, std::string_view step) {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(Encode(local), step));
  int first = -1;
  Status first_status;
  std::vector<int> others;
  for (size_t rank = 0; rank < all.size(); ++rank) {
    Status status = Decode(all[rank]);
    if (status.ok()) continue;
    if (first < 0) {
      first = static_cast<int>(rank);
      first_status = std::move(status);
    } else {
      others.push_back(static_cast<int>(rank));
    }
  }
  if (first < 0) return OkStatus();
  std::string message = fmt::format("rank {} of {} failed during {}: {}", first, group.size(), step,
                                    std::string(first_status.message()));
  if (!others.empty()) message += fmt::format(" (ranks {} failed too)", fmt::join(others, ", "));
  return Status(first_status.code(), message);
}

Status AgreeOnValue(ProcessGroup& group, std::string_view local, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(local, what));
  for (size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] != all[0]) {
      return InvalidArgumentError(
          fmt::format("{} differs between ranks: rank 0 has '{}', rank {} "
                      "has '{}'",
                      what, all[0], rank, all[rank]));
    }
  }
  return OkStatus();
}

StatusOr<std::vector<uint64_t>> AllReduceSum(ProcessGroup& group,
                                             const std::vector<uint64_t>& local,
                                             std::string_view step) {
  std::string bytes(local.size() * sizeof(uint64_t), '\0');
  if (!local.empty()) std::memcpy(bytes.data(), local.data(), bytes.size());
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(bytes, step));
  std::vector<uint64_t> sums(local.size(), 0);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].size() != bytes.size()) {
      return InvalidArgumentError(fmt::format("{}: rank {} summed {} values, this rank {}", step,
                                              rank, all[rank].size() / sizeof(uint64_t),
                                              local.size()));
    }
    for (size_t i = 0; i < sums.size(); ++i) {
      uint64_t value = 0;
      std::memcpy(&value, all[rank].data() + i * sizeof(uint64_t), sizeof(value));
      sums[i] += value;
    }
  }
  return sums;
}

}  // namespace ferry::distributed
