// DiskStore's segment record: one append-only file of the disk tier, shared by the recovery,
// writer, reader and surface files of DiskStore. Internal to src/tiers/disk/.
//
// Thread-safety: as annotated per field; DiskStore's locks guard it. Ownership: the Segment owns
// its descriptor (closed when the last shared_ptr goes, so a reader keeps an evicted file open).
#ifndef KVTIER_TIERS_DISK_DISK_SEGMENT_H_
#define KVTIER_TIERS_DISK_DISK_SEGMENT_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tiers/disk/disk_store.h"

namespace kvtier::disk {

struct DiskStore::Segment {
  uint64_t id = 0;
  std::string path;
  int fd = -1;
  std::atomic<uint64_t> bytes{0};  // end of the last record placed (the file's length)
  uint64_t live_bytes = 0;         // guarded by DiskStore::mu_
  uint64_t live_blocks = 0;        // guarded by DiskStore::mu_
  // (key, offset) of every put record placed here; guarded by DiskStore::mu_.
  std::vector<std::pair<BlockKey, uint64_t>> records;
  bool synced = true;  // guarded by DiskStore::write_mu_ (set by the writer)

  ~Segment() {
    if (fd >= 0) ::close(fd);
  }
};

// strerror's text for err.
inline std::string Errno(int err) { return std::strerror(err); }

}  // namespace kvtier::disk

#endif  // KVTIER_TIERS_DISK_DISK_SEGMENT_H_
