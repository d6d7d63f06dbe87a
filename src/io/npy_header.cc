// A strict parser for the header dict of a .npy file. numpy itself evaluates the header with
// ast.literal_eval; this parser accepts exactly the literals that numpy writes (and the harmless
// variations of them: key order, quotes, whitespace, trailing commas, and the `L` suffix of the
// integers that Python 2 wrote), and nothing that would need an evaluator. It never recurses, so no
// header can exhaust the stack.
#include <string>
#include <string_view>

#include "fmt/format.h"
#include "src/io/npy.h"

namespace ferry::io_internal {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsIdentifierChar(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.';
}

class DictParser {
 public:
  DictParser(std::string_view text, bool python2_long_suffixes)
      : text_(text), python2_long_suffixes_(python2_long_suffixes) {}

  StatusOr<NpyHeaderDict> Parse() {
    NpyHeaderDict dict;
    bool seen_descr = false, seen_fortran_order = false, seen_shape = false;
    SkipSpace();
    FERRY_RETURN_IF_ERROR(Expect('{', "the header must be a dict starting with '{'"));
    while (true) {
      SkipSpace();
      if (Peek() == '}') break;
      const size_t key_position = position_;
      FERRY_ASSIGN_OR_RETURN(std::string key, ParseString("a dict key"));
      SkipSpace();
      FERRY_RETURN_IF_ERROR(Expect(':', "expected ':' after a dict key"));
      SkipSpace();
      bool* seen = nullptr;
      if (key == "descr") {
        seen = &seen_descr;
        if (Peek() == '[') {
          return Error(
              "structured dtypes (a list descr) are not supported; save each field as "
              "its own array");
        }
        if (Peek() != '\'' && Peek() != '"') return Error("'descr' must be a string");
        FERRY_ASSIGN_OR_RETURN(dict.descr, ParseString("'descr'"));
      } else if (key == "fortran_order") {
        seen = &seen_fortran_order;
        FERRY_ASSIGN_OR_RETURN(dict.fortran_order, ParseBool());
      } else if (key == "shape") {
        seen = &seen_shape;
        FERRY_ASSIGN_OR_RETURN(dict.shape, ParseShape());
      } else {
        position_ = key_position;
        return Error(
            fmt::format("unexpected key '{}' (a .npy header has exactly 'descr', "
                        "'fortran_order' and 'shape')",
                        Printable(key)));
      }
      if (*seen) {
        position_ = key_position;
        return Error(fmt::format("the key '{}' appears twice", key));
      }
      *seen = true;
      SkipSpace();
      if (Peek() == ',') {
        ++position_;
        continue;
      }
      if (Peek() == '}') break;
      return Error("expected ',' or '}' after a dict value");
    }
    ++position_;  // '}'
    SkipSpace();
    if (position_ != text_.size()) return Error("unexpected text after the header dict");
    if (!seen_descr || !seen_fortran_order || !seen_shape) {
      std::string missing;
      for (auto [seen, name] : {std::pair{seen_descr, "'descr'"},
                                {seen_fortran_order, "'fortran_order'"},
                                {seen_shape, "'shape'"}}) {
        if (!seen) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
      }
      return InvalidArgumentError(fmt::format("the header dict lacks {}", missing));
    }
    return dict;
  }

 private:
  char Peek() const { return position_ < text_.size() ? text_[position_] : '\0'; }
  bool AtEnd() const { return position_ >= text_.size(); }
  void SkipSpace() {
    while (!AtEnd() && IsSpace(text_[position_])) ++position_;
  }

  Status Error(std::string_view message) const {
    return InvalidArgumentError(
        fmt::format("header {} (at header byte {}: \"{}\")", message, position_,
                    Printable(text_.substr(std::min(position_, text_.size())), 24)));
  }
  Status Expect(char c, std::string_view message) {
    if (Peek() != c || AtEnd()) return Error(message);
    ++position_;
    return OkStatus();
  }

  // A quoted string without escapes (numpy's keys and descrs never need any).
  StatusOr<std::string> ParseString(std::string_view what) {
    const char quote = Peek();
    if (AtEnd() || (quote != '\'' && quote != '"'))
      return Error(fmt::format("{} must be a string", what));
    const size_t begin = position_ + 1;
    for (size_t i = begin; i < text_.size(); ++i) {
      const char c = text_[i];
      if (c == quote) {
        position_ = i + 1;
        return std::string(text_.substr(begin, i - begin));
      }
      if (c == '\\' || c == '\n' || c == '\r') {
        position_ = i;
        return Error("escape sequences and line breaks in strings are not supported");
      }
    }
    return Error("unterminated string");
  }

  StatusOr<bool> ParseBool() {
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, {"False", false}}) {
      if (text_.substr(position_, word.size()) == word &&
          (position_ + word.size() == text_.size() ||
           !IsIdentifierChar(text_[position_ + word.size()]))) {
        position_ += word.size();
        return value;
      }
    }
    return Error("'fortran_order' must be True or False");
  }

  // A non-negative decimal int that fits int64: no sign, no leading zeros, no suffix.
  StatusOr<int64_t> ParseDim() {
    if (!IsDigit(Peek())) return Error("'shape' must hold non-negative integers");
    const size_t begin = position_;
    int64_t value = 0;
    while (!AtEnd() && IsDigit(text_[position_])) {
      if (__builtin_mul_overflow(value, 10, &value) ||
          __builtin_add_overflow(value, text_[position_] - '0', &value)) {
        position_ = begin;
        return Error("a 'shape' dim does not fit a 64-bit integer");
      }
      ++position_;
    }
    if (position_ - begin > 1 && text_[begin] == '0') {
      position_ = begin;
      return Error("a 'shape' dim has a leading zero");
    }
    if (python2_long_suffixes_) SkipLongSuffix();
    if (!AtEnd() && IsIdentifierChar(text_[position_])) {
      return Error(python2_long_suffixes_
                       ? "'shape' must hold plain integers (no suffix but Python 2's L, exponent "
                         "or fraction)"
                       : "'shape' must hold plain integers (no suffix, exponent or fraction; "
                         "Python 2's L is read in version 1.0 and 2.0 headers only)");
    }
    return value;
  }

  // Python 2 wrote long integers as `3L`. numpy reads such 1.0 and 2.0 headers by dropping an `L`
  // token that follows a number token (format._filter_header): the `L` alone, uppercase, after
  // optional whitespace. Skips it when it is there.
  void SkipLongSuffix() {
    size_t next = position_;
    while (next < text_.size() && IsSpace(text_[next])) ++next;
    if (next < text_.size() && text_[next] == 'L' &&
        (next + 1 == text_.size() || !IsIdentifierChar(text_[next + 1]))) {
      position_ = next + 1;
    }
  }

  // (), (n,), (a, b), (a, b,): a tuple literal. "(n)" is a parenthesised int, not a tuple.
  StatusOr<Dims> ParseShape() {
    FERRY_RETURN_IF_ERROR(Expect('(', "'shape' must be a tuple"));
    Dims dims;
    SkipSpace();
    bool trailing_comma = false;
    while (Peek() != ')') {
      FERRY_ASSIGN_OR_RETURN(int64_t dim, ParseDim());
      dims.push_back(dim);
      SkipSpace();
      trailing_comma = false;
      if (Peek() == ',') {
        ++position_;
        trailing_comma = true;
        SkipSpace();
      } else if (Peek() != ')') {
        return Error("expected ',' or ')' in 'shape'");
      }
    }
    if (dims.size() == 1 && !trailing_comma) {
      return Error("'shape' (n) is an int, not a tuple; a 1-d shape is written (n,)");
    }
    ++position_;  // ')'
    return dims;
  }

  std::string_view text_;
  bool python2_long_suffixes_;
  size_t position_ = 0;
};

}  // namespace

StatusOr<NpyHeaderDict> ParseNpyHeaderDict(std::string_view text, bool python2_long_suffixes) {
  return DictParser(text, python2_long_suffixes).Parse();
}

std::string Printable(std::string_view text, size_t max_length) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_length; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > max_length) out += "...";
  return out;
}

}  // namespace ferry::io_internal
