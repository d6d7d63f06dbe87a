// The MPI process group. Every collective is a nonblocking MPI call polled with MPI_Test until it
// completes, a peer is known to be gone, or the deadline passes: a blocking MPI collective waits
// forever for a rank that died (MPICH 4.0 over ch4:ucx does not report it), which is the hang the
// failure model rules out.
//
// How a peer is known to be gone (measured with Debian's MPICH 4.0.2, hydra's mpiexec):
// - by default mpiexec kills every other rank with SIGKILL as soon as one dies, and exits with the
//   dead rank's status: nothing to do here;
// - under `mpiexec -disable-auto-cleanup` it sends the survivors SIGUSR1 instead, which both the
//   default action and MPICH's own handler answer by ending the process without a word: the group
//   catches it instead (unless the program installed a handler of its own) and fails the pending
//   and later collectives with a clear error;
// - a peer on this machine whose pid no longer runs (checked every 100 ms while waiting).
// Both are also checked before a collective starts: a peer known to be gone fails the next
// collective without any MPI call (MPI would wait for it, or fail on its dead connection).
#include "src/distributed/mpi_process_group.h"

#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/core/mutex.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry::distributed::internal {

const bool kHaveMpi = true;

namespace {

std::atomic<bool> peer_failure_signalled{false};

void OnPeerFailureSignal(int) { peer_failure_signalled.store(true); }

// Whether `handler` lies in the MPI library. MPICH 4.0 installs one for SIGUSR1 in MPI_Init that
// ends the process (measured: a survivor of a killed rank then dies without a word).
bool IsMpiLibraryHandler(void (*handler)(int)) {
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(handler), &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libmpi") != nullptr;
}

// Catches mpiexec's SIGUSR1 unless the program handles (or ignores) it itself: replaces the
// default action and the MPI library's handler only.
void InstallPeerFailureHandler() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) != 0) return;
  if (current.sa_handler != SIG_DFL && !IsMpiLibraryHandler(current.sa_handler)) return;
  struct sigaction action {};
  action.sa_handler = OnPeerFailureSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// False when `pid` (of this machine) has ended: gone, or a zombie its parent has not reaped yet.
bool ProcessRuns(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;  // cannot tell: assume it runs
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

struct Peer {
  std::string host;
  int64_t pid = 0;
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, bool initialized_here, int rank, int size)
      : comm_(comm), initialized_here_(initialized_here), rank_(rank), size_(size) {}

  std::string_view engine() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Barrier(std::string_view step) override {
    MutexLock lock(mutex_);
    FERRY_RETURN_IF_ERROR(CheckPeersBeforeStarting(step));
    MPI_Request request;
    FERRY_RETURN_IF_ERROR(Check(MPI_Ibarrier(comm_, &request), step));
    return Wait(&request, step);
  }

  StatusOr<std::vector<std::string>> AllGather(std::string_view local,
                                               std::string_view step) override {
    MutexLock lock(mutex_);
    FERRY_RETURN_IF_ERROR(CheckPeersBeforeStarting(step));
    const int64_t local_size = static_cast<int64_t>(local.size());
    std::vector<int64_t> sizes(static_cast<size_t>(size_));
    MPI_Request request;
    FERRY_RETURN_IF_ERROR(Check(
        MPI_Iallgather(&local_size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm_, &request),
        step));
    FERRY_RETURN_IF_ERROR(Wait(&request, step));
    std::vector<int> counts(sizes.size());
    std::vector<int> displacements(sizes.size());
    int64_t total = 0;
    for (size_t rank = 0; rank < sizes.size(); ++rank) {
      counts[rank] = static_cast<int>(sizes[rank]);
      displacements[rank] = static_cast<int>(total);
      total += sizes[rank];
    }
    if (total > int64_t{1} << 30) {
      // Every rank sees the same sizes, so every rank returns this error (no rank waits).
      return InvalidArgumentError(
          fmt::format("{}: the ranks' data adds up to {} bytes, more than an all-gather takes (1 "
                      "GiB)",
                      step, total));
    }
    std::string all(static_cast<size_t>(total), '\0');
    FERRY_RETURN_IF_ERROR(
        Check(MPI_Iallgatherv(local.data(), static_cast<int>(local_size), MPI_BYTE, all.data(),
                              counts.data(), displacements.data(), MPI_BYTE, comm_, &request),
              step));
    FERRY_RETURN_IF_ERROR(Wait(&request, step));
    std::vector<std::string> result;
    result.reserve(sizes.size());
    for (size_t rank = 0; rank < sizes.size(); ++rank) {
      result.push_back(
          all.substr(static_cast<size_t>(displacements[rank]), static_cast<size_t>(sizes[rank])));
    }
    return result;
  }

  // Learns where every rank runs (to tell a dead peer on this machine from a slow one).
  Status ExchangePeers() {
    FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all,
                           AllGather(fmt::format("{}\n{}", HostName(), getpid()), "initialize"));
    std::vector<Peer> peers;
    for (const std::string& entry : all) {
      std::vector<std::string> parts = absl::StrSplit(entry, '\n');
      Peer peer;
      if (parts.size() == 2 && absl::SimpleAtoi(parts[1], &peer.pid)) peer.host = parts[0];
      peers.push_back(std::move(peer));
    }
    MutexLock lock(mutex_);
    peers_ = std::move(peers);
    return OkStatus();
  }

  void Finalize() {
    MutexLock lock(mutex_);
    if (finalized_ || !broken_.ok() || !initialized_here_) return;
    finalized_ = true;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&comm_);
      MPI_Finalize();
    }
  }

 private:
  Status Check(int code, std::string_view step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (code == MPI_SUCCESS) return OkStatus();
    broken_ = UnavailableError(fmt::format("rank {} of {}: MPI failed during {}: {}", rank_, size_,
                                           step, MpiErrorString(code)));
    return broken_;
  }

  // Ranks of this machine whose process has ended.
  std::vector<int> DeadPeers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    std::vector<int> dead;
    if (peers_.empty()) return dead;
    const std::string& host = peers_[static_cast<size_t>(rank_)].host;
    for (size_t rank = 0; rank < peers_.size(); ++rank) {
      const Peer& peer = peers_[rank];
      if (static_cast<int>(rank) == rank_ || peer.pid <= 0 || peer.host != host) continue;
      if (!ProcessRuns(peer.pid)) dead.push_back(static_cast<int>(rank));
    }
    return dead;
  }

  // An error (and the group broken) when a peer is known to be gone: mpiexec said so (SIGUSR1), or,
  // with `check_pids`, a peer of this machine no longer runs.
  Status CheckPeers(std::string_view step, bool check_pids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (peer_failure_signalled.load()) {
      broken_ = UnavailableError(fmt::format(
          "rank {} of {}: mpiexec reported that another process of the job ended (SIGUSR1) "
          "while this rank waited in {}; no rank can go on",
          rank_, size_, step));
      return broken_;
    }
    if (!check_pids) return OkStatus();
    if (std::vector<int> dead = DeadPeers(); !dead.empty()) {
      std::vector<std::string> names;
      for (int rank : dead) {
        names.push_back(
            fmt::format("rank {} (pid {})", rank, peers_[static_cast<size_t>(rank)].pid));
      }
      broken_ = UnavailableError(
          fmt::format("rank {} of {}: {} ended while this rank waited for it in {}; no rank "
                      "can go on",
                      rank_, size_, fmt::join(names, ", "), step));
      return broken_;
    }
    return OkStatus();
  }

  // Before a collective starts: a peer already known to be gone fails it at once, without calling
  // MPI, which would wait for that peer (or end this process on its dead connection).
  Status CheckPeersBeforeStarting(std::string_view step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    FERRY_RETURN_IF_ERROR(broken_);
    return CheckPeers(step, /*check_pids=*/true);
  }

  Status Wait(MPI_Request* request, std::string_view step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    using Clock = std::chrono::steady_clock;
    const double timeout = CollectiveTimeoutSeconds();
    const auto start = Clock::now();
    auto next_peer_check = start + std::chrono::milliseconds(100);
    auto sleep = std::chrono::microseconds(20);
    while (true) {
      int done = 0;
      FERRY_RETURN_IF_ERROR(Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), step));
      if (done) return OkStatus();
      const auto now = Clock::now();
      const bool check_pids = now >= next_peer_check;
      if (check_pids) next_peer_check = now + std::chrono::milliseconds(100);
      FERRY_RETURN_IF_ERROR(CheckPeers(step, check_pids));
      const double waited = std::chrono::duration<double>(now - start).count();
      if (waited > timeout) {
        broken_ = absl::DeadlineExceededError(
            fmt::format("rank {} of {}: the other ranks did not reach {} within {:g} s "
                        "(FERRY_DISTRIBUTED_TIMEOUT_S): a rank died, hangs or is far behind",
                        rank_, size_, step, timeout));
        return broken_;
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
    }
  }

  Mutex mutex_;
  MPI_Comm comm_ ABSL_GUARDED_BY(mutex_);
  const bool initialized_here_;
  const int rank_;
  const int size_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mutex_);
  Status broken_ ABSL_GUARDED_BY(mutex_);
  bool finalized_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return UnavailableError("MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // ferry serialises its own MPI calls (one mutex per group).
    int provided = 0;
    if (int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
        code != MPI_SUCCESS) {
      return UnavailableError(fmt::format("MPI_Init_thread failed: {}", MpiErrorString(code)));
    }
  }
  InstallPeerFailureHandler();
  MPI_Comm comm;
  if (int code = MPI_Comm_dup(MPI_COMM_WORLD, &comm); code != MPI_SUCCESS) {
    return UnavailableError(fmt::format("MPI_Comm_dup failed: {}", MpiErrorString(code)));
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  auto group = std::make_unique<MpiProcessGroup>(comm, !initialized, rank, size);
  FERRY_RETURN_IF_ERROR(group->ExchangePeers());
  return group;
}

void FinalizeIfMpi(ProcessGroup& group) {
  if (auto* mpi = dynamic_cast<MpiProcessGroup*>(&group)) mpi->Finalize();
}

}  // namespace ferry::distributed::internal

#ifdef FERRY_MPI_MODULE
// Built as libferry_mpi.so (with hidden visibility: the two functions above bind inside the
// module, never to the loader's functions of the same names in libferry.so).
extern "C" __attribute__((visibility("default"))) const ferry::distributed::internal::MpiModule*
FerryMpiModule() {
  namespace internal = ferry::distributed::internal;
  static const internal::MpiModule module{internal::kMpiModuleVersion,
                                          &internal::MakeMpiProcessGroup, &internal::FinalizeIfMpi};
  return &module;
}
#endif
