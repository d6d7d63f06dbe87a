// Every rule of the safetensors reader, each with a file that breaks it and the message it must
// produce; plus what valid files give: zero-copy views at the right offsets, metadata, order.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/io/tensor_file.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io_test_util.h"
#include "src/io/utf8.h"

namespace ferry {
namespace {

using ::ferry::io_test::Le64;
using ::ferry::io_test::ParseBytes;
using ::ferry::io_test::RawBytes;
using ::ferry::io_test::SafetensorsBytes;
using ::testing::HasSubstr;
using ::testing::Not;

// Parses `bytes` as safetensors and expects InvalidArgument with every one of `parts` in it.
void ExpectRejected(const std::string& bytes, const std::vector<std::string>& parts) {
  auto parsed = ParseBytes(bytes, "model.safetensors", TensorFileFormat::kSafetensors);
  ASSERT_FALSE(parsed.ok()) << "accepted a malformed file";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("file 'model.safetensors'"));
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

std::string OneTensor(const std::string& entry, const std::string& data) {
  return SafetensorsBytes("{\"t\":" + entry + "}", data);
}

TEST(SafetensorsReaderTest, ValidFileGivesZeroCopyViewsAtTheirOffsets) {
  const std::vector<float> weight = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  const std::vector<int16_t> ids = {7, -8, 9};
  const std::string header = R"({"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("ids":{"dtype":"I16","shape":[3],"data_offsets":[24,30]},)"
                             R"("__metadata__":{"format":"pt","note":"x"}})";
  const std::string bytes = SafetensorsBytes(header, RawBytes(weight) + RawBytes(ids));
  auto parsed = ParseBytes(bytes, "model.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format(), TensorFileFormat::kSafetensors);
  EXPECT_EQ(parsed->format_name(), "safetensors");
  EXPECT_EQ(parsed->file_size(), static_cast<int64_t>(bytes.size()));
  ASSERT_EQ(parsed->tensors().size(), 2u);
  // In data-offset order, not the header's (alphabetical) order.
  EXPECT_EQ(parsed->tensors()[0].name, "weight");
  EXPECT_EQ(parsed->tensors()[1].name, "ids");
  const TensorFileEntry* w = parsed->Find("weight");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->zero_copy);
  EXPECT_FALSE(w->byte_swapped);
  EXPECT_EQ(w->file_offset, 8 + static_cast<int64_t>(header.size()));
  const HostView& view = w->source->view();
  EXPECT_EQ(view.dtype, DType::kF32);
  EXPECT_EQ(view.dims, Dims({2, 3}));
  EXPECT_EQ(view.byte_strides, Dims({12, 4}));
  // Zero copy: the view points into the file's own bytes.
  EXPECT_EQ(view.data, parsed->file()->data() + w->file_offset);
  const auto* values = static_cast<const float*>(view.data);
  EXPECT_EQ(std::vector<float>(values, values + 6), weight);
  const HostView& ids_view = parsed->Find("ids")->source->view();
  EXPECT_EQ(ids_view.dtype, DType::kS16);
  EXPECT_EQ(parsed->Find("missing"), nullptr);
  EXPECT_EQ(parsed->metadata().at("format"), "pt");
  EXPECT_EQ(parsed->metadata().at("note"), "x");
  EXPECT_EQ(w->source->name(), "model.safetensors:weight");
}

TEST(SafetensorsReaderTest, EmptyHeaderWithNoTensorsIsValid) {
  auto parsed = ParseBytes(SafetensorsBytes("{}      ", ""), "m.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tensors().empty());
}

TEST(SafetensorsReaderTest, ScalarAndEmptyTensorsAreValid) {
  const std::string header = R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                             R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[8,8]},)"
                             R"("e2":{"dtype":"U8","shape":[3,0],"data_offsets":[8,8]}})";
  auto parsed = ParseBytes(SafetensorsBytes(header, RawBytes(std::vector<double>{2.5})));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Find("s")->source->view().rank(), 0);
  // The header is not padded, so the data is unaligned: read it with memcpy.
  double scalar;
  std::memcpy(&scalar, parsed->Find("s")->source->view().data, sizeof(scalar));
  EXPECT_EQ(scalar, 2.5);
  EXPECT_EQ(parsed->Find("e")->source->view().num_elements(), 0);
  EXPECT_EQ(parsed->Find("e2")->source->view().num_elements(), 0);
}

TEST(SafetensorsReaderTest, JsonWhitespaceAroundTheObjectIsAccepted) {
  auto parsed = ParseBytes(SafetensorsBytes(
      " \n\t{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}} \r\n ", "ab"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors().size(), 1u);
}

TEST(SafetensorsReaderTest, Float8TypesAreReadAsStorageOnlyDTypes) {
  const std::string header = R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[2,4]}})";
  auto parsed = ParseBytes(SafetensorsBytes(header, "\x01\x02\x03\x04"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Find("a")->source->view().dtype, DType::kF8E4M3FN);
  EXPECT_EQ(parsed->Find("b")->source->view().dtype, DType::kF8E5M2);
}

TEST(SafetensorsReaderTest, EveryKnownDTypeNameMapsToItsDType) {
  for (DType dtype : AllDTypes()) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    if (info.safetensors_name.empty()) continue;
    const std::string header = "{\"t\":{\"dtype\":\"" + std::string(info.safetensors_name) +
                               "\",\"shape\":[3],\"data_offsets\":[0," +
                               std::to_string(3 * info.size_bytes) + "]}}";
    auto parsed = ParseBytes(SafetensorsBytes(header, std::string(3 * info.size_bytes, '\x01')));
    ASSERT_TRUE(parsed.ok()) << info.name << ": " << parsed.status();
    EXPECT_EQ(parsed->tensors()[0].source->view().dtype, dtype) << info.name;
  }
}

TEST(SafetensorsReaderTest, FileShorterThanTheHeaderSizeFieldIsRejected) {
  ExpectRejected("", {"0 bytes is too small"});
  ExpectRejected(std::string("\x02\x00\x00", 3), {"3 bytes is too small"});
}

TEST(SafetensorsReaderTest, HeaderLargerThanTheLimitIsRejected) {
  ExpectRejected(Le64(100'000'001) + "{}", {"header size 100000001 exceeds the limit"});
  ExpectRejected(Le64(UINT64_MAX) + "{}", {"exceeds the limit"});
}

TEST(SafetensorsReaderTest, HeaderReachingPastTheEndOfTheFileIsRejected) {
  ExpectRejected(Le64(64) + "{}", {"header size 64 reaches past the end of the 10-byte file"});
}

TEST(SafetensorsReaderTest, HeaderThatIsNotUtf8IsRejected) {
  ExpectRejected(SafetensorsBytes("{\"\xC3\x28\":1}", ""), {"not valid UTF-8", "header byte 2"});
  // An overlong encoding of '/' and a surrogate are invalid too.
  ExpectRejected(SafetensorsBytes("{\"\xC0\xAF\":{}}", ""), {"not valid UTF-8"});
  ExpectRejected(SafetensorsBytes("{\"\xED\xA0\x80\":{}}", ""), {"not valid UTF-8"});
}

TEST(SafetensorsReaderTest, HeaderThatIsNotJsonIsRejected) {
  ExpectRejected(SafetensorsBytes("{\"t\":", ""), {"not valid JSON"});
  ExpectRejected(SafetensorsBytes("{} {}", ""), {"not valid JSON"});
  ExpectRejected(SafetensorsBytes("{'t':1}", ""), {"not valid JSON"});
  // nlohmann's lexer alone would stop at a NUL and accept the rest.
  ExpectRejected(SafetensorsBytes(std::string("{}\0\0", 4), ""),
                 {"not valid JSON", "NUL byte at header byte 2"});
  ExpectRejected(SafetensorsBytes(std::string("{}\0{\"x\":1}", 10), ""), {"NUL byte"});
}

TEST(SafetensorsReaderTest, HeaderThatIsNotAnObjectIsRejected) {
  ExpectRejected(SafetensorsBytes("[1,2]", ""), {"the JSON header is array, not an object"});
}

TEST(SafetensorsReaderTest, DeeplyNestedJsonIsRejected) {
  const std::string deep = "{\"__x\":" + std::string(200, '[') + std::string(200, ']') + "}";
  ExpectRejected(SafetensorsBytes(deep, ""), {"nests deeper than 127 levels"});
}

// An entry with an ignored key "x" holding arrays nested so that the header is `levels` deep (the
// outer object and the entry count as two).
std::string NestedHeader(int levels) {
  return R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" +
         std::string(levels - 2, '[') + std::string(levels - 2, ']') + "}}";
}

TEST(SafetensorsReaderTest, JsonNestedAsDeepAsTheReferenceAllowsIsReadAndOneLevelMoreIsNot) {
  // serde_json, which the reference uses, reads 127 levels and refuses 128.
  auto parsed = ParseBytes(SafetensorsBytes(NestedHeader(127), "a"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors().size(), 1u);
  ExpectRejected(SafetensorsBytes(NestedHeader(128), "a"), {"nests deeper than 127 levels"});
}

TEST(SafetensorsReaderTest, ByteOrderMarkBeforeTheJsonIsRejected) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  ExpectRejected(SafetensorsBytes("\xEF\xBB\xBF" + header, "a"),
                 {"not valid JSON", "byte-order mark"});
  ExpectRejected(SafetensorsBytes("  \xEF\xBB\xBF" + header, "a"), {"not valid JSON"});
  // Inside a string it is just a character.
  auto parsed = ParseBytes(SafetensorsBytes("{\"__metadata__\":{\"k\":\"\xEF\xBB\xBFv\"}}", ""));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata().at("k"), "\xEF\xBB\xBFv");
}

// Rejects `bytes` and returns the message, which must be valid UTF-8 holding no control character.
std::string RejectedMessageIsPrintable(const std::string& bytes, std::string display_name) {
  auto parsed = ParseBytes(bytes, std::move(display_name), TensorFileFormat::kSafetensors);
  EXPECT_FALSE(parsed.ok()) << "accepted a malformed file";
  if (parsed.ok()) return "";
  const std::string message(parsed.status().message());
  EXPECT_EQ(io_internal::FindInvalidUtf8(message), -1) << message;
  for (char c : message) {
    EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7F) << message;
  }
  return message;
}

TEST(SafetensorsReaderTest, JsonErrorsQuoteTheHeaderInWholeEscapedCharacters) {
  // nlohmann's own message quotes the token it read as raw bytes: here the first byte of 'é'.
  std::string message =
      RejectedMessageIsPrintable(SafetensorsBytes("{\"t\": \xC3\xA9}", ""), "model.safetensors");
  EXPECT_THAT(message, HasSubstr("not valid JSON"));
  EXPECT_THAT(message, HasSubstr("at header byte 6: \"\xC3\xA9}\""));
  EXPECT_THAT(message, Not(HasSubstr("last read")));
  // The error inside a four-byte character, quoted from its first byte.
  message = RejectedMessageIsPrintable(
      SafetensorsBytes("{\"ok\":1,\"t\":[1,\xF0\x9F\x98\x80]}", ""), "model.safetensors");
  EXPECT_THAT(message, HasSubstr("at header byte 15: \"\xF0\x9F\x98\x80]}\""));
  // A terminal escape sequence in the header is quoted escaped.
  message =
      RejectedMessageIsPrintable(SafetensorsBytes("{\"t\":\x1B[2J}", ""), "model.safetensors");
  EXPECT_THAT(message, HasSubstr("\"\\x1b[2J}\""));
  // At the end of the header there is nothing to quote.
  message = RejectedMessageIsPrintable(SafetensorsBytes("{\"t\":", ""), "model.safetensors");
  EXPECT_THAT(message, HasSubstr("at the end of the header"));
}

TEST(SafetensorsReaderTest, NamesInMessagesAreEscaped) {
  // A tensor name and a dtype with control characters (JSON escapes), and a file name that is not
  // UTF-8 at all.
  std::string message = RejectedMessageIsPrintable(
      SafetensorsBytes(R"({"w\u001b[31m\n":{"dtype":"X\u0007","shape":[1],"data_offsets":[0,1]}})",
                       "a"),
      "dir/bad\xFFname.safetensors");
  EXPECT_THAT(message, HasSubstr("file 'dir/bad\\xffname.safetensors'"));
  EXPECT_THAT(message, HasSubstr("tensor 'w\\x1b[31m\\n'"));
  EXPECT_THAT(message, HasSubstr("unsupported dtype \"X\\x07\""));
  // Non-ASCII names stay readable.
  message = RejectedMessageIsPrintable(
      SafetensorsBytes(R"({"\u6a21\u578b":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}})", "a"),
      "model.safetensors");
  EXPECT_THAT(message, HasSubstr("tensor '\xE6\xA8\xA1\xE5\x9E\x8B'"));
  message = RejectedMessageIsPrintable(
      SafetensorsBytes(R"({"__metadata__":{"k\u0000":"v","k\u0000":"w"}})", ""), "m.safetensors");
  EXPECT_THAT(message, HasSubstr("the key \"k\\x00\" twice"));
}

TEST(SafetensorsReaderTest, DuplicateTensorNamesAreRejected) {
  const std::string header = R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  ExpectRejected(SafetensorsBytes(header, "ab"), {"the key \"t\" twice"});
}

TEST(SafetensorsReaderTest, DuplicateKeysInsideAnEntryOrTheMetadataAreRejected) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]})", "a"),
                 {"the key \"dtype\" twice"});
  ExpectRejected(SafetensorsBytes(R"({"__metadata__":{"k":"a","k":"b"}})", ""),
                 {"the key \"k\" twice"});
}

TEST(SafetensorsReaderTest, MetadataMustMapStringsToStrings) {
  ExpectRejected(SafetensorsBytes(R"({"__metadata__":{"k":1}})", ""),
                 {"\"__metadata__\" must map strings to strings", "\"k\" is number"});
  ExpectRejected(SafetensorsBytes(R"({"__metadata__":{"k":{"x":"y"}}})", ""), {"\"k\" is object"});
  ExpectRejected(SafetensorsBytes(R"({"__metadata__":["a"]})", ""),
                 {"\"__metadata__\" must be an object of strings, not array"});
  // null is "no metadata", as serde reads an Option.
  auto parsed = ParseBytes(SafetensorsBytes(R"({"__metadata__":null})", ""));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->metadata().empty());
}

TEST(SafetensorsReaderTest, EntryMustBeAnObjectWithDTypeShapeAndOffsets) {
  ExpectRejected(OneTensor("[\"U8\",[1],[0,1]]", "a"), {"tensor 't'", "must be an object"});
  ExpectRejected(OneTensor(R"({"shape":[1],"data_offsets":[0,1]})", "a"),
                 {"tensor 't'", "no \"dtype\""});
  ExpectRejected(OneTensor(R"({"dtype":"U8","data_offsets":[0,1]})", "a"), {"no \"shape\""});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1]})", "a"), {"no \"data_offsets\""});
  // Unknown keys are ignored, as the reference does.
  auto parsed =
      ParseBytes(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":true})", "a"));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
}

TEST(SafetensorsReaderTest, UnknownDTypesAreRejectedByName) {
  // Every dtype the reference knows and ferry does not (docs/files.md lists them), then others.
  for (const char* dtype : {"F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2",
                            "C128", "f32", "float32"}) {
    ExpectRejected(
        OneTensor(std::string(R"({"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,1]})",
                  "a"),
        {"tensor 't'", std::string("unsupported dtype \"") + dtype + "\"", "F32"});
  }
  ExpectRejected(OneTensor(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})", "a"),
                 {"\"dtype\" must be a string, not number"});
}

TEST(SafetensorsReaderTest, ShapeMustHoldNonNegativeIntegers) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,0]})", ""),
                 {"shape[0] must be a non-negative integer, not a negative number"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1,2.0],"data_offsets":[0,2]})", "ab"),
                 {"shape[1] must be a non-negative integer, not a non-integer number"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", "a"),
                 {"shape[0] must be a non-negative integer, not string"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":7,"data_offsets":[0,1]})", "a"),
                 {"\"shape\" must be an array"});
  ExpectRejected(
      OneTensor(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]})", ""),
      {"shape[0] 9223372036854775808 is larger than 2^63 - 1"});
  // Beyond 64 bits nlohmann reads an integer as a double: still called an integer, too large.
  ExpectRejected(
      OneTensor(R"({"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]})", ""),
      {"shape[0] must be a non-negative integer, not an integer too large for 64 bits"});
  // "-0" is a signed zero (refused, as serde refuses it), and named so, not "a negative number".
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[-0,1]})", "a"),
                 {"data_offsets[0] must be a non-negative integer, not -0 (a negative zero)"});
}

TEST(SafetensorsReaderTest, NumberOverflowIsAnErrorWithoutTheJsonLibrarysPrefix) {
  auto parsed = ParseBytes(
      OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1e999})", "a"));
  ASSERT_FALSE(parsed.ok());
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("number overflow parsing '1e999'"));
  EXPECT_THAT(message, Not(HasSubstr("json.exception")));
}

TEST(SafetensorsReaderTest, DataOffsetsMustBeTwoNonNegativeIntegers) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", "a"),
                 {"\"data_offsets\" must be an array of two integers"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", "a"),
                 {"\"data_offsets\" must be an array of two integers"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})", "a"),
                 {"data_offsets[0] must be a non-negative integer"});
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1.5]})", "a"),
                 {"data_offsets[1] must be a non-negative integer"});
}

TEST(SafetensorsReaderTest, OffsetsThatEndBeforeTheyBeginAreRejected) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[1,0]})", "a"),
                 {"tensor 't'", "data_offsets [1, 0] end before they begin"});
}

TEST(SafetensorsReaderTest, DataMustStartAtByteZero) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[1,2]})", "ab"),
                 {"tensor 't'", "the first tensor's data must start at byte 0"});
}

TEST(SafetensorsReaderTest, GapBetweenTensorsIsRejected) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})";
  ExpectRejected(SafetensorsBytes(header, "abcd"),
                 {"tensor 'b'", "leave a gap of 1 bytes after tensor 'a', which ends at byte 2"});
}

TEST(SafetensorsReaderTest, OverlappingTensorsAreRejected) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  ExpectRejected(SafetensorsBytes(header, "abc"),
                 {"tensor 'b'", "overlap tensor 'a', which ends at byte 2"});
  // Two tensors on the same bytes overlap too.
  const std::string same = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                           R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  ExpectRejected(SafetensorsBytes(same, "ab"), {"overlap tensor 'a'"});
}

TEST(SafetensorsReaderTest, ByteSizeMustMatchShapeTimesElementSize) {
  ExpectRejected(
      OneTensor(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", std::string(20, '\0')),
      {"tensor 't'", "data_offsets [0, 20] hold 20 bytes, but shape [2, 3] of F32 needs 24"});
}

TEST(SafetensorsReaderTest, ShapeWhoseByteSizeOverflowsIsRejected) {
  // 2^32 * 2^32 elements overflow the checked multiplication before the 0 is reached.
  ExpectRejected(
      OneTensor(R"({"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})", ""),
      {"tensor 't'", "byte size of shape [4294967296, 4294967296, 0] of U8 overflows"});
  ExpectRejected(
      OneTensor(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]})", ""),
      {"overflows"});
}

TEST(SafetensorsReaderTest, EmptyShapeIsRejectedWhenItsOtherDimsWouldBeTooBigForNumpy) {
  // The reference multiplies [0, 2^62] to 0 and accepts it; numpy cannot make such an array of
  // 4-byte elements (2^64 bytes), and ferry follows numpy in every format.
  ExpectRejected(
      OneTensor(R"({"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]})", ""),
      {"tensor 't'", "byte size of shape [0, 4611686018427387904] of F32 overflows",
       "even with its zero dims left out", "array is too big"});
  ExpectRejected(
      OneTensor(R"({"dtype":"U8","shape":[3,4611686018427387904,0],"data_offsets":[0,0]})", ""),
      {"array is too big"});
  // 2^62 one-byte elements fit, as they do in numpy.
  auto parsed = ParseBytes(
      OneTensor(R"({"dtype":"U8","shape":[0,4611686018427387904],"data_offsets":[0,0]})", ""));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors()[0].source->view().dims, Dims({0, int64_t{1} << 62}));
  EXPECT_EQ(parsed->tensors()[0].source->view().byte_strides, Dims({int64_t{1} << 62, 1}));
}

TEST(SafetensorsReaderTest, TrailingBytesAfterTheLastTensorAreRejected) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})", "ab"),
                 {"1 trailing bytes after the last tensor's data"});
  ExpectRejected(SafetensorsBytes("{}", "x"), {"1 trailing bytes"});
}

TEST(SafetensorsReaderTest, DataPastTheEndOfTheFileIsRejected) {
  ExpectRejected(OneTensor(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})", "ab"),
                 {"data ends at byte 4 of the data area", "only 2 bytes of data"});
}

// A header of `count` one-byte U8 tensors, named so that the header's (alphabetical) order is the
// reverse of their data order: tensor "t<i>" holds byte count - 1 - i.
std::string ManyTensorHeader(int count, const std::string& extra_entry = "") {
  std::string header = "{";
  for (int i = 0; i < count; ++i) {
    const int offset = count - 1 - i;
    header += fmt::format(R"({}"t{:06}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})",
                          i == 0 ? "" : ",", i, offset, offset + 1);
  }
  return header + extra_entry + "}";
}

std::string CountingBytes(int count) {
  std::string data(static_cast<size_t>(count), '\0');
  for (int i = 0; i < count; ++i) data[i] = static_cast<char>(i % 251);
  return data;
}

// A hostile header is 200,000 tiny tensors (13 MB, well under the 100 MB limit). Parsing was
// quadratic in the tensor count (nlohmann's callback parser scans the whole top-level object for a
// discarded value each time an entry ends): 20,000 tensors took 34 s and this file would outlast
// the test's 300 s timeout. Linear, it parses in well under a second, every tensor in data order.
TEST(SafetensorsReaderTest, HeaderOfTwoHundredThousandTensorsIsParsedWhole) {
  constexpr int kCount = 200'000;
  auto parsed = ParseBytes(SafetensorsBytes(ManyTensorHeader(kCount), CountingBytes(kCount)),
                           "many.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors().size(), static_cast<size_t>(kCount));
  for (int offset : {0, 1, kCount / 2, kCount - 1}) {
    const TensorFileEntry& entry = parsed->tensors()[offset];
    EXPECT_EQ(entry.name, fmt::format("t{:06}", kCount - 1 - offset));
    EXPECT_EQ(entry.source->view().dims, Dims({1}));
    EXPECT_EQ(*static_cast<const uint8_t*>(entry.source->view().data), offset % 251);
  }
}

// The duplicate-name check holds at that size too: the second "t000000", at the end of the header,
// is found and named.
TEST(SafetensorsReaderTest, DuplicateNameAmongTwoHundredThousandTensorsIsRejected) {
  constexpr int kCount = 200'000;
  const std::string duplicate = fmt::format(
      R"(,"t000000":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})", kCount, kCount + 1);
  ExpectRejected(SafetensorsBytes(ManyTensorHeader(kCount, duplicate), CountingBytes(kCount + 1)),
                 {"the key \"t000000\" twice"});
}

TEST(SafetensorsReaderTest, FormatIsDetectedAsSafetensorsWithoutMagic) {
  auto parsed = ParseBytes(OneTensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})", "a"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format(), TensorFileFormat::kSafetensors);
}

}  // namespace
}  // namespace ferry
