#include "tools/ferry/text_layout.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <numeric>

namespace ferry::cli {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The longest prefix of `text` of at most `bytes` bytes that ends on a character boundary.
std::string_view HeadOf(std::string_view text, size_t bytes) {
  bytes = std::min(bytes, text.size());
  while (bytes > 0 && bytes < text.size() && IsUtf8Continuation(text[bytes])) --bytes;
  return text.substr(0, bytes);
}

// The longest suffix of `text` of at most `bytes` bytes that starts on a character boundary.
std::string_view TailOf(std::string_view text, size_t bytes) {
  bytes = std::min(bytes, text.size());
  size_t begin = text.size() - bytes;
  while (begin < text.size() && IsUtf8Continuation(text[begin])) ++begin;
  return text.substr(begin);
}

std::string Pad(std::string_view text, int width, TextTable::Align align) {
  const int padding = std::max(0, width - static_cast<int>(text.size()));
  return align == TextTable::Align::kLeft ? std::string(text) + std::string(padding, ' ')
                                          : std::string(padding, ' ') + std::string(text);
}

}  // namespace

int OutputWidth(int fd) {
  int width = kDefaultWidth;
  winsize size{};
  if (isatty(fd) == 1 && ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    width = size.ws_col;
  } else if (const char* columns = std::getenv("COLUMNS"); columns != nullptr) {
    const std::string_view text(columns);
    int parsed = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
    if (error == std::errc() && end == text.data() + text.size() && parsed > 0) width = parsed;
  }
  return std::max(width, kMinimumWidth);
}

std::string ElideMiddle(std::string_view text, int width) {
  if (static_cast<int>(text.size()) <= width) return std::string(text);
  constexpr std::string_view kEllipsis = "...";
  if (width <= static_cast<int>(kEllipsis.size())) return std::string(HeadOf(text, width));
  const size_t kept = static_cast<size_t>(width) - kEllipsis.size();
  // The tail gets the larger half: the end of a tensor name says what the tensor is.
  const size_t head = kept / 2;
  return std::string(HeadOf(text, head)) + std::string(kEllipsis) +
         std::string(TailOf(text, kept - head));
}

std::vector<std::string> WrapText(std::string_view text, int width, int indent) {
  width = std::max(width, indent + 1);
  std::vector<std::string> lines;
  std::string line;
  size_t position = 0;
  while (position < text.size()) {
    const size_t space = text.find(' ', position);
    std::string_view word = text.substr(
        position, space == std::string_view::npos ? std::string_view::npos : space - position);
    position = space == std::string_view::npos ? text.size() : space + 1;
    if (word.empty()) continue;
    const size_t separator = line.empty() || line.back() == ' ' ? 0 : 1;
    if (!line.empty() && line.size() + separator + word.size() > static_cast<size_t>(width) &&
        line.find_first_not_of(' ') != std::string::npos) {
      lines.push_back(line);
      line = std::string(indent, ' ');
    } else if (separator == 1) {
      line += ' ';
    }
    // A word wider than a whole line: as much as fits, then the rest on the next lines.
    while (line.size() + word.size() > static_cast<size_t>(width)) {
      const size_t room = static_cast<size_t>(width) - line.size();
      std::string_view piece = HeadOf(word, room);
      if (piece.empty()) piece = word.substr(0, std::max<size_t>(room, 1));
      line += piece;
      word.remove_prefix(piece.size());
      lines.push_back(line);
      line = std::string(indent, ' ');
    }
    line += word;
  }
  if (line.find_first_not_of(' ') != std::string::npos || lines.empty()) lines.push_back(line);
  return lines;
}

std::string WrapToString(std::string_view text, int width, int indent) {
  std::string result;
  for (const std::string& line : WrapText(text, width, indent)) {
    if (!result.empty()) result += '\n';
    result += line;
  }
  return result;
}

std::string TextTable::Render(int width) const {
  const size_t count = columns_.size();
  std::vector<int> widths(count);
  for (size_t c = 0; c < count; ++c) {
    widths[c] = static_cast<int>(columns_[c].header.size());
    for (const auto& row : rows_) widths[c] = std::max(widths[c], static_cast<int>(row[c].size()));
  }
  const auto total = [&] {
    return std::accumulate(widths.begin(), widths.end(), 0) + static_cast<int>(count) - 1;
  };
  std::vector<size_t> shrinkable;
  for (size_t c = 0; c < count; ++c) {
    if (columns_[c].shrink_order >= 0) shrinkable.push_back(c);
  }
  std::sort(shrinkable.begin(), shrinkable.end(), [&](size_t a, size_t b) {
    return columns_[a].shrink_order < columns_[b].shrink_order;
  });
  for (size_t c : shrinkable) {
    const int excess = total() - width;
    if (excess <= 0) break;
    const int floor = std::min(widths[c], columns_[c].minimum_width);
    widths[c] = std::max(floor, widths[c] - excess);
  }
  std::string out;
  const auto add_line = [&](const std::vector<std::string>& cells, bool header) {
    std::string line;
    for (size_t c = 0; c < count; ++c) {
      if (c > 0) line += ' ';
      const std::string cell = ElideMiddle(cells[c], widths[c]);
      // The last column is not padded on the left-aligned side: no trailing blanks.
      line += c + 1 == count && columns_[c].align == Align::kLeft
                  ? cell
                  : Pad(cell, widths[c], header ? Align::kLeft : columns_[c].align);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  std::vector<std::string> headers;
  for (const Column& column : columns_) headers.push_back(column.header);
  add_line(headers, /*header=*/true);
  for (const auto& row : rows_) add_line(row, /*header=*/false);
  return out;
}

WrappingHelpFormatter::WrappingHelpFormatter() : width_(OutputWidth(STDOUT_FILENO)) {
  column_width(std::min<size_t>(30, static_cast<size_t>(width_ / 3)));
}

std::string WrappingHelpFormatter::NameAndDescription(const std::string& name,
                                                      const std::string& description) const {
  const int column = static_cast<int>(get_column_width());
  std::string out = "  " + name;
  if (description.empty()) return out + "\n";
  const std::vector<std::string> lines = WrapText(description, width_ - column, 0);
  if (static_cast<int>(out.size()) >= column) {
    out += "\n" + std::string(column, ' ');
  } else {
    out += std::string(column - out.size(), ' ');
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + std::string(column, ' ');
    out += lines[i];
  }
  return out + "\n";
}

std::string WrappingHelpFormatter::make_option(const CLI::Option* option,
                                               bool is_positional) const {
  return NameAndDescription(make_option_name(option, is_positional) + make_option_opts(option),
                            make_option_desc(option));
}

std::string WrappingHelpFormatter::make_subcommand(const CLI::App* command) const {
  return NameAndDescription(command->get_display_name(true), command->get_description());
}

std::string WrappingHelpFormatter::make_description(const CLI::App* app) const {
  const std::string text = CLI::Formatter::make_description(app);
  std::string out;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const std::string_view line(text.data() + begin,
                                (end == std::string::npos ? text.size() : end) - begin);
    out += WrapToString(line, width_, 0) + "\n";
    begin = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

std::string WrappingHelpFormatter::make_footer(const CLI::App* app) const {
  const std::string footer = app->get_footer();
  return footer.empty() ? std::string() : WrapToString(footer, width_, 2) + "\n";
}

}  // namespace ferry::cli
