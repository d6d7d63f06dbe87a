// The file cases of ferry-bench: a sample checkpoint in a warm safetensors file, opened and put on
// the device, next to the real loaders from PyPI on the same file (bench/loader_peers.py).
#pragma once

#include "bench_case.h"
#include "ferry/core/dtype.h"

namespace ferry::bench {

// file_put_safetensors (float_dtype f32) and file_put_safetensors_bf16 (bf16): writes a sample
// checkpoint of 1 GiB x scale (PlanSampleCheckpoint with every floating-point tensor in
// `float_dtype`, plus its i64 position table) to a temporary file, flushes it to disk and reads it
// once, so the timed runs find it in the page cache. A run is TensorFile::Open, TransferToDevice
// of every tensor in the file's dtype, and AwaitReady; the mapping is released inside the run.
// With --python, after the timed runs, bench/loader_peers.py times safetensors and torch.load on
// the same file and the row gets vs_safetensors* and vs_torch_load. Skipped when the device does
// not hold `float_dtype`. The file is removed when the case is done.
StatusOr<PreparedCase> PrepareFilePutSafetensors(const CaseContext& context, DType float_dtype);

// file_parse_many_tensors: a safetensors file of 200,000 x scale one-element f32 tensors (a 13 MB
// header at scale 1, under the 100 MB limit) written to a temporary file. A run is TensorFile::Open
// alone: the header parsed and validated, the file mapped. With --python, bench/loader_peers.py
// --parse-only times safetensors' safe_open + keys() on the same file, for vs_safetensors_open.
// The parse was quadratic in the tensor count before issue 25 item 9.
StatusOr<PreparedCase> PrepareFileParseManyTensors(const CaseContext& context);

}  // namespace ferry::bench
