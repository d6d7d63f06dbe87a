// The multi-process part of `ferry._ferry` (ferry.distributed in Python): the process group and
// global devices. Every collective call releases the GIL while it waits.
#pragma once

#include <nanobind/nanobind.h>

namespace ferry::python {

void AddDistributedFunctions(nanobind::module_& m);

}  // namespace ferry::python
