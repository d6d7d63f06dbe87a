// Laying out the `ferry` command's text for a terminal: the width to fit, wrapped paragraphs,
// names shortened in the middle, tables whose widest columns give way, and a help formatter for
// CLI11 that wraps descriptions. Widths are counted in terminal columns (DisplayWidth), never
// cutting a UTF-8 character in two. Nothing here keeps state; all of it is thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"

namespace ferry::cli {

// The width a line written to `fd` may take: without a terminal (a pipe, a file) $COLUMNS when it
// holds a number, else kDefaultWidth; on a terminal its own width. Never below kMinimumWidth, so
// that a tiny window gives short lines rather than a broken layout.
inline constexpr int kDefaultWidth = 80;
inline constexpr int kMinimumWidth = 40;
int OutputWidth(int fd);

// The columns `text` (UTF-8) takes on a terminal: wcwidth of each character under C.UTF-8 (a wide
// East Asian character 2, a combining mark 0), 1 for ASCII and for bytes that are not UTF-8.
int DisplayWidth(std::string_view text);

// `text` if it is at most `width` columns wide, else its head and tail around "..." in exactly
// `width` columns, whole characters only (then a column shorter where a wide one did not fit).
// Tensor names keep their informative ends: "model.layers.31.self_attn.q_proj.weight" ->
// "model.laye...proj.weight".
std::string ElideMiddle(std::string_view text, int width);

// `text` broken at spaces into lines of at most `width` columns; lines after the first start with
// `indent` spaces. A word longer than a line is broken where it must be.
std::vector<std::string> WrapText(std::string_view text, int width, int indent = 2);
// The same lines joined with '\n' (no trailing newline).
std::string WrapToString(std::string_view text, int width, int indent = 2);

// A table that fits `width`: columns are as wide as their widest cell; when the row is too wide,
// the columns marked shrinkable give way in the order they were marked (down to their minimum,
// their cells shortened with ElideMiddle), and the row keeps one space between columns.
class TextTable {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string header;
    Align align = Align::kLeft;
    int shrink_order = -1;  // -1: keeps its width; 0 gives way first, then 1, ...
    int minimum_width = 8;
  };
  explicit TextTable(std::vector<Column> columns) : columns_(std::move(columns)) {}
  // `cells` has one entry per column.
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  // The header and every row, each line ending in '\n' and at most `width` columns wide (unless
  // even the minimum widths do not fit, which the callers' columns rule out at kMinimumWidth).
  std::string Render(int width) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// CLI11's help with every description wrapped to the terminal (OutputWidth(stdout)) and names in
// a column of at most a third of it.
class WrappingHelpFormatter : public CLI::Formatter {
 public:
  WrappingHelpFormatter();
  std::string make_option(const CLI::Option* option, bool is_positional) const override;
  std::string make_subcommand(const CLI::App* command) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;

 private:
  // "  NAME   description..." with the description wrapped in the right-hand column.
  std::string NameAndDescription(const std::string& name, const std::string& description) const;
  int width_;
};

}  // namespace ferry::cli
