// The .npz format: a zip archive of NAME.npy members (numpy.savez, numpy.savez_compressed).
#pragma once

#include <memory>

#include "ferry/core/status.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"
#include "src/io/stored_tensor.h"

namespace ferry::io_internal {

// Parses a whole .npz: its zip directory, then each member as a .npy. Stored members borrow
// `file`; deflated members are inflated into memory owned by their sources.
StatusOr<ParsedTensors> ParseNpz(const std::shared_ptr<const MappedFile>& file,
                                 const TensorFileOptions& options);

}  // namespace ferry::io_internal
