// Sample checkpoints: a decoder-only transformer's tensors with deterministic pseudo-random values,
// for `ferry sample` and the file cases of ferry-bench (which write the same files).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/status.h"

namespace ferry::bench {

struct SampleTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> dims;
};

int64_t SampleTensorBytes(const SampleTensor& tensor);

// A decoder-only transformer's tensors (embedding, then layer after layer of attention and MLP
// weights and norms, then the final norm and head) until `target_bytes` is reached. `hidden` = 0
// chooses the hidden size from the target (256 to 2048). The weights are mixed as in real
// checkpoints (bf16 matrices, an f16 gate, f32 norms, an i64 position table); `float_dtype`, when
// given, stores every floating-point tensor in that dtype instead (the i64 table stays).
std::vector<SampleTensor> PlanSampleCheckpoint(int64_t target_bytes, int64_t hidden = 0,
                                               std::optional<DType> float_dtype = std::nullopt);

// The tensor's values, like trained weights: small, centred, deterministic in `seed` (the
// position table counts 0..2047). The caller owns the result.
StatusOr<HostTensor> FillSampleTensor(const SampleTensor& tensor, uint64_t seed);

// Fills every tensor of `plan` (tensor i with seed i + 1) and writes them as a safetensors file
// with `metadata`. Holds all the tensors in memory until the file is written.
Status WriteSampleSafetensors(const std::string& path, const std::vector<SampleTensor>& plan,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry::bench
