// TensorFile: a safetensors, .npy or .npz file opened as one TensorSource per tensor.
//
// Opening a file maps it read-only (MappedFile) and validates all of it that can be validated
// without reading tensor data: every rule of each format is checked (docs/files.md lists them),
// and every malformed input is an InvalidArgument status whose message names the file, the tensor
// (or zip member) and the broken rule. Nothing outside the file is ever read.
//
// Zero copy: a tensor whose bytes lie in the file as they are (safetensors, .npy, stored .npz
// members, little- or big-endian) becomes a source that *borrows* the mapping: its view points
// into the mapped file, with the file's dtype and, for Fortran-ordered .npy arrays, column-major
// byte strides. Big-endian data ('>' descr) is borrowed too: its view is marked `byte_swapped`
// and the fused copy-convert reverses each element as it reads it, in the same pass as the copy
// (no extra pass, no copy at open). Members of a compressed .npz (savez_compressed) cannot be
// borrowed: they are inflated chunk by chunk with zlib, once, at open time, into memory owned by
// their source. `TensorFileEntry::zero_copy` says which kind each tensor is.
//
// Lifetime: every source holds a reference to the mapping (or to its decoded memory), so sources
// may outlive the TensorFile they came from; the file is unmapped when the TensorFile and the last
// source are gone (for asynchronous transfers: when the last transfer has read its source).
// A TensorFile is immutable after Open and safe to use from several threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/core/status.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_selection.h"
#include "ferry/runtime/tensor_source.h"

namespace ferry {

enum class TensorFileFormat { kSafetensors, kNpy, kNpz };

// "safetensors", "npy" or "npz".
std::string_view TensorFileFormatName(TensorFileFormat format);

// The format a file's name says: ".safetensors", ".npy" or ".npz" at its end (any case); nullopt
// for any other name. Opening goes by the bytes (TensorFileOptions::format); the name only
// explains a file that is too short to tell, or that does not start as its name says.
std::optional<TensorFileFormat> TensorFileFormatFromName(std::string_view name);

struct TensorFileOptions {
  // The format to parse the bytes as. Empty: detect it from the first bytes ("\x93NUMPY" is .npy,
  // "PK\x03\x04" or "PK\x05\x06" is .npz, anything else is safetensors, which has no magic).
  std::optional<TensorFileFormat> format;
  // Checks the CRC-32 of *stored* .npz members at open time. Off by default: it reads every byte
  // of the file once more, which defeats zero-copy loading. Deflated members are always checked
  // (their bytes are being read anyway).
  bool verify_stored_crc32 = false;
  // Only the tensors this selector selects are opened (not owned; asked once about every tensor
  // name; null: every tensor). The others are left unread: a deflated .npz member is not
  // inflated, a stored member's .npy header is not parsed, and Prefetch skips their bytes. The
  // file's own structure (a safetensors header, the zip directory) is still validated whole.
  // Open does not check that everything asked for was found: call the selector's
  // CheckEverythingMatched after the last file of the set.
  TensorSelector* selector = nullptr;
};

struct TensorFileEntry {
  // The tensor's name: the safetensors key; the .npz member name without ".npy"; for a .npy file
  // the file name without its directory and ".npy" extension.
  std::string name;
  // The tensor, in the dtype the file stores it in (a big-endian '>f4' array is float32). Its name
  // is "<file>:<tensor>" so transfer errors say where the tensor came from.
  std::shared_ptr<const TensorSource> source;
  // True when `source` borrows the mapped file; false when it owns an inflated copy (compressed
  // .npz member).
  bool zero_copy = true;
  // True when the file stores the tensor big-endian: the source's view is byte_swapped (see
  // HostView), so transfers and CopyConvert reverse its bytes as they read them.
  bool byte_swapped = false;
  // Offset in the file of the tensor's first byte as stored; -1 for compressed members.
  int64_t file_offset = -1;
};

class TensorFile {
 public:
  // Maps `path` and parses it (see ParseTensorFile). Errors from opening or mapping the file carry
  // their errno-derived code (NotFound, PermissionDenied, ...); malformed contents are
  // InvalidArgument; ResourceExhausted when memory for decoded tensors cannot be allocated.
  static StatusOr<TensorFile> Open(const std::string& path, const TensorFileOptions& options = {});

  // The tensors: safetensors in data-offset order (the order of the bytes in the file), .npz in
  // central-directory order, .npy: one. The vector and its sources live as long as this object;
  // copy the shared_ptrs to keep sources longer.
  const std::vector<TensorFileEntry>& tensors() const { return tensors_; }
  // The entry named `name`, or nullptr. The pointer is valid for the life of this object.
  const TensorFileEntry* Find(std::string_view name) const;

  TensorFileFormat format() const { return format_; }
  std::string_view format_name() const { return TensorFileFormatName(format_); }
  // safetensors `__metadata__` (string to string); empty for .npy and .npz.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The file's path (or the display name given to ParseTensorFile).
  const std::string& display_name() const { return file_->display_name(); }
  int64_t file_size() const { return file_->size(); }
  // The bytes of the file; valid as long as this object or any of its sources.
  const std::shared_ptr<const MappedFile>& file() const { return file_; }

  // Reads ahead the part of the file that holds the opened tensors' data (MappedFile::Prefetch):
  // call it right after Open, before transferring the tensors, when the file may not be in the
  // page cache. With a selector, only the selected tensors' bytes (and gaps of less than a page
  // between them) are read.
  // `touch_threads` = 0 only advises the kernel (asynchronous, returns at once); > 0 also faults
  // every page in from that many threads and returns when the data is resident.
  void Prefetch(int touch_threads = 0) const;

 private:
  friend StatusOr<TensorFile> ParseTensorFile(std::shared_ptr<const MappedFile> file,
                                              const TensorFileOptions& options);
  TensorFile() = default;

  std::shared_ptr<const MappedFile> file_;
  TensorFileFormat format_ = TensorFileFormat::kSafetensors;
  std::vector<TensorFileEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  // The byte ranges [begin, end) that hold the opened tensors' data, for Prefetch.
  std::vector<std::pair<int64_t, int64_t>> data_ranges_;
};

// Parses bytes that are already in memory (a mapping, or a buffer from MappedFile::FromBytes): the
// entry point that Open uses and that the fuzzers call. The result holds `file` alive.
StatusOr<TensorFile> ParseTensorFile(std::shared_ptr<const MappedFile> file,
                                     const TensorFileOptions& options = {});

}  // namespace ferry
