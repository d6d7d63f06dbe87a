// The slab pool behind small device allocations: aligned, disjoint pieces; a slab freed exactly
// when the pool has moved on and its last allocation is gone; one slab per 1 MiB of requests even
// when threads race past a full one; DeviceAllocation counting small allocations to the byte.
#include "src/device/small_allocations.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/device/memory_account.h"
#include "gtest/gtest.h"
#include "src/device/device_allocation.h"

namespace ferry::internal {
namespace {

// Allocates until the pool starts a new slab, so that every test begins with a fresh one; the
// allocations are returned to keep the old slab alive as long as the caller wants.
std::vector<SmallAllocation> FillCurrentSlab() {
  std::vector<SmallAllocation> held;
  held.push_back(AllocateSmall(64));
  while (true) {
    SmallAllocation next = AllocateSmall(64);
    if (next.slab != held.front().slab) return {std::move(next)};
    held.push_back(std::move(next));
  }
}

TEST(SmallAllocations, PiecesOfOneSlabAreAlignedDisjointAndRoundedUp) {
  std::vector<SmallAllocation> first = FillCurrentSlab();
  const std::byte* base = first.front().data;
  SmallAllocation empty = AllocateSmall(0);
  SmallAllocation odd = AllocateSmall(100);
  SmallAllocation largest = AllocateSmall(kSmallAllocationMaxBytes);
  for (const SmallAllocation* piece : {&empty, &odd, &largest}) {
    ASSERT_NE(piece->data, nullptr);
    EXPECT_EQ(piece->slab, first.front().slab);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece->data) % kHostAlignment, 0u);
  }
  // Sizes rounded to 64 bytes, one after another: a zero-sized piece still has its own address.
  EXPECT_EQ(empty.data - base, 64);
  EXPECT_EQ(odd.data - base, 128);
  EXPECT_EQ(largest.data - base, 128 + 128);
  std::memset(odd.data, 0x11, 100);
  std::memset(largest.data, 0x5a, kSmallAllocationMaxBytes);  // writable to its last byte
  EXPECT_EQ(odd.data[99], std::byte{0x11}) << "the next piece starts after this one";
}

TEST(SmallAllocations, ASlabIsFreedWhenThePoolMovedOnAndItsLastAllocationIsGone) {
  std::vector<SmallAllocation> first = FillCurrentSlab();
  std::weak_ptr<HostSlab> slab = first.front().slab;
  std::vector<SmallAllocation> rest;
  for (int64_t used = 64; used + 4096 <= kSlabBytes; used += 4096) {
    rest.push_back(AllocateSmall(4096));
  }
  first.clear();
  EXPECT_FALSE(slab.expired()) << "the pool still allocates from it";
  SmallAllocation next = AllocateSmall(4096);  // does not fit: a new slab
  EXPECT_NE(next.slab, slab.lock());
  EXPECT_FALSE(slab.expired()) << "its allocations still live";
  rest.pop_back();
  EXPECT_FALSE(slab.expired()) << "one allocation left is enough to keep it";
  rest.clear();
  EXPECT_TRUE(slab.expired());
}

TEST(SmallAllocations, ThreadsRacingPastAFullSlabMakeOneSlabPerMegabyte) {
  std::vector<SmallAllocation> first = FillCurrentSlab();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1024;  // 4 MiB of 1 KiB pieces in all
  std::vector<std::vector<SmallAllocation>> pieces(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        SmallAllocation piece = AllocateSmall(1024);
        if (piece.data != nullptr) std::memset(piece.data, t + 1, 1024);
        pieces[t].push_back(std::move(piece));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<const HostSlab*> slabs;
  std::vector<const std::byte*> starts;
  for (int t = 0; t < kThreads; ++t) {
    for (const SmallAllocation& piece : pieces[t]) {
      ASSERT_NE(piece.data, nullptr);
      slabs.insert(piece.slab.get());
      starts.push_back(piece.data);
      // No other thread's piece overlaps this one: its bytes are still this thread's.
      ASSERT_TRUE(std::all_of(piece.data, piece.data + 1024,
                              [t](std::byte b) { return b == std::byte(t + 1); }));
    }
  }
  std::sort(starts.begin(), starts.end());
  EXPECT_EQ(std::adjacent_find(starts.begin(), starts.end()), starts.end());
  // The first slab had room for 1 KiB pieces still (its rest), then exactly 4 more are full.
  EXPECT_LE(slabs.size(), 5u);
}

TEST(SmallAllocations, DeviceAllocationsCountTheirOwnBytesExactly) {
  auto account = std::make_shared<MemoryAccount>(/*limit_bytes=*/1 << 20);
  auto small = DeviceAllocation::Create(account, 100, "small", "test:0");
  ASSERT_TRUE(small.ok()) << small.status();
  auto large = DeviceAllocation::Create(account, kSmallAllocationMaxBytes + 1, "large", "test:0");
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(account->in_use(), 100 + kSmallAllocationMaxBytes + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*small)->data()) % kHostAlignment, 0u);
  std::memset((*small)->mutable_data(), 1, 100);
  small->reset();
  EXPECT_EQ(account->in_use(), kSmallAllocationMaxBytes + 1);
  large->reset();
  EXPECT_EQ(account->in_use(), 0);
}

}  // namespace
}  // namespace ferry::internal
