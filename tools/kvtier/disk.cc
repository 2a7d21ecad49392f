// kvtier disk inspect DIR / kvtier disk verify DIR: what a disk tier directory holds, and
// whether every record's checksum still matches (exit 1 on any corruption, naming segment and
// offset). Both read the files directly and need no layout: the headers say what they hold.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "tiers/disk/format.h"
#include "tiers/disk/io_engine.h"
#include "tiers/disk/segment_scan.h"

namespace kvtier::cli {
namespace {

using disk::kPageBytes;

struct SegmentInfo {
  uint64_t id = 0;
  std::string path;
  std::string file;
  disk::SegmentScan scan;
  uint64_t puts = 0;
  uint64_t tombstones = 0;
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;
};

struct DirInfo {
  std::vector<SegmentInfo> segments;
  // Files named like segments (seg-*, *.kvs) that do not parse as one: the tier never reads
  // them, so what they hold is lost to it.
  std::vector<std::string> strays;
  // The newest sequence number of each key (put or tombstone): an older copy is dead.
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> newest_seq;
  uint64_t live_blocks = 0;
  uint64_t live_bytes = 0;
  uint64_t file_bytes = 0;
};

// Scans every segment (oldest first) and resolves which records are live (later wins).
bool LoadDir(const std::string& dir, DirInfo* info, std::string* error) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    *error = fmt::format("{}: {}", dir, std::strerror(errno));
    return false;
  }
  std::vector<uint64_t> ids;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (auto id = disk::ParseSegmentFileName(name)) {
      ids.push_back(*id);
    } else if (name.starts_with("seg-") || name.ends_with(".kvs")) {
      info->strays.emplace_back(name);
    }
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  std::sort(info->strays.begin(), info->strays.end());
  struct Live {
    size_t segment;
    uint64_t seq;
    uint64_t bytes;
  };
  std::unordered_map<BlockKey, Live, BlockKeyHash> live;
  for (uint64_t id : ids) {
    SegmentInfo s;
    s.id = id;
    s.file = disk::SegmentFileName(id);
    s.path = dir + "/" + s.file;
    const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      *error = fmt::format("{}: {}", s.path, std::strerror(errno));
      return false;
    }
    struct stat st {};
    ::fstat(fd, &st);
    s.scan =
        disk::ScanSegment(disk::PreadReader(fd), static_cast<uint64_t>(st.st_size), std::nullopt);
    ::close(fd);
    info->file_bytes += s.scan.file_bytes;
    const size_t index = info->segments.size();
    for (const auto& r : s.scan.records) {
      uint64_t& newest = info->newest_seq[r.header.key];
      newest = std::max(newest, r.header.sequence);
      auto it = live.find(r.header.key);
      if (r.header.type == disk::RecordType::kTombstone) {
        ++s.tombstones;
        if (it != live.end() && it->second.seq < r.header.sequence) live.erase(it);
        continue;
      }
      ++s.puts;
      if (it == live.end() || it->second.seq < r.header.sequence) {
        live[r.header.key] = Live{index, r.header.sequence, r.header.record_bytes()};
      }
    }
    info->segments.push_back(std::move(s));
  }
  for (const auto& [key, l] : live) {
    ++info->segments[l.segment].live_blocks;
    info->segments[l.segment].live_bytes += l.bytes;
    ++info->live_blocks;
    info->live_bytes += l.bytes;
  }
  return true;
}

std::string HeaderText(const disk::SegmentScan& scan) {
  if (scan.header) {
    return fmt::format("v{} layout {:016x} block {}", scan.header->format_version,
                       scan.header->layout_fingerprint, scan.header->block_bytes);
  }
  if (scan.header_error == disk::ParseError::kFutureVersion) {
    return fmt::format("format version {} (newer than {}: not read)", scan.header_version,
                       disk::kFormatVersion);
  }
  return fmt::format("header unreadable ({})", disk::ParseErrorName(scan.header_error));
}

int Inspect(const std::string& dir, bool json) {
  DirInfo info;
  std::string error;
  if (!LoadDir(dir, &info, &error)) {
    std::fprintf(stderr, "kvtier disk inspect: %s\n", error.c_str());
    return 2;
  }
  if (json) {
    nlohmann::json j;
    j["dir"] = dir;
    j["segments"] = nlohmann::json::array();
    j["live_blocks"] = info.live_blocks;
    j["live_bytes"] = info.live_bytes;
    j["file_bytes"] = info.file_bytes;
    j["strays"] = info.strays;
    j["dead_bytes"] = info.file_bytes - std::min(info.file_bytes, info.live_bytes);
    for (const auto& s : info.segments) {
      nlohmann::json js;
      js["id"] = s.id;
      js["file"] = s.file;
      js["bytes"] = s.scan.file_bytes;
      js["header"] = HeaderText(s.scan);
      js["records"] = s.puts;
      js["tombstones"] = s.tombstones;
      js["live_blocks"] = s.live_blocks;
      js["live_bytes"] = s.live_bytes;
      js["dead_bytes"] = s.scan.file_bytes - std::min(s.scan.file_bytes, s.live_bytes);
      js["issues"] = nlohmann::json::array();
      for (const auto& i : s.scan.issues) {
        js["issues"].push_back({{"kind", disk::ScanIssueKindName(i.kind)},
                                {"offset", i.offset},
                                {"length", i.length},
                                {"message", i.message}});
      }
      j["segments"].push_back(js);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %zu segments, %llu live blocks (%s), %s dead, %s in files\n", dir.c_str(),
              info.segments.size(), static_cast<unsigned long long>(info.live_blocks),
              FormatBytes(info.live_bytes).c_str(),
              FormatBytes(info.file_bytes - std::min(info.file_bytes, info.live_bytes)).c_str(),
              FormatBytes(info.file_bytes).c_str());
  std::printf("%-18s %12s %8s %6s %8s %12s %12s %6s  %s\n", "segment", "bytes", "records", "tombs",
              "live", "live_bytes", "dead_bytes", "issues", "header");
  for (const auto& s : info.segments) {
    std::printf("%-18s %12llu %8llu %6llu %8llu %12llu %12llu %6zu  %s\n", s.file.c_str(),
                static_cast<unsigned long long>(s.scan.file_bytes),
                static_cast<unsigned long long>(s.puts),
                static_cast<unsigned long long>(s.tombstones),
                static_cast<unsigned long long>(s.live_blocks),
                static_cast<unsigned long long>(s.live_bytes),
                static_cast<unsigned long long>(s.scan.file_bytes -
                                                std::min(s.scan.file_bytes, s.live_bytes)),
                s.scan.issues.size(), HeaderText(s.scan).c_str());
  }
  for (const std::string& name : info.strays) {
    std::printf("  %s: not a segment file name (seg-<id>.kvs): the tier does not read it\n",
                name.c_str());
  }
  for (const auto& s : info.segments) {
    for (const auto& i : s.scan.issues) {
      std::printf("  %s (segment %llu) offset %llu: %s: %s\n", s.file.c_str(),
                  static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(i.offset),
                  std::string(disk::ScanIssueKindName(i.kind)).c_str(), i.message.c_str());
    }
  }
  return 0;
}

int Verify(const std::string& dir) {
  DirInfo info;
  std::string error;
  if (!LoadDir(dir, &info, &error)) {
    std::fprintf(stderr, "kvtier disk verify: %s\n", error.c_str());
    return 2;
  }
  uint64_t checked = 0, corrupt = 0, torn = 0, refused = 0, dead = 0;
  for (const std::string& name : info.strays) {
    ++corrupt;
    std::printf("STRAY   %s: not a segment file name (seg-<id>.kvs): the tier does not read it\n",
                name.c_str());
  }
  if (info.segments.empty()) {
    std::fprintf(stderr,
                 "kvtier disk verify: %s: no segment files (seg-<id>.kvs): not a disk tier "
                 "directory, or one that holds nothing\n",
                 dir.c_str());
    return 1;
  }
  std::map<uint64_t, uint64_t> fingerprints;  // fingerprint -> segments
  for (const auto& s : info.segments) {
    // Only the newest segment was being written when a process died: only it can be torn.
    const bool newest = &s == &info.segments.back();
    if (!s.scan.header) {
      if (s.scan.header_error == disk::ParseError::kFutureVersion) {
        ++refused;
        std::printf("REFUSED %s (segment %llu): %s\n", s.file.c_str(),
                    static_cast<unsigned long long>(s.id), HeaderText(s.scan).c_str());
        continue;
      }
      if (s.scan.file_bytes >= kPageBytes) {
        ++corrupt;
        std::printf("CORRUPT %s (segment %llu) offset 0: segment header: %s\n", s.file.c_str(),
                    static_cast<unsigned long long>(s.id),
                    std::string(disk::ParseErrorName(s.scan.header_error)).c_str());
      }
    } else {
      ++fingerprints[s.scan.header->layout_fingerprint];
    }
    for (const auto& i : s.scan.issues) {
      if (!i.is_corruption() && newest) {
        ++torn;
        std::printf("note    %s (segment %llu) offset %llu: %s\n", s.file.c_str(),
                    static_cast<unsigned long long>(s.id),
                    static_cast<unsigned long long>(i.offset), i.message.c_str());
        continue;
      }
      ++corrupt;
      const std::string what =
          i.is_corruption()
              ? fmt::format("{}: {}", disk::ScanIssueKindName(i.kind), i.message)
              : fmt::format(
                    "corrupt: the last {} bytes of a sealed segment do not parse (only "
                    "the newest segment can be torn by a crash)",
                    i.length);
      std::printf("CORRUPT %s (segment %llu) offset %llu: %s\n", s.file.c_str(),
                  static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(i.offset),
                  what.c_str());
    }
    const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      std::fprintf(stderr, "kvtier disk verify: %s: %s\n", s.path.c_str(), std::strerror(errno));
      return 2;
    }
    std::vector<std::byte> buf;
    auto read = disk::PreadReader(fd);
    for (const auto& r : s.scan.records) {
      if (r.header.type != disk::RecordType::kPut) continue;
      buf.resize(r.header.payload_bytes);
      const int64_t n = read(r.offset + kPageBytes, buf);
      ++checked;
      std::string problem;
      if (n != static_cast<int64_t>(buf.size())) {
        problem = n < 0 ? fmt::format("read failed: {}", std::strerror(static_cast<int>(-n)))
                        : "short read";
      } else if (disk::Xxh3(buf) != r.header.payload_checksum) {
        problem = "payload checksum mismatch";
      } else if (s.scan.header &&
                 r.header.layout_fingerprint != s.scan.header->layout_fingerprint) {
        problem = "record layout differs from its segment's";
      }
      if (!problem.empty() && info.newest_seq[r.header.key] > r.header.sequence) {
        // A later copy or tombstone replaced it: the tier never serves this one.
        ++dead;
        std::printf("note    %s (segment %llu) offset %llu: key %s: %s in a superseded copy\n",
                    s.file.c_str(), static_cast<unsigned long long>(s.id),
                    static_cast<unsigned long long>(r.offset), r.header.key.ToHex().c_str(),
                    problem.c_str());
      } else if (!problem.empty()) {
        ++corrupt;
        std::printf("CORRUPT %s (segment %llu) offset %llu: key %s: %s\n", s.file.c_str(),
                    static_cast<unsigned long long>(s.id),
                    static_cast<unsigned long long>(r.offset), r.header.key.ToHex().c_str(),
                    problem.c_str());
      }
    }
    ::close(fd);
  }
  if (fingerprints.size() > 1) {
    ++corrupt;
    std::printf("CORRUPT %s: segments of %zu different layouts in one directory\n", dir.c_str(),
                fingerprints.size());
  }
  std::printf(
      "%s: %llu records in %zu segments checked: %llu corrupt, %llu torn tails, %llu bad dead "
      "copies%s\n",
      dir.c_str(), static_cast<unsigned long long>(checked), info.segments.size(),
      static_cast<unsigned long long>(corrupt), static_cast<unsigned long long>(torn),
      static_cast<unsigned long long>(dead),
      refused ? fmt::format(", {} segments of a newer format not read", refused).c_str() : "");
  return corrupt > 0 || refused > 0 ? 1 : 0;
}

RunFn SetupInspect(CLI::App* app) {
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  app->add_option("dir", *dir, "The disk tier directory")->required();
  app->add_flag("--json", *json, "JSON instead of a table");
  return [dir, json] { return Inspect(*dir, *json); };
}

RunFn SetupVerify(CLI::App* app) {
  auto dir = std::make_shared<std::string>();
  app->add_option("dir", *dir, "The disk tier directory")->required();
  return [dir] { return Verify(*dir); };
}

}  // namespace
}  // namespace kvtier::cli

KVTIER_REGISTER_COMMAND(disk_inspect, ({"disk", "inspect"}),
                        "Segments, blocks, live and dead bytes of a disk tier directory",
                        kvtier::cli::SetupInspect);
KVTIER_REGISTER_COMMAND(disk_verify, ({"disk", "verify"}),
                        "Check every record checksum of a disk tier directory (exit 1 on any "
                        "corruption, naming segment and offset)",
                        kvtier::cli::SetupVerify);
