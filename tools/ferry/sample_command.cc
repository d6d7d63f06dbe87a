// `ferry sample FILE --size SIZE`: writes a realistic checkpoint (transformer-like shapes, mixed
// dtypes, deterministic pseudo-random values; ferry/io/sample_checkpoint.h) for demos and
// benchmarks, its tensors within one tensor of SIZE.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/io/sample_checkpoint.h"
#include "ferry/io/tensor_writer.h"
#include "fmt/format.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"

namespace ferry::cli {
namespace {

struct SampleOptions {
  std::string path;
  std::string size = "64MiB";
  std::string format;  // empty: from the extension
  int64_t hidden = 0;  // 0: chosen from the size
  std::string dtype;   // empty: the usual mix; else every floating-point tensor in this dtype
};

int RunSample(const SampleOptions& options) {
  constexpr std::string_view kCommand = "sample";
  auto target = ParseSize(options.size);
  if (!target.ok()) return ReportError(kCommand, target.status());
  std::string format = options.format;
  if (format.empty()) {
    const size_t dot = options.path.rfind('.');
    format = dot == std::string::npos ? "safetensors" : options.path.substr(dot + 1);
  }
  if (format != "safetensors" && format != "npy" && format != "npz") {
    return ReportError(kCommand, InvalidArgumentError(fmt::format(
                                     "format must be safetensors, npy or npz, not '{}'", format)));
  }
  std::optional<DType> float_dtype;
  if (!options.dtype.empty()) {
    auto dtype = DTypeFromName(options.dtype);
    if (!dtype.ok()) return ReportError(kCommand, dtype.status());
    if (GetDTypeInfo(*dtype).kind != DTypeKind::kFloat) {
      // The sample's weights are small real numbers: stored as integers, bools or complex
      // numbers they would all be 0, all true, or not real weights at all.
      return ReportError(kCommand, InvalidArgumentError(fmt::format(
                                       "--dtype {} is not a floating-point dtype (float32, "
                                       "float16, bfloat16, float64)",
                                       options.dtype)));
    }
    float_dtype = *dtype;
  }
  std::vector<SampleTensor> plan;
  if (format == "npy") {  // one tensor: a weight matrix of about the requested size
    const DType dtype = float_dtype.value_or(DType::kF32);
    const int64_t elements = std::max<int64_t>(1, *target / DTypeSize(dtype));
    const int64_t columns = std::min<int64_t>(4096, elements);
    plan.push_back({"weight", dtype, {elements / columns, columns}});
  } else {
    StatusOr<std::vector<SampleTensor>> planned =
        PlanSampleCheckpoint(*target, options.hidden, float_dtype);
    if (!planned.ok()) return ReportError(kCommand, planned.status());
    plan = *std::move(planned);
    if (format == "npz" && float_dtype == DType::kBF16) {  // asked for, and impossible
      return ReportError(kCommand, InvalidArgumentError(fmt::format(
                                       "cannot write '{}' with --dtype bfloat16: numpy (and so "
                                       ".npz) has no dtype for bfloat16",
                                       Printable(options.path))));
    }
    if (format == "npz") {  // numpy has no bfloat16: .npz checkpoints keep it as float16
      for (SampleTensor& tensor : plan) {
        if (tensor.dtype == DType::kBF16) tensor.dtype = DType::kF16;
      }
    }
  }
  std::vector<HostTensor> tensors;
  std::vector<NamedTensor> named;
  int64_t total = 0;
  ProgressBar progress("sample", [&] {
    int64_t bytes = 0;
    for (const auto& tensor : plan) bytes += SampleTensorBytes(tensor);
    return bytes;
  }());
  for (size_t i = 0; i < plan.size(); ++i) {
    auto tensor = FillSampleTensor(plan[i], i + 1);
    if (!tensor.ok()) return ReportError(kCommand, tensor.status());
    total += tensor->size_bytes();
    progress.Update(total);
    tensors.push_back(*std::move(tensor));
  }
  progress.Finish();
  for (size_t i = 0; i < plan.size(); ++i) named.push_back({plan[i].name, tensors[i].view()});
  Status written =
      format == "safetensors"
          ? WriteSafetensors(options.path, named, {{"format", "pt"}, {"generator", "ferry sample"}})
      : format == "npz" ? WriteNpz(options.path, named, /*compressed=*/false)
                        : WriteNpy(options.path, named[0].view);
  if (!written.ok()) return ReportError(kCommand, written);
  fmt::print("wrote {}: {} tensors, {} ({})\n", options.path, plan.size(),
             FormatBytes(static_cast<double>(total)), format);
  return kExitOk;
}

}  // namespace

CommandRunner AddSampleCommand(CLI::App& app) {
  auto options = std::make_shared<SampleOptions>();
  CLI::App* command =
      app.add_subcommand("sample", "Write a realistic sample checkpoint for demos and benchmarks");
  command->add_option("file", options->path, "Output file")->required();
  command
      ->add_option("--size", options->size,
                   "Size of the tensors, e.g. 64MiB or 1GiB (the file holds at most this, less at "
                   "most one tensor, plus its header)")
      ->capture_default_str();
  command->add_option("--format", options->format,
                      "safetensors | npy | npz (default: from the file's extension)");
  command->add_option("--hidden", options->hidden, "Hidden size (default or 0: chosen from --size)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--dtype", options->dtype,
                      "Store every floating-point tensor as this dtype (e.g. float32, bfloat16; "
                      "default: the usual bf16/f16/f32 mix)");
  return [options] { return RunSample(*options); };
}

}  // namespace ferry::cli
