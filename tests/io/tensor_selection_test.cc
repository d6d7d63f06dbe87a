// Choosing which tensors to open: the glob rules (Python's fnmatch.fnmatchcase, on UTF-8
// characters), the selector's errors for names and patterns that match nothing, and that an
// unselected tensor's bytes are never read (a corrupt deflated member that is not selected opens
// fine; the source names of tensors from a file are escaped for messages).
#include "ferry/io/tensor_selection.h"

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/io/tensor_file.h"
#include "ferry/io/tensor_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io_test_util.h"

namespace ferry {
namespace {

using ::ferry::io_test::Crc32Of;
using ::ferry::io_test::NpyBytes;
using ::ferry::io_test::RawBytes;
using ::ferry::io_test::RawDeflate;
using ::ferry::io_test::TempDir;
using ::ferry::io_test::ZipBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GlobMatchesTest, StarQuestionAndSetsFollowFnmatchcase) {
  EXPECT_TRUE(GlobMatches("layers.*.weight", "layers.0.attn.weight"));  // * crosses dots
  EXPECT_FALSE(GlobMatches("layers.*.weight", "layers.0.attn.bias"));
  EXPECT_TRUE(GlobMatches("*", ""));
  EXPECT_TRUE(GlobMatches("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(GlobMatches("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(GlobMatches("w?", "w1"));
  EXPECT_FALSE(GlobMatches("w?", "w"));
  EXPECT_TRUE(GlobMatches("h.[0-2]", "h.1"));
  EXPECT_FALSE(GlobMatches("h.[0-2]", "h.3"));
  EXPECT_TRUE(GlobMatches("h.[!0-2]", "h.3"));
  EXPECT_TRUE(GlobMatches("[]]", "]"));      // ']' first is a member
  EXPECT_TRUE(GlobMatches("[!]]", "a"));     // ... after '!' too
  EXPECT_TRUE(GlobMatches("[a-]", "-"));     // '-' last is a member
  EXPECT_FALSE(GlobMatches("[z-a]", "m"));   // an empty range matches nothing
  EXPECT_TRUE(GlobMatches("a[b", "a[b"));    // an unclosed '[' stands for itself
  EXPECT_TRUE(GlobMatches("a\\*", "a\\x"));  // no backslash escapes
  EXPECT_FALSE(GlobMatches("W", "w"));       // case matters
  EXPECT_TRUE(GlobMatches("*\n*", "line\nbreak"));
}

TEST(GlobMatchesTest, QuestionMarkAndSetsTakeWholeUtf8Characters) {
  EXPECT_TRUE(GlobMatches("caf?", "caf\xc3\xa9"));  // é is one character of two bytes
  EXPECT_FALSE(GlobMatches("caf??", "caf\xc3\xa9"));
  EXPECT_TRUE(GlobMatches("[\xc3\xa0-\xc3\xbf]", "\xc3\xa9"));  // [à-ÿ] holds é
  EXPECT_TRUE(GlobMatches("?", "\xff"));  // a byte that is not UTF-8 is a character of its own
}

TEST(TensorSelectorTest, ANameGivenTwiceIsFoundOnce) {
  TensorSelector selector({"emb", "head", "emb"}, {}, {});
  EXPECT_TRUE(selector.Selects("emb"));
  EXPECT_FALSE(selector.CheckEverythingMatched("file 'x'").ok());  // no "head"
  EXPECT_TRUE(selector.Selects("head"));
  EXPECT_TRUE(selector.CheckEverythingMatched("file 'x'").ok());
}

TEST(TensorSelectorTest, NamesAndPatternsIncludeThenExclusionsRemove) {
  TensorSelector selector({"emb"}, {"layers.*"}, {"*.bias"});
  EXPECT_TRUE(selector.Selects("emb"));
  EXPECT_TRUE(selector.Selects("layers.0.weight"));
  EXPECT_FALSE(selector.Selects("layers.0.bias"));
  EXPECT_FALSE(selector.Selects("head"));
  EXPECT_TRUE(selector.CheckEverythingMatched("file 'x'").ok());
}

TEST(TensorSelectorTest, MissingNameAndPatternThatMatchesNothingAreNotFoundNamingThem) {
  TensorSelector missing_name({"emb", "nope\x1b[31m"}, {}, {});
  missing_name.Selects("emb");
  const Status name_status = missing_name.CheckEverythingMatched("file 'm.safetensors'");
  EXPECT_EQ(name_status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(name_status.message()),
              HasSubstr("no tensor named 'nope\\x1b[31m' in file 'm.safetensors'"));

  TensorSelector missing_pattern({}, {"emb", "layers.*"}, {"never*"});
  missing_pattern.Selects("emb");
  const Status pattern_status = missing_pattern.CheckEverythingMatched("file 'm'");
  EXPECT_EQ(pattern_status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(pattern_status.message()),
              HasSubstr("the pattern 'layers.*' matches no tensor"));

  TensorSelector everything_excluded({}, {"*"}, {"*"});
  everything_excluded.Selects("emb");
  const Status excluded_status = everything_excluded.CheckEverythingMatched("file 'm'");
  EXPECT_EQ(excluded_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(excluded_status.message()), HasSubstr("leave no tensor to load"));
}

std::string Int32Npy(const std::vector<int32_t>& values) {
  return NpyBytes("{'descr': '<i4', 'fortran_order': False, 'shape': (" +
                      std::to_string(values.size()) + ",), }",
                  RawBytes(values));
}

TEST(TensorSelectorTest, UnselectedDeflatedMemberIsNeverInflated) {
  const std::string good = Int32Npy({1, 2, 3});
  const std::string bad = Int32Npy({4, 5, 6});
  // "bad" claims a CRC its data does not have: inflating it fails, so opening it at all does.
  const std::string archive = ZipBytes({{.name = "good.npy",
                                         .data = RawDeflate(good),
                                         .method = 8,
                                         .crc32 = Crc32Of(good),
                                         .compute_crc = false,
                                         .uncompressed_size = static_cast<int64_t>(good.size())},
                                        {.name = "bad.npy",
                                         .data = RawDeflate(bad),
                                         .method = 8,
                                         .crc32 = Crc32Of(bad) ^ 1,
                                         .compute_crc = false,
                                         .uncompressed_size = static_cast<int64_t>(bad.size())}});
  TempDir dir;
  const std::string path = dir.Path("mixed.npz");
  io_test::WriteFileBytes(path, archive);
  EXPECT_FALSE(TensorFile::Open(path).ok());

  TensorSelector selector({"good"}, {}, {});
  TensorFileOptions options;
  options.selector = &selector;
  auto opened = TensorFile::Open(path, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_EQ(opened->tensors().size(), 1u);
  EXPECT_EQ(opened->tensors()[0].name, "good");
  EXPECT_TRUE(selector.CheckEverythingMatched("file 'mixed.npz'").ok());
}

TEST(TensorSelectorTest, SafetensorsOpensOnlySelectedTensorsInFileOrder) {
  std::vector<float> a = {1, 2}, b = {3, 4, 5}, c = {6};
  TempDir dir;
  const std::string path = dir.Path("three.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", io_test::DenseView(a.data(), DType::kF32, {2})},
                                      {"b", io_test::DenseView(b.data(), DType::kF32, {3})},
                                      {"c", io_test::DenseView(c.data(), DType::kF32, {1})}})
                  .ok());
  TensorSelector selector({"c"}, {"a"}, {});
  TensorFileOptions options;
  options.selector = &selector;
  auto opened = TensorFile::Open(path, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::vector<std::string> names;
  for (const TensorFileEntry& entry : opened->tensors()) names.push_back(entry.name);
  EXPECT_THAT(names, ElementsAre("a", "c"));
  opened->Prefetch(2);  // reads a's and c's ranges (b's bytes lie between them, less than a page)
}

TEST(TensorSelectorTest, SourceNamesOfFileTensorsAreEscapedForMessages) {
  std::vector<float> values = {1};
  TempDir dir;
  const std::string path = dir.Path("hostile.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  path, {{"\x1b[31mred\n", io_test::DenseView(values.data(), DType::kF32, {1})}})
                  .ok());
  auto opened = TensorFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->tensors()[0].name, "\x1b[31mred\n");  // the name itself is the file's
  EXPECT_THAT(opened->tensors()[0].source->name(), HasSubstr(":\\x1b[31mred\\n"));
}

}  // namespace
}  // namespace ferry
