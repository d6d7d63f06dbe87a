#include "ferry/io/sample_checkpoint.h"

#include "ferry/core/copy_convert.h"
#include "ferry/io/tensor_writer.h"
#include "fmt/format.h"

namespace ferry {

int64_t SampleTensorBytes(const SampleTensor& tensor) {
  return SaturatedProduct(SaturatedNumElements(tensor.dims), DTypeSize(tensor.dtype));
}

StatusOr<std::vector<SampleTensor>> PlanSampleCheckpoint(int64_t target_bytes, int64_t hidden,
                                                         std::optional<DType> float_dtype) {
  if (hidden < 0) {
    return InvalidArgumentError(fmt::format("the hidden size must be positive, not {}", hidden));
  }
  // The dtype of a floating-point tensor that real checkpoints store as `usual`.
  auto floating = [&](DType usual) { return float_dtype.value_or(usual); };
  // What every plan holds whatever its layers: the embedding, the position table, the final
  // norm and the head.
  const auto fixed_tensors = [&](int64_t h) {
    const int64_t vocab = 4 * h;
    return std::pair<std::vector<SampleTensor>, std::vector<SampleTensor>>{
        {{"model.embed_tokens.weight", floating(DType::kBF16), {vocab, h}},
         {"model.position_ids", DType::kS64, {1, 2048}}},
        {{"model.norm.weight", floating(DType::kF32), {h}},
         {"lm_head.weight", floating(DType::kF32), {vocab / 4, h}}}};
  };
  const auto fixed_bytes = [&](int64_t h) {
    const auto [head, tail] = fixed_tensors(h);
    int64_t bytes = 0;
    for (const SampleTensor& tensor : head) bytes += SampleTensorBytes(tensor);
    for (const SampleTensor& tensor : tail) bytes += SampleTensorBytes(tensor);
    return bytes;
  };
  const bool chosen = hidden == 0;
  if (chosen) {
    constexpr int64_t kSmallestHidden = 64;
    hidden = 256;
    while (hidden < 2048 && 12 * hidden * hidden * 2 * 8 < target_bytes) hidden *= 2;
    // A small target gets a narrower model, so that the fixed tensors alone fit it.
    while (hidden > kSmallestHidden && fixed_bytes(hidden) > target_bytes) hidden /= 2;
  }
  if (fixed_bytes(hidden) > target_bytes) {
    return InvalidArgumentError(fmt::format(
        "a sample checkpoint of {} bytes is too small for a model of hidden size {}{}: its "
        "embedding, position table, norm and head alone take {} bytes: ask for at least {} "
        "bytes{}",
        target_bytes, hidden, float_dtype ? fmt::format(" in {}", DTypeName(*float_dtype)) : "",
        fixed_bytes(hidden), fixed_bytes(hidden), chosen ? "" : ", or a smaller hidden size"));
  }
  auto [plan, tail] = fixed_tensors(hidden);
  int64_t total = 0;
  for (const SampleTensor& tensor : plan) total += SampleTensorBytes(tensor);
  for (const SampleTensor& tensor : tail) total += SampleTensorBytes(tensor);
  // Layer tensors while the next one fits; the first that would pass the target ends the plan.
  for (int layer = 0;; ++layer) {
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    const std::vector<SampleTensor> layer_tensors = {
        {prefix + "input_layernorm.weight", floating(DType::kF32), {hidden}},
        {prefix + "self_attn.q_proj.weight", floating(DType::kBF16), {hidden, hidden}},
        {prefix + "self_attn.k_proj.weight", floating(DType::kBF16), {hidden, hidden}},
        {prefix + "self_attn.v_proj.weight", floating(DType::kBF16), {hidden, hidden}},
        {prefix + "self_attn.o_proj.weight", floating(DType::kBF16), {hidden, hidden}},
        {prefix + "self_attn.rotary_emb.inv_freq", floating(DType::kF32), {hidden / 64}},
        {prefix + "post_attention_layernorm.weight", floating(DType::kF32), {hidden}},
        {prefix + "mlp.gate_proj.weight", floating(DType::kF16), {4 * hidden, hidden}},
        {prefix + "mlp.up_proj.weight", floating(DType::kBF16), {4 * hidden, hidden}},
        {prefix + "mlp.down_proj.weight", floating(DType::kBF16), {hidden, 4 * hidden}},
    };
    for (const SampleTensor& tensor : layer_tensors) {
      if (total + SampleTensorBytes(tensor) > target_bytes) {
        plan.insert(plan.end(), tail.begin(), tail.end());
        return plan;
      }
      total += SampleTensorBytes(tensor);
      plan.push_back(tensor);
    }
  }
}

StatusOr<HostTensor> FillSampleTensor(const SampleTensor& tensor, uint64_t seed) {
  FERRY_ASSIGN_OR_RETURN(HostTensor as_f32, HostTensor::Allocate(DType::kF32, tensor.dims));
  auto* values = reinterpret_cast<float*>(as_f32.data());
  const int64_t count = as_f32.size_bytes() / 4;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const double uniform = static_cast<double>(state >> 11) * 0x1.0p-53;
    values[i] = tensor.dtype == DType::kS64 ? static_cast<float>(i % 2048)
                                            : static_cast<float>((uniform - 0.5) * 0.08);
  }
  if (tensor.dtype == DType::kF32) return as_f32;
  FERRY_ASSIGN_OR_RETURN(HostTensor converted, HostTensor::Allocate(tensor.dtype, tensor.dims));
  FERRY_RETURN_IF_ERROR(CopyConvert(as_f32.view(), converted.mutable_view()));
  return converted;
}

Status WriteSampleSafetensors(const std::string& path, const std::vector<SampleTensor>& plan,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<HostTensor> tensors;
  std::vector<NamedTensor> named;
  tensors.reserve(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(HostTensor tensor, FillSampleTensor(plan[i], i + 1));
    tensors.push_back(std::move(tensor));
    named.push_back({plan[i].name, tensors.back().view()});
  }
  return WriteSafetensors(path, named, metadata);
}

}  // namespace ferry
