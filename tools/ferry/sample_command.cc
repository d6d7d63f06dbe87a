// `ferry sample FILE --size SIZE`: writes a realistic checkpoint (transformer-like shapes, mixed
// dtypes, deterministic pseudo-random values) for demos and benchmarks.
#include <cmath>
#include <string>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
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
};

struct PlannedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> dims;
};

int64_t BytesOf(const PlannedTensor& tensor) {
  int64_t count = 1;
  for (int64_t dim : tensor.dims) count *= dim;
  return count * DTypeSize(tensor.dtype);
}

// A decoder-only transformer's tensors, layer after layer, until `target_bytes` is reached.
std::vector<PlannedTensor> PlanCheckpoint(int64_t target_bytes, int64_t hidden) {
  if (hidden == 0) {
    hidden = 256;
    while (hidden < 2048 && 12 * hidden * hidden * 2 * 8 < target_bytes) hidden *= 2;
  }
  const int64_t vocab = 4 * hidden;
  std::vector<PlannedTensor> plan = {
      {"model.embed_tokens.weight", DType::kBF16, {vocab, hidden}},
      {"model.position_ids", DType::kS64, {1, 2048}},
  };
  int64_t total = BytesOf(plan[0]) + BytesOf(plan[1]);
  for (int layer = 0; total < target_bytes; ++layer) {
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    const std::vector<PlannedTensor> layer_tensors = {
        {prefix + "input_layernorm.weight", DType::kF32, {hidden}},
        {prefix + "self_attn.q_proj.weight", DType::kBF16, {hidden, hidden}},
        {prefix + "self_attn.k_proj.weight", DType::kBF16, {hidden, hidden}},
        {prefix + "self_attn.v_proj.weight", DType::kBF16, {hidden, hidden}},
        {prefix + "self_attn.o_proj.weight", DType::kBF16, {hidden, hidden}},
        {prefix + "self_attn.rotary_emb.inv_freq", DType::kF32, {hidden / 64}},
        {prefix + "post_attention_layernorm.weight", DType::kF32, {hidden}},
        {prefix + "mlp.gate_proj.weight", DType::kF16, {4 * hidden, hidden}},
        {prefix + "mlp.up_proj.weight", DType::kBF16, {4 * hidden, hidden}},
        {prefix + "mlp.down_proj.weight", DType::kBF16, {hidden, 4 * hidden}},
    };
    for (const PlannedTensor& tensor : layer_tensors) {
      total += BytesOf(tensor);
      plan.push_back(tensor);
    }
  }
  plan.push_back({"model.norm.weight", DType::kF32, {hidden}});
  plan.push_back({"lm_head.weight", DType::kF32, {vocab / 4, hidden}});
  return plan;
}

// Values like trained weights: small, centred, deterministic per tensor.
StatusOr<HostTensor> Fill(const PlannedTensor& planned, uint64_t seed) {
  FERRY_ASSIGN_OR_RETURN(HostTensor as_f32, HostTensor::Allocate(DType::kF32, planned.dims));
  auto* values = reinterpret_cast<float*>(as_f32.data());
  const int64_t count = as_f32.size_bytes() / 4;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const double uniform = static_cast<double>(state >> 11) * 0x1.0p-53;
    values[i] = planned.dtype == DType::kS64 ? static_cast<float>(i % 2048)
                                             : static_cast<float>((uniform - 0.5) * 0.08);
  }
  if (planned.dtype == DType::kF32) return as_f32;
  FERRY_ASSIGN_OR_RETURN(HostTensor converted, HostTensor::Allocate(planned.dtype, planned.dims));
  FERRY_RETURN_IF_ERROR(CopyConvert(as_f32.view(), converted.mutable_view()));
  return converted;
}

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
  std::vector<PlannedTensor> plan;
  if (format == "npy") {  // one tensor: a weight matrix of about the requested size
    const int64_t columns = 4096;
    plan.push_back({"weight", DType::kF32, {std::max<int64_t>(1, *target / 4 / columns), columns}});
  } else {
    plan = PlanCheckpoint(*target, options.hidden);
    if (format == "npz") {  // numpy has no bfloat16: .npz checkpoints keep it as float16
      for (PlannedTensor& tensor : plan) {
        if (tensor.dtype == DType::kBF16) tensor.dtype = DType::kF16;
      }
    }
  }
  std::vector<HostTensor> tensors;
  std::vector<NamedTensor> named;
  int64_t total = 0;
  ProgressBar progress("sample", [&] {
    int64_t bytes = 0;
    for (const auto& tensor : plan) bytes += BytesOf(tensor);
    return bytes;
  }());
  for (size_t i = 0; i < plan.size(); ++i) {
    auto tensor = Fill(plan[i], i + 1);
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
  command->add_option("--size", options->size, "Approximate size, e.g. 64MiB or 1GiB")
      ->capture_default_str();
  command->add_option("--format", options->format,
                      "safetensors | npy | npz (default: from the file's extension)");
  command->add_option("--hidden", options->hidden, "Hidden size (default: chosen from --size)")
      ->check(CLI::NonNegativeNumber);
  return [options] { return RunSample(*options); };
}

}  // namespace ferry::cli
