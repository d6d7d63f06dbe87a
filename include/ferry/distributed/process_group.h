// The process group: the processes of one multi-process job (JAX's multi-controller model), over
// an existing distributed engine. ferry ships two: a single-process group (always) and MPI (when
// ferry was built with MPI: CMake found it). Another engine plugs in by implementing
// `ProcessGroup`.
//
// Failure model. Every collective call (Barrier, AllGather and what is built on them) waits with
// a deadline and never hangs: it returns an error when a peer is gone (a process of this machine
// that no longer runs, or one the launcher reported with SIGUSR1, as MPICH's mpiexec does under
// `-disable-auto-cleanup`), or when the deadline passes. After such an error the group is broken:
// every later collective call returns the same error at once, and the group does not finalize
// MPI (that would wait for the dead peer). Errors that a rank finds in its own work are agreed on
// with `AgreeOnStatus`, so that every rank returns the same error naming the rank that failed.
//
// Threads: a group may be used from any thread; its collective calls are serialised by a mutex.
// Every rank must make the same collective calls in the same order (MPI's rule).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/status.h"

namespace ferry::distributed {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // "single" or "mpi".
  virtual std::string_view engine() const = 0;
  // This process's index in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Returns once every rank has called it. Errors: see the failure model above (Unavailable when
  // a peer is gone, DeadlineExceeded when the deadline passed); `step` names the call in messages.
  virtual Status Barrier(std::string_view step) = 0;
  // Every rank's `local` bytes, at its rank's position. Errors as Barrier.
  virtual StatusOr<std::vector<std::string>> AllGather(std::string_view local,
                                                       std::string_view step) = 0;
};

// A group of one process (rank 0 of 1): every collective returns at once.
std::unique_ptr<ProcessGroup> MakeSingleProcessGroup();

// Seconds a collective call waits for the other ranks before it gives up: the setting
// FERRY_DISTRIBUTED_TIMEOUT_S (ferry/core/settings.h; default 300; a dead peer on this machine is
// found within about 0.1 s whatever this is). Initialize refuses a bad value.
double CollectiveTimeoutSeconds();

// Whether this process was started by an MPI launcher (mpiexec sets PMI_RANK / PMI_SIZE; Open MPI
// OMPI_COMM_WORLD_SIZE), whether or not ferry was built with MPI.
bool StartedByMpiLauncher();
// True when ferry was built with MPI.
bool HaveMpi();

// Joins the job this process was started in and makes it the process-wide group: under an MPI
// launcher, an MPI group (MPI is initialised here unless the program already did, e.g. with
// mpi4py; ferry then never finalizes it); otherwise a single-process group. Idempotent: later
// calls return the same group. Unavailable when started by an MPI launcher but built without MPI
// (running the job as N independent single processes would be wrong, not merely slow);
// InvalidArgument naming the variable when a setting has a bad value (CheckSettings).
// The group lives until the process exits; the pointer stays valid until then.
StatusOr<ProcessGroup*> Initialize();
// The process-wide group: the one Initialize made, else a single-process group (never null).
ProcessGroup& CurrentProcessGroup();
// Ends the process-wide group where ferry started the engine (MPI_Finalize), unless the group is
// broken (a peer is gone: finalizing would wait for it). Safe to call more than once.
void Finalize();

// Error agreement: every rank passes its own outcome of `step`; every rank gets the same result.
// OK when every rank's `local` is OK; otherwise the error of the lowest failing rank, with its
// code and the message "rank R of N failed during <step>: <message>" (plus the other failing
// ranks' numbers). A collective failure (a peer gone) is returned as it is.
Status AgreeOnStatus(ProcessGroup& group, const Status& local, std::string_view step);

// Every rank's `local` must be equal (e.g. a mesh description); otherwise InvalidArgument, the
// same on every rank, naming the ranks that differ from rank 0 and, for the first of them, where
// it does, both values cut to the part around the first difference, on lines that fit 80 columns
// (never the whole values: a plan of many tensors would make a line of thousands of characters):
//   <what> differs between ranks 0 and 1
//   (ranks 2, 3 differ from rank 0 too)
//   first in --shard-dim:
//     rank 0: 0
//     rank 1: 1
//             ^
// A value of several lines is compared line by line, and a line "name: value" is a field: the
// message names the first field that differs ("first in NAME:"), else the line and character
// ("first on line 3, at character 12:"; one line: "first at character 12:").
Status AgreeOnValue(ProcessGroup& group, std::string_view local, std::string_view what);

// Sums one unsigned 64-bit value per entry over all ranks (wrapping): every rank gets the sums.
// `local` has the same length on every rank (InvalidArgument otherwise, on every rank).
StatusOr<std::vector<uint64_t>> AllReduceSum(ProcessGroup& group,
                                             const std::vector<uint64_t>& local,
                                             std::string_view step);

}  // namespace ferry::distributed
