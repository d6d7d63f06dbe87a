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
//
// Start-up has the same deadline: MPI_Init_thread waits in MPICH's PMI handshake for every rank,
// forever when one never starts MPI (it ended, or runs a program that does not use ferry), and
// cannot be interrupted. It runs on a helper thread that the caller waits for until the deadline;
// past it, the caller gets DeadlineExceeded and the helper thread stays blocked (nothing can end
// it), so MPI is unusable in this process from then on and every later attempt returns the same
// error. The communicator is duplicated with the nonblocking MPI_Comm_idup for the same reason.
//
// A nonblocking call's buffers belong to MPI until MPI_Test reports it complete: a call the group
// gave up on (deadline, a dead peer) keeps them in the group's abandoned list, released only when
// MPI completes it, and leaked with the group otherwise. Freeing them at return would let a late
// peer's data land in freed memory.
#include "src/distributed/mpi_process_group.h"

#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
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

// One nonblocking MPI call and every buffer it reads or writes while it runs (each call uses the
// fields it needs). Heap-allocated so that ownership can pass to the group's abandoned list when a
// wait gives up, with every address MPI was handed unchanged.
struct Collective {
  MPI_Request request = MPI_REQUEST_NULL;
  std::string send;  // AllGather: this rank's bytes, copied (the caller's may be gone)
  int64_t send_size = 0;
  std::vector<int64_t> sizes;
  std::vector<int> counts;
  std::vector<int> displacements;
  std::string received;
  MPI_Comm new_comm = MPI_COMM_NULL;  // MPI_Comm_idup's result
};

// "rank R of N" from the launcher's environment, for errors before MPI can say it.
std::string LauncherRank() {
  const char* rank = std::getenv("PMI_RANK");
  const char* size = std::getenv("PMI_SIZE");
  if (rank == nullptr || size == nullptr) return "this rank";
  return fmt::format("rank {} of {}", rank, size);
}

// MPI_Init_thread on a helper thread, waited for until `timeout` (see the top of this file).
Status InitializeMpiWithin(double timeout) {
  struct Attempt {
    std::mutex mutex;
    std::condition_variable finished_cv;
    bool finished = false;
    int code = MPI_SUCCESS;
    int provided = 0;
  };
  // A start-up that timed out leaves its thread inside MPI_Init_thread: a second MPI_Init_thread
  // beside it is undefined, so every later attempt returns the first one's error.
  static std::mutex* stuck_mutex = new std::mutex();
  static Status* stuck = new Status();
  std::lock_guard<std::mutex> stuck_lock(*stuck_mutex);
  if (!stuck->ok()) return *stuck;

  auto attempt = std::make_shared<Attempt>();
  std::thread([attempt] {
    // ferry serialises its own MPI calls (one mutex per group), so any thread may make them.
    int provided = 0;
    const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    std::lock_guard<std::mutex> lock(attempt->mutex);
    attempt->finished = true;
    attempt->code = code;
    attempt->provided = provided;
    attempt->finished_cv.notify_all();
  }).detach();  // joined through `finished`, or never: it cannot be interrupted

  std::unique_lock<std::mutex> lock(attempt->mutex);
  // A deadline as far as the clock can count (a timeout of 1e10 s would overflow its nanoseconds
  // and lie in the past): any larger timeout waits that long, which is for ever.
  const auto now = std::chrono::steady_clock::now();
  const double room =
      std::chrono::duration<double>(std::chrono::steady_clock::time_point::max() - now).count();
  const auto deadline = timeout >= room
                            ? std::chrono::steady_clock::time_point::max()
                            : now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(timeout));
  const bool finished =
      attempt->finished_cv.wait_until(lock, deadline, [&] { return attempt->finished; });
  if (!finished) {
    *stuck = absl::DeadlineExceededError(fmt::format(
        "{}: MPI start-up (MPI_Init_thread) did not finish within {:g} s "
        "(FERRY_DISTRIBUTED_TIMEOUT_S): another process of the job never started MPI (it "
        "ended, or runs a program that does not use ferry's MPI), or start-up takes longer than "
        "that setting allows; MPI cannot be used in this process any more, end it",
        LauncherRank(), timeout));
    return *stuck;
  }
  if (attempt->code != MPI_SUCCESS) {
    return UnavailableError(
        fmt::format("MPI_Init_thread failed: {}", MpiErrorString(attempt->code)));
  }
  if (attempt->provided < MPI_THREAD_SERIALIZED) {
    // MPI_Init_thread ran on another thread than the caller's: only SERIALIZED and up allow that.
    return UnavailableError(
        fmt::format("MPI provides thread level {}, ferry needs MPI_THREAD_SERIALIZED ({})",
                    attempt->provided, MPI_THREAD_SERIALIZED));
  }
  return OkStatus();
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(bool initialized_here, int rank, int size)
      : initialized_here_(initialized_here), rank_(rank), size_(size) {}

  // Collectives MPI may still be using are leaked, never freed (their buffers are MPI's).
  ~MpiProcessGroup() override {
    MutexLock lock(mutex_);
    for (std::unique_ptr<Collective>& collective : abandoned_) collective.release();
  }

  // Duplicates MPI_COMM_WORLD (nonblocking, under the deadline: every rank must take part) and
  // learns where every rank runs.
  Status Start() {
    {
      MutexLock lock(mutex_);
      auto collective = std::make_unique<Collective>();
      FERRY_RETURN_IF_ERROR(
          Check(MPI_Comm_idup(MPI_COMM_WORLD, &collective->new_comm, &collective->request),
                "initialize"));
      FERRY_RETURN_IF_ERROR(Wait(collective, "initialize"));
      comm_ = collective->new_comm;
      MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    }
    return ExchangePeers();
  }

  // Polls the collectives this group gave up on and releases those MPI has completed; returns how
  // many MPI still holds.
  int PollAbandoned() {
    MutexLock lock(mutex_);
    ReleaseCompletedAbandoned();
    return static_cast<int>(abandoned_.size());
  }

  std::string_view engine() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Barrier(std::string_view step) override {
    MutexLock lock(mutex_);
    FERRY_RETURN_IF_ERROR(CheckPeersBeforeStarting(step));
    auto collective = std::make_unique<Collective>();
    FERRY_RETURN_IF_ERROR(Check(MPI_Ibarrier(comm_, &collective->request), step));
    return Wait(collective, step);
  }

  StatusOr<std::vector<std::string>> AllGather(std::string_view local,
                                               std::string_view step) override {
    MutexLock lock(mutex_);
    FERRY_RETURN_IF_ERROR(CheckPeersBeforeStarting(step));
    auto sizes = std::make_unique<Collective>();
    sizes->send_size = static_cast<int64_t>(local.size());
    sizes->sizes.resize(static_cast<size_t>(size_));
    FERRY_RETURN_IF_ERROR(
        Check(MPI_Iallgather(&sizes->send_size, 1, MPI_INT64_T, sizes->sizes.data(), 1, MPI_INT64_T,
                             comm_, &sizes->request),
              step));
    FERRY_RETURN_IF_ERROR(Wait(sizes, step));
    auto data = std::make_unique<Collective>();
    data->send.assign(local);
    data->counts.resize(sizes->sizes.size());
    data->displacements.resize(sizes->sizes.size());
    int64_t total = 0;
    for (size_t rank = 0; rank < sizes->sizes.size(); ++rank) {
      data->counts[rank] = static_cast<int>(sizes->sizes[rank]);
      data->displacements[rank] = static_cast<int>(total);
      total += sizes->sizes[rank];
    }
    if (total > int64_t{1} << 30) {
      // Every rank sees the same sizes, so every rank returns this error (no rank waits).
      return InvalidArgumentError(
          fmt::format("{}: the ranks' data adds up to {} bytes, more than an all-gather takes (1 "
                      "GiB)",
                      step, total));
    }
    data->received.assign(static_cast<size_t>(total), '\0');
    FERRY_RETURN_IF_ERROR(
        Check(MPI_Iallgatherv(data->send.data(), static_cast<int>(data->send.size()), MPI_BYTE,
                              data->received.data(), data->counts.data(),
                              data->displacements.data(), MPI_BYTE, comm_, &data->request),
              step));
    FERRY_RETURN_IF_ERROR(Wait(data, step));
    std::vector<std::string> result;
    result.reserve(sizes->sizes.size());
    for (size_t rank = 0; rank < sizes->sizes.size(); ++rank) {
      result.push_back(data->received.substr(static_cast<size_t>(data->displacements[rank]),
                                             static_cast<size_t>(sizes->sizes[rank])));
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
    if (finalized_) return;
    finalized_ = true;
    if (!broken_.ok() || !initialized_here_) return;
    // MPI_Finalize waits for every other process to finalize too: for as long as they are all
    // there (a rank still working after the last collective finalizes later, and the others wait
    // for it, as MPI means them to), but not once one is known to be gone, which never will: it
    // runs on a thread of its own, and the wait gives up when a peer has ended (the same checks
    // as a collective's: its pid, mpiexec's SIGUSR1), instead of hanging at exit.
    if (!CheckPeers("shutdown", /*check_pids=*/true).ok()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&comm_);
    struct Finishing {
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
    };
    auto finishing = std::make_shared<Finishing>();
    std::thread([finishing] {
      MPI_Finalize();
      std::lock_guard<std::mutex> done_lock(finishing->mutex);
      finishing->done = true;
      finishing->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> wait_lock(finishing->mutex);
    while (!finishing->cv.wait_for(wait_lock, std::chrono::milliseconds(100),
                                   [&] { return finishing->done; })) {
      wait_lock.unlock();
      const bool peers_there = CheckPeers("shutdown", /*check_pids=*/true).ok();
      wait_lock.lock();
      if (!peers_there) return;
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
    if (finalized_) {
      return FailedPreconditionError(fmt::format(
          "rank {} of {}: {} after ferry.distributed.shutdown(): this process has left the job "
          "(MPI cannot be joined again)",
          rank_, size_, step));
    }
    FERRY_RETURN_IF_ERROR(broken_);
    return CheckPeers(step, /*check_pids=*/true);
  }

  // Releases the abandoned collectives that MPI has completed since.
  void ReleaseCompletedAbandoned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    std::erase_if(abandoned_, [](const std::unique_ptr<Collective>& collective) {
      int done = 0;
      // An error completes the request too (MPI_ERRORS_RETURN): MPI no longer uses its buffers.
      const int code = MPI_Test(&collective->request, &done, MPI_STATUS_IGNORE);
      return code != MPI_SUCCESS || done != 0;
    });
  }

  // Polls `collective` until MPI completes it (OK), a peer is known to be gone, or the deadline
  // passes. On an error the group takes `collective` (it becomes null): MPI may still read and
  // write its buffers.
  Status Wait(std::unique_ptr<Collective>& collective, std::string_view step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    Status status = Poll(collective->request, step);
    if (!status.ok()) abandoned_.push_back(std::move(collective));
    ReleaseCompletedAbandoned();
    return status;
  }

  Status Poll(MPI_Request& request, std::string_view step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    using Clock = std::chrono::steady_clock;
    const double timeout = CollectiveTimeoutSeconds();
    const auto start = Clock::now();
    auto next_peer_check = start + std::chrono::milliseconds(100);
    auto sleep = std::chrono::microseconds(20);
    while (true) {
      int done = 0;
      FERRY_RETURN_IF_ERROR(Check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), step));
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
  MPI_Comm comm_ ABSL_GUARDED_BY(mutex_) = MPI_COMM_NULL;
  const bool initialized_here_;
  const int rank_;
  const int size_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mutex_);
  Status broken_ ABSL_GUARDED_BY(mutex_);
  bool finalized_ ABSL_GUARDED_BY(mutex_) = false;
  // Collectives given up on that MPI may still be using (see Wait).
  std::vector<std::unique_ptr<Collective>> abandoned_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return UnavailableError("MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) FERRY_RETURN_IF_ERROR(InitializeMpiWithin(CollectiveTimeoutSeconds()));
  InstallPeerFailureHandler();
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto group = std::make_unique<MpiProcessGroup>(!initialized, rank, size);
  FERRY_RETURN_IF_ERROR(group->Start());
  return group;
}

int AbandonedCollectivesForTesting(ProcessGroup& group) {
  auto* mpi = dynamic_cast<MpiProcessGroup*>(&group);
  return mpi != nullptr ? mpi->PollAbandoned() : 0;
}

void FinalizeIfMpi(ProcessGroup& group) {
  if (auto* mpi = dynamic_cast<MpiProcessGroup*>(&group)) mpi->Finalize();
}

}  // namespace ferry::distributed::internal

#ifdef FERRY_MPI_MODULE
// Built as libferry_mpi.so (with hidden visibility: the functions above bind inside the
// module, never to the loader's functions of the same names in libferry.so).
extern "C" __attribute__((visibility("default"))) const ferry::distributed::internal::MpiModule*
FerryMpiModule() {
  namespace internal = ferry::distributed::internal;
  static const internal::MpiModule module{internal::kMpiModuleVersion,
                                          &internal::MakeMpiProcessGroup, &internal::FinalizeIfMpi,
                                          &internal::AbandonedCollectivesForTesting};
  return &module;
}
#endif
