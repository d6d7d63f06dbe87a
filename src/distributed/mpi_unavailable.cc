// ferry built without MPI: the MPI group reports Unavailable.
#include "src/distributed/mpi_process_group.h"

namespace ferry::distributed::internal {

const bool kHaveMpi = false;

StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup() {
  return UnavailableError("ferry was built without MPI (CMake did not find it)");
}

void FinalizeIfMpi(ProcessGroup&) {}

int AbandonedCollectivesForTesting(ProcessGroup&) { return 0; }

}  // namespace ferry::distributed::internal
