// The MPI process group. Internal: reached through distributed::Initialize(). Where it comes from:
// - a static ferry built with MPI: mpi_process_group.cc, linked in (the program links MPI);
// - the shared runtime (libferry.so, FERRY_SHARED_RUNTIME: what pip installs): the same file built
//   as a module of its own, libferry_mpi.so, which mpi_module_loader.cc opens beside libferry.so on
//   the first MPI group. libferry.so never needs an MPI library itself, so `import ferry` works on
//   a machine without MPI, and the MPI a process uses is always the system's (never a second copy
//   in the package, which would break mpiexec and mpi4py);
// - ferry built without MPI: mpi_unavailable.cc.
#pragma once

#include <memory>

#include "ferry/distributed/process_group.h"

namespace ferry::distributed::internal {

extern const bool kHaveMpi;

// Initialises MPI unless the program already did (then it is only joined, never finalized here),
// and makes a group over a duplicate of MPI_COMM_WORLD. Unavailable without MPI, or when MPI was
// already finalized. Every step waits for the other ranks at most CollectiveTimeoutSeconds():
// DeadlineExceeded when one never starts MPI; when MPI_Init_thread itself timed out, MPI cannot be
// used in this process any more (a thread stays blocked in it) and every later call returns the
// same error.
StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup();

// MPI_Finalize if `group` is an MPI group that initialised MPI itself and is not broken (a broken
// group's peers may be gone, and finalizing would wait for them). Does nothing otherwise.
void FinalizeIfMpi(ProcessGroup& group);

// For tests: how many collectives `group` gave up on (deadline, dead peer) that MPI still holds,
// after releasing those MPI has completed since (one MPI_Test each). Their buffers stay allocated
// until then. 0 for a group that is not an MPI group.
int AbandonedCollectivesForTesting(ProcessGroup& group);

// What libferry_mpi.so hands the loader (its one exported symbol, `FerryMpiModule`, returns it):
// the functions above, built inside the module. Both sides are built from one source tree in
// one build, so the table is checked by its version alone.
struct MpiModule {
  int version;
  StatusOr<std::unique_ptr<ProcessGroup>> (*make_group)();
  void (*finalize_if_mpi)(ProcessGroup&);
  int (*abandoned_collectives_for_testing)(ProcessGroup&);
};
inline constexpr int kMpiModuleVersion = 2;
inline constexpr char kMpiModuleEntry[] = "FerryMpiModule";

}  // namespace ferry::distributed::internal
