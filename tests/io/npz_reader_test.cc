// The .npz reader: stored members zero-copy at their local-header data offset, deflated members
// inflated and CRC-checked, zip64 records and extra fields, and every zip rule with an archive
// that breaks it.
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/io/tensor_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io_test_util.h"

namespace ferry {
namespace {

using ::ferry::io_test::Crc32Of;
using ::ferry::io_test::Le16;
using ::ferry::io_test::Le32;
using ::ferry::io_test::Le64;
using ::ferry::io_test::NpyBytes;
using ::ferry::io_test::ParseBytes;
using ::ferry::io_test::RawBytes;
using ::ferry::io_test::RawDeflate;
using ::ferry::io_test::ZipBytes;
using ::ferry::io_test::ZipMemberSpec;
using ::ferry::io_test::ZipOptions;
using ::testing::HasSubstr;

void ExpectRejected(const std::string& bytes, const std::vector<std::string>& parts,
                    bool verify_crc = false) {
  auto parsed = ParseBytes(bytes, "arrays.npz", TensorFileFormat::kNpz, verify_crc);
  ASSERT_FALSE(parsed.ok()) << "accepted a malformed archive";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("file 'arrays.npz'"));
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

std::string ArangeNpy(int count) {
  std::vector<int32_t> values(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) values[static_cast<size_t>(i)] = i * 3 - 7;
  return NpyBytes(
      "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(count) + ",), }",
      RawBytes(values));
}

std::vector<int32_t> Values(const TensorFileEntry& entry) {
  const HostView& view = entry.source->view();
  std::vector<int32_t> out(static_cast<size_t>(view.num_elements()));
  EXPECT_TRUE(CopyConvert(view, MutableHostView::Dense(out.data(), view.dtype, view.dims)).ok());
  return out;
}

std::vector<int32_t> ArangeValues(int count) {
  std::vector<int32_t> values;
  for (int i = 0; i < count; ++i) values.push_back(i * 3 - 7);
  return values;
}

TEST(NpzReaderTest, StoredMembersAreZeroCopyAtTheirLocalHeaderDataOffset) {
  const std::string a = ArangeNpy(5);
  const std::string b = ArangeNpy(2);
  const std::string bytes =
      ZipBytes({{.name = "a.npy", .data = a}, {.name = "w/b.npy", .data = b}});
  auto parsed = ParseBytes(bytes, "arrays.npz");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format(), TensorFileFormat::kNpz);
  ASSERT_EQ(parsed->tensors().size(), 2u);
  EXPECT_EQ(parsed->tensors()[0].name, "a");
  EXPECT_EQ(parsed->tensors()[1].name, "w/b");
  const TensorFileEntry& entry = parsed->tensors()[0];
  EXPECT_TRUE(entry.zero_copy);
  // 30-byte local header + "a.npy" + 20-byte zip64 extra, then the 128-byte .npy header.
  EXPECT_EQ(entry.file_offset, 30 + 5 + 20 + 128);
  EXPECT_EQ(entry.source->view().data, parsed->file()->data() + entry.file_offset);
  EXPECT_EQ(Values(entry), ArangeValues(5));
  EXPECT_EQ(Values(parsed->tensors()[1]), ArangeValues(2));
}

TEST(NpzReaderTest, DeflatedMembersAreInflatedIntoOwnedMemory) {
  const std::string a = ArangeNpy(1000);
  const std::string bytes = ZipBytes({{.name = "a.npy",
                                       .data = RawDeflate(a),
                                       .method = 8,
                                       .crc32 = Crc32Of(a),
                                       .compute_crc = false,
                                       .uncompressed_size = static_cast<int64_t>(a.size())}});
  auto parsed = ParseBytes(bytes, "arrays.npz");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const TensorFileEntry& entry = parsed->tensors()[0];
  EXPECT_FALSE(entry.zero_copy);
  EXPECT_EQ(entry.file_offset, -1);
  // The inflated buffer is 64-byte aligned and the data starts at a multiple of 64 in it.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(entry.source->view().data) % 64, 0u);
  EXPECT_EQ(Values(entry), ArangeValues(1000));
}

TEST(NpzReaderTest, Zip64EndRecordsAndCentralExtraFieldsAreRead) {
  const std::string a = ArangeNpy(3);
  ZipOptions options;
  options.zip64_end_records = true;
  auto parsed = ParseBytes(
      ZipBytes({{.name = "a.npy", .data = a, .zip64_central_extra = true}}, options), "arrays.npz");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Values(parsed->tensors()[0]), ArangeValues(3));
}

TEST(NpzReaderTest, LocalHeadersWithoutZip64ExtraAndAnArchiveCommentAreRead) {
  ZipOptions options;
  options.comment = "written by hand";
  auto parsed = ParseBytes(
      ZipBytes({{.name = "a.npy", .data = ArangeNpy(4), .zip64_local_extra = false}}, options),
      "arrays.npz");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors()[0].file_offset, 30 + 5 + 128);
}

TEST(NpzReaderTest, EmptyArchiveHasNoTensors) {
  auto parsed = ParseBytes(ZipBytes({}), "arrays.npz");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format(), TensorFileFormat::kNpz);
  EXPECT_TRUE(parsed->tensors().empty());
}

TEST(NpzReaderTest, StoredCrcIsCheckedOnlyWhenAsked) {
  const std::string bytes = ZipBytes(
      {{.name = "a.npy", .data = ArangeNpy(3), .crc32 = 0x12345678, .compute_crc = false}});
  EXPECT_TRUE(ParseBytes(bytes, "arrays.npz").ok());
  ExpectRejected(bytes, {"member 'a.npy'", "CRC-32 mismatch", "the archive says 12345678"},
                 /*verify_crc=*/true);
}

TEST(NpzReaderTest, DeflatedCrcMismatchIsRejected) {
  const std::string a = ArangeNpy(3);
  ExpectRejected(ZipBytes({{.name = "a.npy",
                            .data = RawDeflate(a),
                            .method = 8,
                            .crc32 = Crc32Of(a) ^ 1,
                            .compute_crc = false,
                            .uncompressed_size = static_cast<int64_t>(a.size())}}),
                 {"member 'a.npy'", "CRC-32 mismatch"});
}

TEST(NpzReaderTest, CorruptOrTruncatedDeflateStreamIsRejected) {
  const std::string a = ArangeNpy(100);
  std::string deflated = RawDeflate(a);
  const auto member = [&](std::string data, int64_t size) {
    return ZipMemberSpec{.name = "a.npy",
                         .data = std::move(data),
                         .method = 8,
                         .crc32 = Crc32Of(a),
                         .compute_crc = false,
                         .uncompressed_size = size};
  };
  ExpectRejected(
      ZipBytes({member(deflated.substr(0, deflated.size() / 2), static_cast<int64_t>(a.size()))}),
      {"member 'a.npy'", "ends early"});
  ExpectRejected(ZipBytes({member(std::string(40, '\xFF'), static_cast<int64_t>(a.size()))}),
                 {"corrupt deflate stream"});
  ExpectRejected(ZipBytes({member(deflated, static_cast<int64_t>(a.size()) - 1)}),
                 {"inflates to more than"});
  ExpectRejected(ZipBytes({member(deflated, static_cast<int64_t>(a.size()) + 1)}),
                 {"inflates to 528 bytes, but its directory entry says 529"});
  ExpectRejected(ZipBytes({member(deflated + "junk", static_cast<int64_t>(a.size()))}),
                 {"4 bytes follow the end of the deflate stream"});
}

TEST(NpzReaderTest, SizeBeyondWhatDeflateCanProduceIsRejectedBeforeAllocating) {
  ExpectRejected(ZipBytes({{.name = "a.npy",
                            .data = "\x03\x00",
                            .method = 8,
                            .uncompressed_size = int64_t{1} << 40,
                            .zip64_central_extra = true}}),
                 {"claim to inflate to 1099511627776 bytes"});
}

TEST(NpzReaderTest, NonNpyMembersAreRejected) {
  ExpectRejected(ZipBytes({{.name = "README.txt", .data = "hello"}}),
                 {"member 'README.txt'", "only NAME.npy members"});
  ExpectRejected(ZipBytes({{.name = ".npy", .data = ArangeNpy(1)}}), {"only NAME.npy members"});
}

TEST(NpzReaderTest, MalformedMemberNpyIsRejectedNamingTheMember) {
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = "not an npy file"}}),
                 {"member 'a.npy'", ".npy magic"});
}

TEST(NpzReaderTest, DuplicateMemberNamesAreRejected) {
  ExpectRejected(
      ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}, {.name = "a.npy", .data = ArangeNpy(2)}}),
      {"member 'a.npy'", "two members with this name"});
}

TEST(NpzReaderTest, NotAZipArchiveIsRejected) {
  ExpectRejected("PK\x03\x04 garbage", {"too small for a zip archive"});
  ExpectRejected(std::string("PK\x03\x04") + std::string(100, 'x'),
                 {"no zip end-of-central-directory record"});
}

TEST(NpzReaderTest, DataBeforeTheArchiveIsRejected) {
  ZipOptions options;
  options.prefix = "#!/bin/sh\n";
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}}, options),
                 {"does not end where the end record starts"});
}

TEST(NpzReaderTest, MultiDiskArchivesAreRejected) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  bytes[bytes.size() - 22 + 4] = 1;  // "number of this disk"
  ExpectRejected(bytes, {"multi-disk"});
}

TEST(NpzReaderTest, EncryptedMembersAreRejected) {
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = ArangeNpy(1), .flags = 1}}),
                 {"member 'a.npy'", "encrypted"});
}

TEST(NpzReaderTest, UnsupportedCompressionMethodIsRejected) {
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = ArangeNpy(1), .method = 12}}),
                 {"compression method 12 is not supported"});
}

TEST(NpzReaderTest, LocalHeaderNamingAnotherFileIsRejected) {
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = ArangeNpy(1), .local_name = "b.npy"}}),
                 {"member 'a.npy'", "the local header names another file"});
}

TEST(NpzReaderTest, StoredMemberWithDifferentSizesIsRejected) {
  ExpectRejected(ZipBytes({{.name = "a.npy", .data = ArangeNpy(1), .uncompressed_size = 3}}),
                 {"compressed size 132 differs from its size 3"});
}

TEST(NpzReaderTest, Zip64MarkerWithoutExtraFieldIsRejected) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  // Saturate the central directory's compressed size (offset 20 of the entry).
  const size_t directory = bytes.find("PK\x01\x02");
  bytes.replace(directory + 20, 4, Le32(0xFFFFFFFF));
  ExpectRejected(bytes, {"no zip64 extra field"});
}

TEST(NpzReaderTest, MemberDataReachingIntoTheDirectoryIsRejected) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  const size_t directory = bytes.find("PK\x01\x02");
  bytes.replace(directory + 20, 8, Le32(1000) + Le32(1000));
  ExpectRejected(bytes, {"reach into the central directory"});
}

TEST(NpzReaderTest, LocalHeaderOffsetPointingNowhereIsRejected) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  const size_t directory = bytes.find("PK\x01\x02");
  bytes.replace(directory + 42, 4, Le32(7));
  ExpectRejected(bytes, {"no local file header at offset 7"});
}

TEST(NpzReaderTest, OverlappingMembersAreRejected) {
  // The first member claims 10 more bytes than it has: its data then covers the second member's
  // local header (a decompression-bomb trick when members share data).
  const std::string npy = ArangeNpy(1);
  std::string bytes = ZipBytes({{.name = "a.npy", .data = npy}, {.name = "b.npy", .data = npy}});
  const size_t first_entry = bytes.find("PK\x01\x02");
  const uint32_t size = static_cast<uint32_t>(npy.size() + 10);
  bytes.replace(first_entry + 20, 8, Le32(size) + Le32(size));
  ExpectRejected(bytes, {"members 'a.npy' and 'b.npy' overlap"});
}

TEST(NpzReaderTest, CentralDirectoryEntryCountBeyondItsSizeIsRejected) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  bytes.replace(bytes.size() - 22 + 8, 4, Le16(500) + Le16(500));
  ExpectRejected(bytes, {"500 entries cannot fit"});
}

TEST(NpzReaderTest, TruncatedArchiveIsRejected) {
  const std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(3)}});
  for (size_t cut : {bytes.size() - 1, bytes.size() - 30, bytes.size() / 2, size_t{30}}) {
    auto parsed = ParseBytes(bytes.substr(0, cut), "arrays.npz", TensorFileFormat::kNpz);
    EXPECT_FALSE(parsed.ok()) << "accepted a truncated archive of " << cut << " bytes";
  }
}

TEST(NpzReaderTest, ZipEndRecordWithWrongCommentLengthIsNotFound) {
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}});
  bytes += "x";  // a byte after the end record that its comment length does not account for
  ExpectRejected(bytes, {"no zip end-of-central-directory record"});
}

TEST(NpzReaderTest, Zip64LocatorPointingAtNothingIsRejected) {
  ZipOptions options;
  options.zip64_end_records = true;
  std::string bytes = ZipBytes({{.name = "a.npy", .data = ArangeNpy(1)}}, options);
  const size_t locator = bytes.find("PK\x06\x07");
  bytes.replace(locator + 8, 8, Le64(3));
  ExpectRejected(bytes, {"no zip64 end record"});
}

}  // namespace
}  // namespace ferry
