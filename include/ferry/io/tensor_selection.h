// Choosing which tensors of a file to load: exact names and shell-style glob patterns, with
// exclusions (`ferry put --only/--exclude`, `ferry.load_file(names=, pattern=, exclude=)`).
//
// A selector is handed to TensorFile::Open (TensorFileOptions::selector), which asks it about
// every tensor name of the file once and opens only the selected tensors: their bytes are the
// only tensor bytes read (a deflated .npz member that is not selected is never inflated, and
// Prefetch reads only the selected tensors). The selector remembers which names and patterns it
// met, so that after one file, or after every file of a checkpoint split over several,
// CheckEverythingMatched can say which asked-for name is in none of them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/core/status.h"

namespace ferry {

// Whether `name` matches the glob `pattern` as a whole: `*` matches any run of characters (dots
// and slashes included: "layers.*.weight" matches "layers.0.attn.weight"), `?` one character,
// `[abc]` / `[a-z]` one character of the set, `[!abc]` one character not in it; a `]` right after
// `[` or `[!` belongs to the set, and a `[` without a closing `]` stands for itself. Every other
// character stands for itself (no backslash escapes; case matters). These are the rules of
// Python's fnmatch.fnmatchcase, applied to UTF-8 characters rather than bytes.
bool GlobMatches(std::string_view pattern, std::string_view name);

// Which tensors to open. A tensor is selected when it is one of `names` or matches one of
// `patterns` (every tensor when both are empty), and matches none of `exclude`. Not thread-safe:
// one selector per open at a time.
class TensorSelector {
 public:
  TensorSelector(std::vector<std::string> names, std::vector<std::string> patterns,
                 std::vector<std::string> exclude);
  // Not copyable (name_index_ views names_); moving keeps the strings where they are.
  TensorSelector(const TensorSelector&) = delete;
  TensorSelector& operator=(const TensorSelector&) = delete;
  TensorSelector(TensorSelector&&) = default;
  TensorSelector& operator=(TensorSelector&&) = default;

  // Whether any names or patterns were given (an empty selector selects every tensor).
  bool empty() const { return names_.empty() && patterns_.empty() && exclude_.empty(); }

  // Whether the tensor called `name` is selected; notes which names and patterns it met.
  bool Selects(std::string_view name);

  // After every file's names went through Selects: NotFound naming the first of `names` that no
  // file held, or the first of `patterns` that matched no tensor (an exclusion that matches
  // nothing is fine: one exclusion list serves checkpoints with and without those tensors);
  // InvalidArgument when names and patterns matched but the exclusions left no tensor. `where`
  // names the files in the message ("file 'a.safetensors'").
  Status CheckEverythingMatched(std::string_view where) const;

 private:
  std::vector<std::string> names_;
  std::vector<std::string> patterns_;
  std::vector<std::string> exclude_;
  // names_ by name, to their first index: a load of thousands of named tensors from a file of
  // tens of thousands stays linear.
  std::unordered_map<std::string_view, size_t> name_index_;
  std::vector<bool> name_found_;       // per entry of names_ (set at a name's first index)
  std::vector<bool> pattern_matched_;  // per entry of patterns_
  int64_t seen_ = 0;                   // names asked about
  int64_t selected_ = 0;               // names selected
};

}  // namespace ferry
