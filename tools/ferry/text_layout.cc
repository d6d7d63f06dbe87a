#include "tools/ferry/text_layout.h"

#include <locale.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cwchar>
#include <numeric>
#include <vector>

namespace ferry::cli {
namespace {

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The C.UTF-8 locale (glibc's own, always there), for wcwidth; null where it is missing.
locale_t Utf8Locale() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return locale;
}

// One character at the start of non-empty `text`: its bytes, and the columns a terminal gives it
// (wcwidth under C.UTF-8: 2 for wide East Asian characters, 0 for combining marks; 1 for ASCII,
// for bytes that are not UTF-8 and wherever the locale has no answer).
struct Character {
  size_t bytes = 1;
  int columns = 1;
};

Character NextCharacter(std::string_view text) {
  Character character;
  while (character.bytes < text.size() && IsUtf8Continuation(text[character.bytes])) {
    ++character.bytes;
  }
  const locale_t locale = Utf8Locale();
  if (static_cast<unsigned char>(text[0]) < 0x80 || locale == static_cast<locale_t>(0)) {
    return character;
  }
  const locale_t previous = uselocale(locale);
  std::mbstate_t state{};
  wchar_t wide = 0;
  if (std::mbrtowc(&wide, text.data(), character.bytes, &state) == character.bytes) {
    if (const int columns = ::wcwidth(wide); columns >= 0) character.columns = columns;
  }
  uselocale(previous);
  return character;
}

// The longest prefix of `text` at most `columns` wide, whole characters only.
std::string_view HeadOf(std::string_view text, int columns) {
  size_t end = 0;
  int used = 0;
  while (end < text.size()) {
    const Character next = NextCharacter(text.substr(end));
    if (used + next.columns > columns) break;
    used += next.columns;
    end += next.bytes;
  }
  return text.substr(0, end);
}

// The longest suffix of `text` at most `columns` wide, whole characters only.
std::string_view TailOf(std::string_view text, int columns) {
  std::vector<Character> characters;
  for (size_t at = 0; at < text.size(); at += characters.back().bytes) {
    characters.push_back(NextCharacter(text.substr(at)));
  }
  size_t begin = text.size();
  int used = 0;
  for (auto it = characters.rbegin(); it != characters.rend(); ++it) {
    if (used + it->columns > columns) break;
    used += it->columns;
    begin -= it->bytes;
  }
  return text.substr(begin);
}

std::string Pad(std::string_view text, int width, TextTable::Align align) {
  const int padding = std::max(0, width - DisplayWidth(text));
  return align == TextTable::Align::kLeft ? std::string(text) + std::string(padding, ' ')
                                          : std::string(padding, ' ') + std::string(text);
}

}  // namespace

int DisplayWidth(std::string_view text) {
  int columns = 0;
  for (size_t at = 0; at < text.size();) {
    const Character next = NextCharacter(text.substr(at));
    columns += next.columns;
    at += next.bytes;
  }
  return columns;
}

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
  if (DisplayWidth(text) <= width) return std::string(text);
  constexpr std::string_view kEllipsis = "...";
  if (width <= static_cast<int>(kEllipsis.size())) return std::string(HeadOf(text, width));
  const int kept = width - static_cast<int>(kEllipsis.size());
  // The tail gets the larger half: the end of a tensor name says what the tensor is.
  const int head = kept / 2;
  return std::string(HeadOf(text, head)) + std::string(kEllipsis) +
         std::string(TailOf(text, kept - head));
}

std::vector<std::string> WrapText(std::string_view text, int width, int indent) {
  width = std::max(width, indent + 1);
  std::vector<std::string> lines;
  std::string line;
  int line_width = 0;  // DisplayWidth(line), kept as the line grows
  const auto start_next_line = [&] {
    lines.push_back(line);
    line = std::string(indent, ' ');
    line_width = indent;
  };
  size_t position = 0;
  while (position < text.size()) {
    const size_t space = text.find(' ', position);
    std::string_view word = text.substr(
        position, space == std::string_view::npos ? std::string_view::npos : space - position);
    position = space == std::string_view::npos ? text.size() : space + 1;
    if (word.empty()) continue;
    int word_width = DisplayWidth(word);
    const int separator = line.empty() || line.back() == ' ' ? 0 : 1;
    if (!line.empty() && line_width + separator + word_width > width &&
        line.find_first_not_of(' ') != std::string::npos) {
      start_next_line();
    } else if (separator == 1) {
      line += ' ';
      ++line_width;
    }
    // A word wider than a whole line: as much as fits, then the rest on the next lines.
    while (line_width + word_width > width) {
      std::string_view piece = HeadOf(word, width - line_width);
      // Not even one character fits the room left (a wide one in one column): it goes whole.
      if (piece.empty()) piece = word.substr(0, NextCharacter(word).bytes);
      line += piece;
      word.remove_prefix(piece.size());
      word_width -= DisplayWidth(piece);
      start_next_line();
    }
    line += word;
    line_width += word_width;
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
    widths[c] = DisplayWidth(columns_[c].header);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
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
