// The per-tensor table of `ferry put` (one process and `--mesh all`): tensor names that stay
// distinct at any width, and the table laid out around them. Nothing here keeps state; all of it
// is thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/ferry/text_layout.h"

namespace ferry::cli {

// Names shortened for a column of `width` bytes.
struct ShortNames {
  std::vector<std::string> names;  // one per input name, in order, each at most `width` bytes
  // The dotted prefix every name began with ("model.layers.") when it was left out, else empty.
  std::string dropped_prefix;
};

// A dtype column's cell: "float32" when the device holds the file's dtype, else
// "float32 -> bfloat16".
std::string DTypeCell(std::string_view file_dtype, std::string_view device_dtype);

// `names` unchanged when each fits `width`. Otherwise shortened one step at a time until each
// fits: the dotted prefix shared by every name is left out; the parts before a name's first
// number become initials ("model.layers.12." -> "m.l.12."); those two steps apply to every name
// alike, so that names of one kind look alike. Then each name still too long alone: its other
// inner parts keep the last word of each (`post_attention_layernorm` -> `p_a_layernorm`), then
// become initials (`p_a_l`); its last part keeps its last word (`inv_freq` -> `i_freq`), then
// becomes initials; last, the middle of what is left gives way to "...". Numbers (layer indices)
// are kept whole by every step but that last one. nullopt when the result would not be distinct
// (two different names shortened alike): the caller then prints whole names.
std::optional<ShortNames> ShortenNames(const std::vector<std::string>& names, int width);

// A table whose first column is tensor names (already Printable) and whose other columns are
// `columns` (their cells in `rows`, one row per name), laid out for `width` columns:
// - `wide`: whole names, the lines as long as they must be;
// - else, when ShortenNames gives distinct names for the room the other columns leave (at least
//   `kMinimumNameWidth`): one line per tensor;
// - else every whole name on lines of its own (wrapped at the margin), its row indented below.
// Each line ends in '\n'. `note` receives a line to print after the table when names were
// shortened (what was left out, and that --wide shows whole names), else is cleared.
inline constexpr int kMinimumNameWidth = 12;
std::string RenderTensorTable(const std::vector<std::string>& names,
                              const std::vector<TextTable::Column>& columns,
                              const std::vector<std::vector<std::string>>& rows, int width,
                              bool wide, std::string& note);

// A put's table (RenderTensorTable) and the lines that belong to it: the note on shortened names
// and, when several `files` were put, "file N: <path>" for each (the table's file column gives
// N). Lines wrap at `width`, or not at all with `wide`.
std::string RenderPutTable(const std::vector<std::string>& names,
                           const std::vector<TextTable::Column>& columns,
                           const std::vector<std::vector<std::string>>& rows, int width, bool wide,
                           const std::vector<std::string>& files);

}  // namespace ferry::cli
