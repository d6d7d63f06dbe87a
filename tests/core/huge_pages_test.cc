// Whether ferry's large host allocations ask for transparent huge pages (FERRY_HOST_HUGE_PAGES,
// HostHugePagePolicy in ferry/core/host_tensor.h): the decision for each kernel setting, and the
// advice as the kernel records it (/proc/self/smaps' VmFlags: "hg" for MADV_HUGEPAGE, "nh" for
// MADV_NOHUGEPAGE).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "ferry/core/host_tensor.h"
#include "ferry/core/settings.h"

namespace ferry {
namespace {

using settings::HugePagesSetting;
using ::testing::HasSubstr;

TEST(HugePagePolicyTest, AutoAsksOnlyWhereAFaultCannotWaitForCompaction) {
  struct Case {
    const char* enabled;
    const char* defrag;
    bool advise;
  };
  const Case cases[] = {
      {"madvise", "madvise", false},  // this machine's setting: a madvised fault compacts
      {"madvise", "always", false},
      {"madvise", "defer+madvise", false},
      {"always", "madvise", false},
      {"madvise", "defer", true},
      {"madvise", "never", true},
      {"always", "never", true},
      {"never", "defer", false},  // THP off: the advice would do nothing
      {"", "", false},            // no THP in the kernel (or no /sys)
      {"madvise", "", false},     // defrag unreadable: assume the worst
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.enabled) + " / " + c.defrag);
    const HugePagePolicy policy =
        ChooseHugePagePolicy(c.enabled, c.defrag, HugePagesSetting::kAuto);
    EXPECT_EQ(policy.advise, c.advise);
    EXPECT_FALSE(policy.refuse);
    EXPECT_EQ(policy.thp_enabled, c.enabled);
    EXPECT_EQ(policy.thp_defrag, c.defrag);
    EXPECT_THAT(policy.reason, HasSubstr(c.advise ? "asked for" : "not asked for"));
  }
  EXPECT_THAT(ChooseHugePagePolicy("madvise", "madvise", HugePagesSetting::kAuto).reason,
              HasSubstr("enabled=madvise, defrag=madvise"));
}

TEST(HugePagePolicyTest, TheSettingOverridesTheKernelsAdvice) {
  EXPECT_TRUE(ChooseHugePagePolicy("madvise", "madvise", HugePagesSetting::kOn).advise);
  EXPECT_FALSE(ChooseHugePagePolicy("", "", HugePagesSetting::kOn).advise);  // nothing to ask
  const HugePagePolicy off = ChooseHugePagePolicy("always", "defer", HugePagesSetting::kOff);
  EXPECT_FALSE(off.advise);
  EXPECT_TRUE(off.refuse);  // THP "always" would give huge pages unasked
  EXPECT_TRUE(ChooseHugePagePolicy("madvise", "defer", HugePagesSetting::kOff).refuse);
  EXPECT_FALSE(ChooseHugePagePolicy("never", "defer", HugePagesSetting::kOff).refuse);
  EXPECT_THAT(off.reason, HasSubstr("FERRY_HOST_HUGE_PAGES=off"));
}

TEST(HugePagePolicyTest, BadValuesAreRefusedByTheSetting) {
  EXPECT_FALSE(SetSetting("FERRY_HOST_HUGE_PAGES", "yes").ok());
  ASSERT_TRUE(SetSetting("FERRY_HOST_HUGE_PAGES", "off").ok());
  EXPECT_EQ(*settings::HostHugePages(), HugePagesSetting::kOff);
  ASSERT_TRUE(ClearSetting("FERRY_HOST_HUGE_PAGES").ok());
  EXPECT_EQ(*settings::HostHugePages(), HugePagesSetting::kAuto);
}

// The VmFlags line of the mapping that holds `address`, from /proc/self/smaps.
std::string VmFlagsOf(const void* address) {
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HugePagePolicyTest, AllocationsCarryTheAdviceThePolicyGives) {
  if (HostHugePagePolicy().thp_enabled.empty()) {
    GTEST_SKIP() << "this kernel has no transparent huge pages (no "
                    "/sys/kernel/mm/transparent_hugepage/enabled)";
  }
  // Sizes no other test allocates, so that the freed-memory cache cannot hand back a block.
  constexpr int64_t kOnBytes = (int64_t{4} << 20) + 4096 * 3;
  constexpr int64_t kOffBytes = (int64_t{4} << 20) + 4096 * 5;
  ASSERT_TRUE(SetSetting("FERRY_HOST_HUGE_PAGES", "on").ok());
  std::byte* advised = AllocateHostMemory(kOnBytes);
  ASSERT_TRUE(SetSetting("FERRY_HOST_HUGE_PAGES", "off").ok());
  std::byte* plain = AllocateHostMemory(kOffBytes);
  ASSERT_TRUE(ClearSetting("FERRY_HOST_HUGE_PAGES").ok());
  ASSERT_NE(advised, nullptr);
  ASSERT_NE(plain, nullptr);
  const std::string advised_flags = VmFlagsOf(advised);
  const std::string plain_flags = VmFlagsOf(plain);
  FreeHostMemory(advised, kOnBytes);
  FreeHostMemory(plain, kOffBytes);
  ASSERT_FALSE(advised_flags.empty()) << "no mapping holds the allocation in /proc/self/smaps";
  EXPECT_THAT(advised_flags, HasSubstr(" hg"));
  EXPECT_THAT(plain_flags, ::testing::Not(HasSubstr(" hg")));
  EXPECT_THAT(plain_flags, HasSubstr(" nh"));
}

}  // namespace
}  // namespace ferry
