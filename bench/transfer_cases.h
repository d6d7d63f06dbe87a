// The transfer cases of ferry-bench (everything but the file cases, file_put_cases.h): each one's
// source, the ferry path and the staged path it is timed with, and what the row reports about it.
#pragma once

#include <vector>

#include "bench_case.h"

namespace ferry::bench {

// Every case of ferry-bench in the order it runs (the file cases included, last): raw_clwrite
// first, so that the h2d cases after it in the same run get vs_raw_clwrite, then raw_pjrt_put.
// On a pjrt device the cases the plugin has an own path for carry it (PreparedCase::raw_pjrt).
// bench/README.md describes each.
std::vector<CaseDefinition> AllCases();

}  // namespace ferry::bench
