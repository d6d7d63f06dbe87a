// libFuzzer target: any bytes, parsed as one tensor file format (FERRY_FUZZ_FORMAT, a
// ferry::TensorFileFormat enumerator set per target by fuzz/CMakeLists.txt), must give a
// TensorFile or an error status: never a crash, a hang, a leak or a read outside the input
// (ASan and UBSan are on).
#include <cstddef>
#include <cstdint>

#include "ferry/io/tensor_file.h"

#ifndef FERRY_FUZZ_FORMAT
#error "FERRY_FUZZ_FORMAT must name a ferry::TensorFileFormat enumerator"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file =
      ferry::MappedFile::FromBytes({reinterpret_cast<const std::byte*>(data), size}, "fuzz-input");
  if (!file.ok()) return 0;
  ferry::TensorFileOptions options;
  options.format = ferry::TensorFileFormat::FERRY_FUZZ_FORMAT;
  options.verify_stored_crc32 = (size % 2) == 1;  // cover both CRC paths
  auto parsed = ferry::ParseTensorFile(*file, options);
  if (parsed.ok()) {
    // Read every byte of every tensor through its view, so that a view pointing outside the
    // input (which validation must have prevented) is caught by ASan here.
    uint8_t sum = 0;
    for (const ferry::TensorFileEntry& entry : parsed->tensors()) {
      const ferry::HostView& view = entry.source->view();
      auto addressed = view.ComputeAddressedBytes(entry.name);
      if (!addressed.ok()) __builtin_trap();
      const auto* base = static_cast<const uint8_t*>(view.data);
      for (int64_t i = addressed->begin; i < addressed->end; ++i) sum += base[i];
    }
    volatile uint8_t sink = sum;
    (void)sink;
  }
  return 0;
}
