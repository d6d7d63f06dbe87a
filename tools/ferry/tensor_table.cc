#include "tools/ferry/tensor_table.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"

namespace ferry::cli {
namespace {

// `text` split at every `separator` (absl's string_view is not std's in every build).
std::vector<std::string_view> SplitAt(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(text.data(), text.size()), separator)) {
    parts.emplace_back(part.data(), part.size());
  }
  return parts;
}

bool IsNumber(std::string_view part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
}

// The first character of `word`, a whole UTF-8 sequence.
std::string_view FirstCharacter(std::string_view word) {
  size_t end = 1;
  while (end < word.size() && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) ++end;
  return word.substr(0, std::min(end, word.size()));
}

// "post_attention_layernorm" -> "p_a_layernorm" (keep_last_word) or "p_a_l".
std::string Initials(std::string_view part, bool keep_last_word) {
  const std::vector<std::string_view> words = SplitAt(part, '_');
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += '_';
    out += keep_last_word && i + 1 == words.size() ? words[i] : FirstCharacter(words[i]);
  }
  return out;
}

std::string Joined(const std::vector<std::string>& parts) {
  return fmt::format("{}", fmt::join(parts, "."));
}

// The parts of a name before its first number (never its last part) become initials:
// "model.layers.12.mlp" -> "m.l.12.mlp". A name without a number keeps them.
void ShortenPath(std::vector<std::string>& parts) {
  const auto first_number =
      std::find_if(parts.begin(), parts.end(), [](const std::string& p) { return IsNumber(p); });
  if (first_number == parts.end()) return;
  const size_t path_end =
      std::min(static_cast<size_t>(first_number - parts.begin()), parts.size() - 1);
  for (size_t i = 0; i < path_end; ++i) parts[i] = Initials(parts[i], /*keep_last_word=*/false);
}

// One name's parts shortened further, step by step (see ShortenNames), until they fit `width`.
std::string Shorten(std::vector<std::string> parts, int width) {
  const auto fits = [&] { return static_cast<int>(Joined(parts).size()) <= width; };
  if (fits()) return Joined(parts);
  const size_t last = parts.size() - 1;
  for (const bool keep_last_word : {true, false}) {
    for (size_t i = 0; i < last; ++i) {
      if (IsNumber(parts[i])) continue;
      parts[i] = Initials(parts[i], keep_last_word);
      if (fits()) return Joined(parts);
    }
  }
  for (const bool keep_last_word : {true, false}) {
    parts[last] = Initials(parts[last], keep_last_word);
    if (fits()) return Joined(parts);
  }
  return ElideMiddle(Joined(parts), width);
}

// The dotted parts every name begins with and has more parts after ("model.layers."), or "".
std::string SharedPrefix(const std::vector<std::string>& names) {
  if (names.size() < 2) return "";
  std::vector<std::string_view> shared = SplitAt(names.front(), '.');
  shared.pop_back();  // a prefix leaves at least the last part of every name
  for (const std::string& name : names) {
    const std::vector<std::string_view> parts = SplitAt(name, '.');
    size_t common = 0;
    while (common < shared.size() && common + 1 < parts.size() && parts[common] == shared[common]) {
      ++common;
    }
    shared.resize(common);
  }
  return shared.empty() ? "" : fmt::format("{}.", fmt::join(shared, "."));
}

int NaturalWidth(const TextTable::Column& column, const std::vector<std::vector<std::string>>& rows,
                 size_t index) {
  int width = static_cast<int>(column.header.size());
  for (const auto& row : rows) width = std::max(width, static_cast<int>(row[index].size()));
  return width;
}

}  // namespace

std::string DTypeCell(std::string_view file_dtype, std::string_view device_dtype) {
  return file_dtype == device_dtype ? std::string(file_dtype)
                                    : fmt::format("{} -> {}", file_dtype, device_dtype);
}

std::optional<ShortNames> ShortenNames(const std::vector<std::string>& names, int width) {
  ShortNames result;
  result.names = names;
  if (std::all_of(names.begin(), names.end(), [&](const std::string& name) {
        return static_cast<int>(name.size()) <= width;
      })) {
    return result;
  }
  // Every name alike while that is enough (the shared prefix left out, then the paths to the
  // numbered parts as initials), so that names of one kind look alike; then each long one alone.
  result.dropped_prefix = SharedPrefix(names);
  std::vector<std::vector<std::string>> parts;
  for (const std::string& name : names) {
    parts.emplace_back();
    for (std::string_view part : SplitAt(name, '.')) parts.back().emplace_back(part);
    parts.back().erase(parts.back().begin(),
                       parts.back().begin() + static_cast<std::ptrdiff_t>(
                                                  SplitAt(result.dropped_prefix, '.').size() - 1));
  }
  const auto all_fit = [&] {
    return std::all_of(parts.begin(), parts.end(), [&](const std::vector<std::string>& name) {
      return static_cast<int>(Joined(name).size()) <= width;
    });
  };
  if (!all_fit()) {
    for (std::vector<std::string>& name : parts) ShortenPath(name);
  }
  for (size_t i = 0; i < names.size(); ++i) result.names[i] = Shorten(parts[i], width);
  // Distinct: no two different names shortened alike (one name twice, from two files, is fine).
  std::map<std::string_view, std::string_view> whole_of;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto [it, added] = whole_of.emplace(result.names[i], names[i]);
    if (!added && it->second != names[i]) return std::nullopt;
  }
  return result;
}

std::string RenderTensorTable(const std::vector<std::string>& names,
                              const std::vector<TextTable::Column>& columns,
                              const std::vector<std::vector<std::string>>& rows, int width,
                              bool wide, std::string& note) {
  note.clear();
  using Align = TextTable::Align;
  int others = 0;
  for (size_t c = 0; c < columns.size(); ++c) others += 1 + NaturalWidth(columns[c], rows, c);
  std::optional<ShortNames> short_names;
  if (wide) {
    short_names = ShortNames{names, ""};
  } else {
    short_names = ShortenNames(names, std::max(kMinimumNameWidth, width - others));
  }
  if (short_names.has_value()) {
    std::vector<TextTable::Column> all = {{"tensor", Align::kLeft, -1}};
    all.insert(all.end(), columns.begin(), columns.end());
    TextTable table(std::move(all));
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<std::string> cells = {short_names->names[r]};
      cells.insert(cells.end(), rows[r].begin(), rows[r].end());
      table.AddRow(std::move(cells));
    }
    if (short_names->names != names) {
      note = short_names->dropped_prefix.empty()
                 ? std::string("tensor names shortened to fit; --wide shows them whole")
                 : fmt::format(
                       "tensor names shortened to fit (each begins '{}'); --wide shows "
                       "them whole",
                       short_names->dropped_prefix);
    }
    return table.Render(wide ? std::numeric_limits<int>::max() : width);
  }
  // Names that cannot be shortened apart: each whole on a line of its own, its row below it.
  constexpr int kIndent = 2;
  TextTable table(columns);
  for (const auto& row : rows) table.AddRow(row);
  const std::string rendered = table.Render(width - kIndent);
  const std::vector<std::string_view> lines = SplitAt(rendered, '\n');
  std::string out = "tensor\n";
  out += std::string(kIndent, ' ') + std::string(lines[0]) + "\n";
  for (size_t r = 0; r < names.size(); ++r) {
    // Continued at the margin (rows are indented), so that its lines joined are the name.
    out += WrapToString(names[r], width, 0) + "\n";
    out += std::string(kIndent, ' ') + std::string(lines[r + 1]) + "\n";
  }
  return out;
}

std::string RenderPutTable(const std::vector<std::string>& names,
                           const std::vector<TextTable::Column>& columns,
                           const std::vector<std::vector<std::string>>& rows, int width, bool wide,
                           const std::vector<std::string>& files) {
  std::string names_note;
  std::string out = RenderTensorTable(names, columns, rows, width, wide, names_note);
  const int text_width = wide ? std::numeric_limits<int>::max() : width;
  const auto add = [&](const std::string& text) { out += WrapToString(text, text_width) + "\n"; };
  if (!names_note.empty()) add(names_note);
  if (files.size() > 1) {
    for (size_t i = 0; i < files.size(); ++i) {
      add(fmt::format("file {}: {}", i + 1, Printable(files[i])));
    }
  }
  return out;
}

}  // namespace ferry::cli
