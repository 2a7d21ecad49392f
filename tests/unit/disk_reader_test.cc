// DiskStore's reader side: a record whose bytes fail verification is Corruption, dropped, and
// the rest stays readable.
#include <gtest/gtest.h>

#include <vector>

#include "testing/disk_store_util.h"
#include "tiers/disk/disk_store.h"
#include "tiers/disk/format.h"

namespace kvtier::disk {
namespace {

TEST_P(DiskStoreTest, FlippedPayloadByteIsCorruptionAndTheRestStaysReadable) {
  DiskOptions o = Options(dir_.path(), GetParam());
  {
    auto s = OpenOrDie(o);
    PutMany(*s, 0, 5);
  }
  auto files = SegmentFiles(dir_.path());
  ASSERT_EQ(files.size(), 1u);
  // Record 2 starts at page 1 + 2 records; flip a payload byte in it.
  FlipByte(files[0], kPageBytes + 2 * o.record_bytes() + kPageBytes + 1000);
  auto s = OpenOrDie(o);
  const Status st = GetOne(*s, 2);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.message();
  EXPECT_TRUE(GetOne(*s, 2).IsNotFound());  // dropped
  for (uint64_t n : {0, 1, 3, 4}) EXPECT_TRUE(GetOne(*s, n).ok()) << n;
  EXPECT_EQ(s->stats().corruptions, 1u);
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskStoreTest,
                         ::testing::Values(IoBackend::kUring, IoBackend::kSync), BackendName);

}  // namespace
}  // namespace kvtier::disk
