// The rules are those of the reference reader (safetensors/src/tensor.rs, `read_metadata` and
// `Metadata::validate`), plus one of ferry's own: duplicate JSON keys are rejected, where serde
// keeps the last one silently (so two tensors could claim one name and one would vanish).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "src/io/file_error.h"
#include "src/io/little_endian.h"
#include "src/io/safetensors.h"
#include "src/io/utf8.h"

namespace ferry::io_internal {
namespace {

using Json = nlohmann::json;

struct HeaderEntry {
  std::string name;
  std::string dtype_name;
  DType dtype = DType::kF32;
  Dims dims;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string_view JsonTypeName(const Json& value) {
  if (value.is_number_float()) {
    // nlohmann reads an integer beyond 64 bits as a double: say that, not "non-integer".
    const double number = value.get<double>();
    if (std::isfinite(number) && std::trunc(number) == number && std::fabs(number) >= 0x1p63) {
      return "an integer too large for 64 bits";
    }
    return "a non-integer number";
  }
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    // "-0" is read as a signed zero; serde (the reference reader) refuses it too.
    return value.get<int64_t>() == 0 ? "-0 (a negative zero)" : "a negative number";
  }
  return value.type_name();
}

// nlohmann's message without its "[json.exception.<kind>.<id>] " prefix.
std::string_view WithoutJsonExceptionPrefix(std::string_view description) {
  if (description.starts_with("[json.exception.")) {
    if (const size_t prefix_end = description.find("] "); prefix_end != std::string_view::npos) {
      description.remove_prefix(prefix_end + 2);
    }
  }
  return description;
}

// The message for a JSON syntax error. nlohmann's own quotes the bytes of the token it was reading
// as they are, which can end inside a multi-byte character (and Python cannot then decode the
// message at all); so its description is kept without them, and the header is quoted from the
// start of the character the parser stopped at, whole characters only, escaped.
std::string JsonSyntaxErrorMessage(std::string_view text, const Json::parse_error& error) {
  // "[json.exception.parse_error.101] parse error at line 1, column 7: syntax error while
  // parsing value - invalid literal; last read: '...'; expected ..."
  std::string_view description = WithoutJsonExceptionPrefix(error.what());
  if (const size_t at_line = description.find(" at line "); at_line != std::string_view::npos) {
    if (const size_t colon = description.find(": ", at_line); colon != std::string_view::npos) {
      description = description.substr(colon + 2);
    }
  }
  description = description.substr(0, description.find("; last read"));
  // error.byte counts the bytes read, the one that failed included.
  size_t position = std::min<size_t>(error.byte > 0 ? error.byte - 1 : 0, text.size());
  for (int back = 0; back < 3 && position > 0 && position < text.size() &&
                     (static_cast<unsigned char>(text[position]) & 0xC0) == 0x80;
       ++back) {
    --position;
  }
  if (position >= text.size()) {
    return fmt::format("the header is not valid JSON: {}, at the end of the header",
                       EscapeForMessage(description, 256));
  }
  return fmt::format("the header is not valid JSON: {}, at header byte {}: \"{}\"",
                     EscapeForMessage(description, 256), position,
                     EscapeForMessage(text.substr(position), 24));
}

// Builds the header's DOM as nlohmann's own parser does, checking on the way what ferry adds to
// JSON: no key twice in one object, no nesting deeper than kSafetensorsMaxJsonDepth. nlohmann's
// callback parser could make the same checks, but after every object or array it closes it scans
// the whole enclosing container for a discarded value, which made a header of n tensors cost n^2
// (20,000 tensors: 34 s). Here every event costs O(1), or O(log n) for a key (a std::map insert).
class HeaderDomBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return Put(Json(nullptr)); }
  bool boolean(bool value) { return Put(Json(value)); }
  bool number_integer(number_integer_t value) { return Put(Json(value)); }
  bool number_unsigned(number_unsigned_t value) { return Put(Json(value)); }
  bool number_float(number_float_t value, const string_t& /*text*/) { return Put(Json(value)); }
  bool string(string_t& value) { return Put(Json(std::move(value))); }
  bool binary(binary_t& value) { return Put(Json::binary(std::move(value))); }

  bool start_object(std::size_t /*size*/) { return Open(Json::value_t::object); }
  bool start_array(std::size_t /*size*/) { return Open(Json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(string_t& name) {
    auto& object = open_.back()->get_ref<Json::object_t&>();
    // A repeated key keeps its first place (and takes the later value, as nlohmann does); the
    // first repeated key is reported once the whole text is known to be JSON.
    auto [slot, inserted] = object.try_emplace(std::move(name));
    if (!inserted && !duplicate_key_.has_value()) duplicate_key_ = slot->first;
    key_slot_ = &slot->second;
    return true;
  }
  // Rethrown as the type it was made as (parse_error, out_of_range): ParseHeaderJson words each.
  template <typename Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Exception& error) {
    throw error;
  }

  Json& root() { return root_; }
  bool too_deep() const { return too_deep_; }
  const std::optional<std::string>& duplicate_key() const { return duplicate_key_; }

 private:
  // Places `value` where the parser is: the root, the next element of the open array, or the
  // value of the key just read. Returns where it went.
  Json* Place(Json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& container = *open_.back();
    if (container.is_array()) {
      // Only the closed elements of this array move when it grows; the open containers are its
      // ancestors, so the pointers in open_ stay valid.
      auto& array = container.get_ref<Json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    *key_slot_ = std::move(value);
    return key_slot_;
  }
  bool Put(Json value) {
    Place(std::move(value));
    return true;
  }
  bool Open(Json::value_t type) {
    // This container is level open_.size() + 1; returning false stops the parse at once.
    if (open_.size() + 1 > static_cast<size_t>(kSafetensorsMaxJsonDepth)) {
      too_deep_ = true;
      return false;
    }
    open_.push_back(Place(Json(type)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  Json root_;
  std::vector<Json*> open_;
  Json* key_slot_ = nullptr;
  std::optional<std::string> duplicate_key_;
  bool too_deep_ = false;
};

// Parses the header text, rejecting duplicate keys at any level and excessive nesting.
StatusOr<Json> ParseHeaderJson(std::string_view text, std::string_view context) {
  HeaderDomBuilder builder;
  try {
    Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                    /*strict=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& error) {
    return MalformedError(context, JsonSyntaxErrorMessage(text, error));
  } catch (const Json::exception& error) {
    return MalformedError(
        context, fmt::format("the header is not valid JSON: {}",
                             EscapeForMessage(WithoutJsonExceptionPrefix(error.what()), 256)));
  }
  if (builder.too_deep()) {
    return MalformedError(context, fmt::format("the JSON header nests deeper than {} levels",
                                               kSafetensorsMaxJsonDepth));
  }
  if (const std::optional<std::string>& key = builder.duplicate_key(); key.has_value()) {
    return MalformedError(context, fmt::format("the JSON header has the key \"{}\" twice",
                                               EscapeForMessage(*key, kQuotedNameLength)));
  }
  Json header = std::move(builder.root());
  if (!header.is_object()) {
    return MalformedError(
        context, fmt::format("the JSON header is {}, not an object", JsonTypeName(header)));
  }
  return header;
}

Status ParseMetadata(const Json& value, std::string_view context,
                     std::map<std::string, std::string>& metadata) {
  if (value.is_null()) return OkStatus();  // serde reads null as "no metadata"
  if (!value.is_object()) {
    return MalformedError(
        context,
        fmt::format("\"__metadata__\" must be an object of strings, not {}", JsonTypeName(value)));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return MalformedError(
          context, fmt::format("\"__metadata__\" must map strings to strings, but \"{}\" is {}",
                               EscapeForMessage(key, kQuotedNameLength), JsonTypeName(item)));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return OkStatus();
}

// Reads a non-negative JSON integer that fits int64 (dims and offsets; nothing larger can lie in a
// file, and HostView dims are int64).
template <typename Context>
StatusOr<uint64_t> ParseUnsigned(const Json& value, std::string_view what, const Context& context) {
  if (!value.is_number_unsigned()) {
    return MalformedError(context(), fmt::format("{} must be a non-negative integer, not {}", what,
                                                 JsonTypeName(value)));
  }
  const uint64_t number = value.get<uint64_t>();
  if (number > static_cast<uint64_t>(INT64_MAX)) {
    return MalformedError(context(), fmt::format("{} {} is larger than 2^63 - 1", what, number));
  }
  return number;
}

std::string KnownDTypeNames() {
  std::vector<std::string_view> names;
  for (DType dtype : AllDTypes()) {
    if (!GetDTypeInfo(dtype).safetensors_name.empty()) {
      names.push_back(GetDTypeInfo(dtype).safetensors_name);
    }
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

StatusOr<HeaderEntry> ParseEntry(const std::string& name, const Json& value,
                                 std::string_view file_name) {
  // Made only for an error: escaping every name of a 200,000-tensor header costs more than its
  // parse.
  auto context = [&] { return TensorContext(file_name, name); };
  if (!value.is_object()) {
    return MalformedError(context(), fmt::format("the entry must be an object with \"dtype\", "
                                                 "\"shape\" and \"data_offsets\", not {}",
                                                 JsonTypeName(value)));
  }
  HeaderEntry entry;
  entry.name = name;
  // Other keys are ignored, as the reference does.
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) {
      return MalformedError(context(), fmt::format("the entry has no \"{}\"", key));
    }
  }
  const Json& dtype = value.at("dtype");
  if (!dtype.is_string()) {
    return MalformedError(context(),
                          fmt::format("\"dtype\" must be a string, not {}", JsonTypeName(dtype)));
  }
  entry.dtype_name = dtype.get<std::string>();
  auto parsed_dtype = DTypeFromSafetensorsName(entry.dtype_name);
  if (!parsed_dtype.ok()) {
    return MalformedError(context(),
                          fmt::format("unsupported dtype \"{}\" (ferry reads {})",
                                      EscapeForMessage(entry.dtype_name), KnownDTypeNames()));
  }
  entry.dtype = *parsed_dtype;

  const Json& shape = value.at("shape");
  if (!shape.is_array()) {
    return MalformedError(context(), fmt::format("\"shape\" must be an array of non-negative "
                                                 "integers, not {}",
                                                 JsonTypeName(shape)));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(uint64_t dim,
                           ParseUnsigned(shape[i], fmt::format("shape[{}]", i), context));
    entry.dims.push_back(static_cast<int64_t>(dim));
  }

  const Json& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    return MalformedError(context(),
                          "\"data_offsets\" must be an array of two integers [begin, end]");
  }
  FERRY_ASSIGN_OR_RETURN(entry.begin, ParseUnsigned(offsets[0], "data_offsets[0]", context));
  FERRY_ASSIGN_OR_RETURN(entry.end, ParseUnsigned(offsets[1], "data_offsets[1]", context));
  return entry;
}

// The reference's Metadata::validate: entries sorted by offset tile the data area from 0, and
// each holds exactly its shape's bytes. Returns the end of the last tensor's data.
StatusOr<uint64_t> ValidateLayout(const std::vector<HeaderEntry>& entries,
                                  std::string_view file_name) {
  uint64_t expected_begin = 0;
  const HeaderEntry* previous = nullptr;
  for (const HeaderEntry& entry : entries) {
    auto context = [&] { return TensorContext(file_name, entry.name); };
    if (entry.end < entry.begin) {
      return MalformedError(context(), fmt::format("data_offsets [{}, {}] end before they begin",
                                                   entry.begin, entry.end));
    }
    if (entry.begin != expected_begin) {
      if (previous == nullptr) {
        return MalformedError(
            context(), fmt::format("data_offsets [{}, {}]: the first tensor's data must start at "
                                   "byte 0 of the data area",
                                   entry.begin, entry.end));
      }
      if (entry.begin > expected_begin) {
        return MalformedError(
            context(),
            fmt::format("data_offsets [{}, {}] leave a gap of {} bytes after "
                        "tensor '{}', which ends at byte {}",
                        entry.begin, entry.end, entry.begin - expected_begin,
                        EscapeForMessage(previous->name, kQuotedNameLength), expected_begin));
      }
      return MalformedError(
          context(),
          fmt::format("data_offsets [{}, {}] overlap tensor '{}', which ends "
                      "at byte {}",
                      entry.begin, entry.end, EscapeForMessage(previous->name, kQuotedNameLength),
                      expected_begin));
    }
    // Checked multiplication, left to right, as the reference does.
    uint64_t num_bytes = 1;
    bool overflow = false;
    for (int64_t dim : entry.dims) {
      overflow =
          overflow || __builtin_mul_overflow(num_bytes, static_cast<uint64_t>(dim), &num_bytes);
    }
    overflow =
        overflow || __builtin_mul_overflow(num_bytes, static_cast<uint64_t>(DTypeSize(entry.dtype)),
                                           &num_bytes);
    if (overflow) {
      return MalformedError(context(), fmt::format("the byte size of shape [{}] of {} overflows",
                                                   fmt::join(entry.dims, ", "), entry.dtype_name));
    }
    // Stricter than the reference where a zero dim hides huge others (see CheckedTensorBytes).
    if (auto checked = CheckedTensorBytes(entry.dims, DTypeSize(entry.dtype)); !checked.ok()) {
      return MalformedError(
          context(),
          fmt::format("the byte size of shape [{}] of {} overflows: {}",
                      fmt::join(entry.dims, ", "), entry.dtype_name, MessageOf(checked.status())));
    }
    if (entry.end - entry.begin != num_bytes) {
      return MalformedError(
          context(),
          fmt::format("data_offsets [{}, {}] hold {} bytes, but shape [{}] of {} needs {}",
                      entry.begin, entry.end, entry.end - entry.begin, fmt::join(entry.dims, ", "),
                      entry.dtype_name, num_bytes));
    }
    expected_begin = entry.end;
    previous = &entry;
  }
  return expected_begin;
}

}  // namespace

StatusOr<ParsedTensors> ParseSafetensors(const std::shared_ptr<const MappedFile>& file) {
  const std::string& file_name = file->display_name();
  const std::string context = FileContext(file_name);
  const int64_t file_size = file->size();
  if (file_size < 8) {
    return MalformedError(context, fmt::format("{} bytes is too small for a safetensors file (the "
                                               "header size alone takes 8 bytes)",
                                               file_size));
  }
  const uint64_t header_size = LoadLittleEndian<uint64_t>(file->data());
  if (header_size > static_cast<uint64_t>(kSafetensorsMaxHeaderSize)) {
    return MalformedError(context, fmt::format("the header size {} exceeds the limit of {} bytes",
                                               header_size, kSafetensorsMaxHeaderSize));
  }
  if (header_size > static_cast<uint64_t>(file_size - 8)) {
    return MalformedError(context, fmt::format("the header size {} reaches past the end of the "
                                               "{}-byte file",
                                               header_size, file_size));
  }
  // Read-around is off while a file is parsed (tensor_file.cc): the header is read ahead here.
  file->Prefetch(0, 8 + static_cast<int64_t>(header_size));
  const std::string_view header_text(reinterpret_cast<const char*>(file->data() + 8),
                                     static_cast<size_t>(header_size));
  if (const int64_t invalid = FindInvalidUtf8(header_text); invalid >= 0) {
    return MalformedError(
        context, fmt::format("the header is not valid UTF-8 (at header byte {})", invalid));
  }
  // RFC 8259 lets a parser ignore a byte-order mark, and nlohmann does; serde_json (the reference)
  // refuses it, and so does ferry, so that a file one of them accepts the other accepts too.
  if (header_text.substr(0, 3) == "\xEF\xBB\xBF") {
    return MalformedError(context,
                          "the header is not valid JSON: it starts with a UTF-8 byte-order "
                          "mark (EF BB BF)");
  }
  // JSON never holds a raw NUL (control characters in strings must be escaped), but nlohmann's
  // lexer takes one as the end of its input and would accept whatever follows it.
  if (const size_t nul = header_text.find('\0'); nul != std::string_view::npos) {
    return MalformedError(context, fmt::format("the header is not valid JSON: a NUL byte at header "
                                               "byte {}",
                                               nul));
  }
  FERRY_ASSIGN_OR_RETURN(Json header, ParseHeaderJson(header_text, context));

  ParsedTensors parsed;
  std::vector<HeaderEntry> entries;
  entries.reserve(header.size());
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      FERRY_RETURN_IF_ERROR(ParseMetadata(value, context, parsed.metadata));
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(HeaderEntry entry, ParseEntry(name, value, file_name));
    entries.push_back(std::move(entry));
  }
  // Offset order is the order of the bytes in the file; names break ties between empty tensors.
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  FERRY_ASSIGN_OR_RETURN(uint64_t data_end, ValidateLayout(entries, file_name));
  const int64_t data_begin = 8 + static_cast<int64_t>(header_size);
  const uint64_t data_size = static_cast<uint64_t>(file_size - data_begin);
  if (data_end > data_size) {
    return MalformedError(context,
                          fmt::format("the tensors' data ends at byte {} of the data area, "
                                      "but the file holds only {} bytes of data "
                                      "(truncated?)",
                                      data_end, data_size));
  }
  if (data_end < data_size) {
    return MalformedError(context, fmt::format("{} trailing bytes after the last tensor's data",
                                               data_size - data_end));
  }

  parsed.data_begin = data_begin;
  parsed.data_end = file_size;
  parsed.tensors.reserve(entries.size());
  for (const HeaderEntry& entry : entries) {
    StoredTensor tensor;
    tensor.name = entry.name;
    tensor.dtype = entry.dtype;
    tensor.dims = entry.dims;
    const int64_t file_offset = data_begin + static_cast<int64_t>(entry.begin);
    tensor.data = file->data() + file_offset;
    tensor.num_bytes = static_cast<int64_t>(entry.end - entry.begin);
    FERRY_ASSIGN_OR_RETURN(TensorFileEntry made,
                           MakeTensorEntry(tensor, file->data(), file_size, file,
                                           /*zero_copy=*/true, file_offset, file_name, file.get()));
    parsed.tensors.push_back(std::move(made));
  }
  return parsed;
}

}  // namespace ferry::io_internal
