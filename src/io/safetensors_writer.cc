#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "ferry/io/tensor_writer.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "src/io/file_error.h"
#include "src/io/little_endian.h"
#include "src/io/output_file.h"
#include "src/io/row_major_chunks.h"
#include "src/io/utf8.h"

namespace ferry {
namespace {

using OrderedJson = nlohmann::ordered_json;

Status CheckText(std::string_view text, std::string_view what, std::string_view path) {
  if (io_internal::FindInvalidUtf8(text) >= 0) {
    return InvalidArgumentError(
        fmt::format("cannot write '{}': {} is not valid UTF-8", path, what));
  }
  return OkStatus();
}

}  // namespace

Status WriteSafetensors(const std::string& path, absl::Span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const NamedTensor& tensor : tensors) {
    const std::string context = fmt::format("cannot write '{}': tensor '{}'", path, tensor.name);
    if (tensor.name.empty()) {
      return InvalidArgumentError(
          fmt::format("cannot write '{}': a tensor has an empty name", path));
    }
    if (tensor.name == "__metadata__") {
      return InvalidArgumentError(
          fmt::format("{}: the name is reserved for the file's metadata", context));
    }
    FERRY_RETURN_IF_ERROR(
        CheckText(tensor.name, fmt::format("tensor name '{}'", tensor.name), path));
    if (!names.insert(tensor.name).second) {
      return InvalidArgumentError(fmt::format("{}: the name is used twice", context));
    }
    if (GetDTypeInfo(tensor.view.dtype).safetensors_name.empty()) {
      return InvalidArgumentError(fmt::format("{}: safetensors has no dtype for {}", context,
                                              DTypeName(tensor.view.dtype)));
    }
    auto addressed = tensor.view.ComputeAddressedBytes(tensor.name);
    if (!addressed.ok()) {
      return InvalidArgumentError(
          fmt::format("cannot write '{}': {}", path, io_internal::MessageOf(addressed.status())));
    }
  }
  for (const auto& [key, value] : metadata) {
    FERRY_RETURN_IF_ERROR(CheckText(key, fmt::format("metadata key '{}'", key), path));
    FERRY_RETURN_IF_ERROR(CheckText(value, fmt::format("metadata value of '{}'", key), path));
  }

  // The reference writer's order: larger elements first (so every tensor is aligned to its
  // element size, given an 8-byte aligned data area), then by name.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t size_a = tensors[a].view.element_size();
    const int64_t size_b = tensors[b].view.element_size();
    if (size_a != size_b) return size_a > size_b;
    return tensors[a].name < tensors[b].name;
  });

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson metadata_json = OrderedJson::object();
    for (const auto& [key, value] : metadata) metadata_json[key] = value;
    header["__metadata__"] = std::move(metadata_json);
  }
  int64_t offset = 0;
  for (size_t index : order) {
    const NamedTensor& tensor = tensors[index];
    const int64_t size = tensor.view.dense_size_bytes();
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = std::string(GetDTypeInfo(tensor.view.dtype).safetensors_name);
    entry["shape"] = std::vector<int64_t>(tensor.view.dims.begin(), tensor.view.dims.end());
    entry["data_offsets"] = OrderedJson::array({offset, offset + size});
    header[tensor.name] = std::move(entry);
    offset += size;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::string prefix;
  io_internal::AppendLittleEndian<uint64_t>(prefix, header_text.size());
  FERRY_ASSIGN_OR_RETURN(io_internal::OutputFile file, io_internal::OutputFile::Create(path));
  FERRY_RETURN_IF_ERROR(file.Write(prefix.data(), static_cast<int64_t>(prefix.size())));
  FERRY_RETURN_IF_ERROR(file.Write(header_text.data(), static_cast<int64_t>(header_text.size())));
  for (size_t index : order) {
    FERRY_RETURN_IF_ERROR(io_internal::ForEachRowMajorChunk(
        tensors[index].view, io_internal::kDefaultChunkBytes,
        [&](const std::byte* bytes, int64_t size) { return file.Write(bytes, size); }));
  }
  return file.Commit();
}

}  // namespace ferry
