#include "ferry/io/tensor_selection.h"

#include <algorithm>
#include <utility>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/io/file_error.h"
#include "src/io/utf8.h"

namespace ferry {
namespace {

using io_internal::FirstCharacter;
using io_internal::Utf8Character;

// A bracket expression `[...]` that starts at pattern[begin], tried on the character
// `code_point`. `closed` is false when no `]` closes it (the `[` then stands for itself).
struct BracketResult {
  bool closed = false;
  bool matched = false;
  size_t end = 0;  // just after the closing `]`
};

BracketResult MatchBracket(std::string_view pattern, size_t begin, uint32_t code_point) {
  size_t i = begin + 1;
  bool negated = false;
  if (i < pattern.size() && pattern[i] == '!') {
    negated = true;
    ++i;
  }
  bool matched = false;
  for (bool first = true; i < pattern.size(); first = false) {
    if (pattern[i] == ']' && !first) return {true, matched != negated, i + 1};
    const Utf8Character low = FirstCharacter(pattern.substr(i));
    i += static_cast<size_t>(low.length);
    uint32_t high = low.code_point;
    // "a-z" is a range; a '-' first, last or after a range is a member of its own.
    if (i + 1 < pattern.size() && pattern[i] == '-' && pattern[i + 1] != ']') {
      const Utf8Character end = FirstCharacter(pattern.substr(i + 1));
      high = end.code_point;
      i += 1 + static_cast<size_t>(end.length);
    }
    if (low.code_point <= code_point && code_point <= high) matched = true;
  }
  return {};
}

// Matches the one pattern element at pattern[*p] (not a '*') against one character of the name;
// on a match advances *p past the element.
bool MatchElement(std::string_view pattern, size_t* p, const Utf8Character& character) {
  if (pattern[*p] == '?') {
    ++*p;
    return true;
  }
  if (pattern[*p] == '[') {
    const BracketResult bracket = MatchBracket(pattern, *p, character.code_point);
    if (bracket.closed) {
      if (bracket.matched) *p = bracket.end;
      return bracket.matched;
    }
  }
  const Utf8Character literal = FirstCharacter(pattern.substr(*p));
  if (literal.code_point != character.code_point) return false;
  *p += static_cast<size_t>(literal.length);
  return true;
}

}  // namespace

bool GlobMatches(std::string_view pattern, std::string_view name) {
  // Left to right; on a mismatch, the last '*' takes one more character and the rest is tried
  // again (linear in practice, never exponential: only the last star is retried).
  size_t p = 0;
  size_t n = 0;
  size_t star_p = std::string_view::npos;  // just after the last '*' seen
  size_t star_n = 0;                       // where the name stood when it was seen
  while (n < name.size()) {
    const Utf8Character character = FirstCharacter(name.substr(n));
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = ++p;
      star_n = n;
      continue;
    }
    if (p < pattern.size() && MatchElement(pattern, &p, character)) {
      n += static_cast<size_t>(character.length);
      continue;
    }
    if (star_p == std::string_view::npos) return false;
    star_n += static_cast<size_t>(FirstCharacter(name.substr(star_n)).length);
    n = star_n;
    p = star_p;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

TensorSelector::TensorSelector(std::vector<std::string> names, std::vector<std::string> patterns,
                               std::vector<std::string> exclude)
    : names_(std::move(names)),
      patterns_(std::move(patterns)),
      exclude_(std::move(exclude)),
      name_found_(names_.size(), false),
      pattern_matched_(patterns_.size(), false) {
  for (size_t i = 0; i < names_.size(); ++i) name_index_.emplace(names_[i], i);
}

bool TensorSelector::Selects(std::string_view name) {
  ++seen_;
  bool included = names_.empty() && patterns_.empty();
  if (const auto found = name_index_.find(name); found != name_index_.end()) {
    name_found_[found->second] = included = true;
  }
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (GlobMatches(patterns_[i], name)) pattern_matched_[i] = included = true;
  }
  if (!included) return false;
  for (const std::string& pattern : exclude_) {
    if (GlobMatches(pattern, name)) return false;
  }
  ++selected_;
  return true;
}

Status TensorSelector::CheckEverythingMatched(std::string_view where) const {
  using io_internal::EscapeForMessage;
  using io_internal::kQuotedNameLength;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!name_found_[name_index_.at(names_[i])]) {  // a name given twice: its first index
      return absl::NotFoundError(fmt::format(
          "no tensor named '{}' in {}", EscapeForMessage(names_[i], kQuotedNameLength), where));
    }
  }
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (!pattern_matched_[i]) {
      return absl::NotFoundError(fmt::format("the pattern '{}' matches no tensor in {}",
                                             EscapeForMessage(patterns_[i], kQuotedNameLength),
                                             where));
    }
  }
  if (selected_ == 0 && seen_ > 0) {
    std::vector<std::string> quoted;
    for (const std::string& pattern : exclude_) {
      quoted.push_back(fmt::format("'{}'", EscapeForMessage(pattern, kQuotedNameLength)));
    }
    return InvalidArgumentError(fmt::format("the exclusions {} leave no tensor to load in {}",
                                            fmt::join(quoted, ", "), where));
  }
  return OkStatus();
}

}  // namespace ferry
