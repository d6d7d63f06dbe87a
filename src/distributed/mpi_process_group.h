// The MPI process group (mpi_process_group.cc when ferry is built with MPI, mpi_unavailable.cc
// otherwise). Internal: reached through distributed::Initialize().
#pragma once

#include <memory>

#include "ferry/distributed/process_group.h"

namespace ferry::distributed::internal {

extern const bool kHaveMpi;

// Initialises MPI unless the program already did (then it is only joined, never finalized here),
// and makes a group over a duplicate of MPI_COMM_WORLD. Unavailable without MPI, or when MPI was
// already finalized.
StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup();

// MPI_Finalize if `group` is an MPI group that initialised MPI itself and is not broken (a broken
// group's peers may be gone, and finalizing would wait for them). Does nothing otherwise.
void FinalizeIfMpi(ProcessGroup& group);

}  // namespace ferry::distributed::internal
