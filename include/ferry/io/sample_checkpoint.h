// Sample checkpoints: a decoder-only transformer's tensors with deterministic pseudo-random
// values, for demos, tests and benchmarks (`ferry sample` writes them; ferry-bench's file cases
// write the same files). Nothing here keeps state: every function is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/status.h"

namespace ferry {

struct SampleTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> dims;
};

// The tensor's size in bytes (dense).
int64_t SampleTensorBytes(const SampleTensor& tensor);

// A decoder-only transformer's tensors: the embedding and a position table, then layer after
// layer of attention and MLP weights and norms, then the final norm and head. Their total is
// within one tensor of `target_bytes` and never more: the last layer stops early, at the first
// tensor that would pass it. `hidden` = 0 chooses the hidden size from the target (64 to 2048:
// narrower for a small target, so that the embedding, position table, norm and head alone fit
// it). The weights are mixed as in real checkpoints (bf16 matrices, an f16 gate, f32 norms, an
// i64 position table); `float_dtype`, when given, stores every floating-point tensor in that
// dtype instead (the i64 table stays). InvalidArgument, naming the size needed, when even those
// four tensors pass the target; and for a negative `hidden`.
StatusOr<std::vector<SampleTensor>> PlanSampleCheckpoint(
    int64_t target_bytes, int64_t hidden = 0, std::optional<DType> float_dtype = std::nullopt);

// The tensor's values, like trained weights: small, centred, deterministic in `seed` (the
// position table counts 0..2047). The caller owns the result.
StatusOr<HostTensor> FillSampleTensor(const SampleTensor& tensor, uint64_t seed);

// Fills every tensor of `plan` (tensor i with seed i + 1) and writes them as a safetensors file
// with `metadata`. Holds all the tensors in memory until the file is written.
Status WriteSampleSafetensors(const std::string& path, const std::vector<SampleTensor>& plan,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry
