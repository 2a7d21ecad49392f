#include "workload/trace.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <unordered_map>

#include "workload/readers.h"

namespace kvtier::workload {

std::string_view TraceFormatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kAgentX:
      return "agentx";
    case TraceFormat::kMooncake:
      return "mooncake";
    case TraceFormat::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

std::optional<TraceFormat> ParseTraceFormat(std::string_view name) {
  if (name == "agentx" || name == "weka") return TraceFormat::kAgentX;
  if (name == "mooncake") return TraceFormat::kMooncake;
  return std::nullopt;
}

uint64_t Trace::num_requests() const {
  uint64_t n = 0;
  for (const auto& s : sessions) n += s.requests.size();
  return n;
}

uint64_t Trace::prompt_tokens() const {
  uint64_t n = 0;
  for (const auto& s : sessions) {
    for (const auto& r : s.requests) n += r.prompt_tokens;
  }
  return n;
}

Result<TraceFormat> DetectFormat(std::string_view head, std::string_view source) {
  size_t i = head.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos) {
    return Status::InvalidArgument(std::string(source) + ": empty file");
  }
  if (head[i] != '{') {
    return Status::InvalidArgument(std::string(source) +
                                   ": not a trace (expected a JSON object at line 1)");
  }
  // A Mooncake record is one line with input_length and hash_ids; an AgentX session is one
  // object with a requests array (usually on one line too, so look at the keys).
  std::string_view first =
      head.substr(i, head.find('\n', i) == std::string_view::npos ? std::string_view::npos
                                                                  : head.find('\n', i) - i);
  const bool has_requests = head.find("\"requests\"") != std::string_view::npos;
  const bool has_block_size = head.find("\"block_size\"") != std::string_view::npos;
  const bool mooncake_line = first.find("\"input_length\"") != std::string_view::npos &&
                             first.find("\"requests\"") == std::string_view::npos;
  if (mooncake_line) return TraceFormat::kMooncake;
  if (has_requests || has_block_size) return TraceFormat::kAgentX;
  return Status::InvalidArgument(
      std::string(source) +
      ": unknown trace format (neither an AgentX session with 'requests' nor Mooncake JSONL "
      "with 'input_length'); use --format");
}

namespace {

// The first `bytes` of a file (fewer when it is shorter): enough to tell its format.
Result<std::string> ReadHead(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open");
  std::string head(bytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(bytes));
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open");
  std::string data;
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size < 0) return Status::InvalidArgument(path + ": cannot read");
  data.resize(static_cast<size_t>(size));
  in.seekg(0);
  in.read(data.data(), size);
  if (!in) return Status::InvalidArgument(path + ": short read");
  return data;
}

Status ExpandPath(const std::string& path, std::vector<std::string>* files) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Status::InvalidArgument(path + ": no such file");
  if (!S_ISDIR(st.st_mode)) {
    files->push_back(path);
    return Status::Ok();
  }
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return Status::InvalidArgument(path + ": cannot list folder");
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    auto ends = [&](std::string_view suffix) {
      return name.size() > suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends(".json") || ends(".jsonl")) names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  if (names.empty()) return Status::InvalidArgument(path + ": folder holds no .json/.jsonl files");
  for (auto& n : names) files->push_back(path + (path.ends_with('/') ? "" : "/") + n);
  return Status::Ok();
}

}  // namespace

Result<std::vector<Trace>> LoadTraces(std::span<const std::string> paths,
                                      std::optional<TraceFormat> format) {
  std::vector<std::string> files;
  for (const auto& p : paths) KVTIER_RETURN_IF_ERROR(ExpandPath(p, &files));
  std::vector<Trace> traces;
  traces.reserve(files.size());
  for (const auto& f : files) {
    // The format comes from the head, before the file is read whole: a file that is no trace
    // (a 5 GB image, a sparse file) is refused after 64 KiB, not after reading it all.
    TraceFormat fmt;
    if (format) {
      fmt = *format;
    } else {
      KVTIER_ASSIGN_OR_RETURN(std::string head, ReadHead(f, 1 << 16));
      KVTIER_ASSIGN_OR_RETURN(fmt, DetectFormat(head, f));
    }
    if (fmt == TraceFormat::kMooncake) {  // streamed: one line in memory at a time
      KVTIER_ASSIGN_OR_RETURN(Trace t, ReadMooncakeFile(f));
      traces.push_back(std::move(t));
      continue;
    }
    KVTIER_ASSIGN_OR_RETURN(std::string data, ReadFile(f));
    KVTIER_ASSIGN_OR_RETURN(Trace t, ParseAgentX(data, f));
    traces.push_back(std::move(t));
  }
  return traces;
}

namespace {

struct Ref {
  double start_s;
  uint32_t trace;
  uint32_t session;
  uint32_t request;
  uint32_t order;
  bool first = false;
  bool last = false;
};

class TraceStream final : public RequestStream {
 public:
  explicit TraceStream(std::span<const Trace> traces) : traces_(traces) {
    uint64_t base = 0;
    for (uint32_t t = 0; t < traces.size(); ++t) {
      session_base_.push_back(base);
      base += traces[t].sessions.size();
      for (uint32_t s = 0; s < traces[t].sessions.size(); ++s) {
        const auto& reqs = traces[t].sessions[s].requests;
        for (uint32_t r = 0; r < reqs.size(); ++r) {
          refs_.push_back(Ref{reqs[r].start_s, t, s, r, reqs[r].order});
        }
      }
    }
    std::stable_sort(refs_.begin(), refs_.end(), [](const Ref& a, const Ref& b) {
      if (a.start_s != b.start_s) return a.start_s < b.start_s;
      if (a.trace != b.trace) return a.trace < b.trace;
      return a.order < b.order;
    });
    std::unordered_map<uint64_t, size_t> last;
    for (size_t i = 0; i < refs_.size(); ++i) {
      const uint64_t sid = session_base_[refs_[i].trace] + refs_[i].session;
      auto [it, inserted] = last.try_emplace(sid, i);
      if (inserted) refs_[i].first = true;
      it->second = i;
    }
    for (auto& [sid, i] : last) refs_[i].last = true;
  }

  bool Next(ReplayRequest* out) override {
    if (next_ >= refs_.size()) return false;
    const Ref& ref = refs_[next_++];
    const Trace& t = traces_[ref.trace];
    const TraceSession& s = t.sessions[ref.session];
    const TraceRequest& q = s.requests[ref.request];
    out->session = session_base_[ref.trace] + ref.session + 1;
    out->parent_session = s.parent < 0 ? 0 : session_base_[ref.trace] + s.parent + 1;
    out->trace = ref.trace;
    out->start_s = q.start_s;
    out->think_s = q.think_s;
    out->api_s = q.api_s;
    out->prompt_tokens = q.prompt_tokens;
    out->output_tokens = q.output_tokens;
    out->block_tokens = t.block_tokens;
    out->root = t.root;
    out->ids = t.IdsOf(q);
    out->session_first = ref.first;
    out->session_last = ref.last;
    out->stop = q.stop;
    return true;
  }
  double progress() const override {
    return refs_.empty() ? 1.0 : static_cast<double>(next_) / static_cast<double>(refs_.size());
  }
  void Rewind() override { next_ = 0; }

 private:
  std::span<const Trace> traces_;
  std::vector<uint64_t> session_base_;
  std::vector<Ref> refs_;
  size_t next_ = 0;
};

class MaterializedStream final : public RequestStream {
 public:
  explicit MaterializedStream(const MaterializedRequests& m) : m_(m) {}
  bool Next(ReplayRequest* out) override {
    if (next_ >= m_.requests.size()) return false;
    *out = m_.requests[next_++];
    return true;
  }
  double progress() const override {
    return m_.requests.empty()
               ? 1.0
               : static_cast<double>(next_) / static_cast<double>(m_.requests.size());
  }
  void Rewind() override { next_ = 0; }

 private:
  const MaterializedRequests& m_;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<RequestStream> StreamTraces(std::span<const Trace> traces) {
  return std::make_unique<TraceStream>(traces);
}

std::unique_ptr<RequestStream> StreamMaterialized(const MaterializedRequests& m) {
  return std::make_unique<MaterializedStream>(m);
}

Result<WorkloadStats> ComputeStats(RequestStream& stream) {
  WorkloadStats st;
  std::unordered_map<uint64_t, uint32_t> live;  // session -> latest prompt tokens
  uint64_t live_sum = 0;
  double live_total = 0;
  ReplayRequest r;
  stream.Rewind();
  while (stream.Next(&r)) {
    ++st.requests;
    if (r.session_first) ++st.sessions;
    st.prompt_tokens += r.prompt_tokens;
    st.output_tokens += r.output_tokens;
    st.blocks += r.ids.size();
    auto [it, inserted] = live.try_emplace(r.session, 0);
    live_sum += r.prompt_tokens;
    live_sum -= it->second;
    it->second = r.prompt_tokens;
    st.live_context_peak_tokens = std::max(st.live_context_peak_tokens, live_sum);
    live_total += static_cast<double>(live_sum);
    if (r.session_last) {
      live_sum -= it->second;
      live.erase(it);
    }
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  stream.Rewind();
  st.live_context_mean_tokens = st.requests ? live_total / static_cast<double>(st.requests) : 0;
  return st;
}

Result<MaterializedRequests> Materialize(RequestStream& stream, uint64_t max_blocks) {
  MaterializedRequests m;
  std::vector<size_t> offsets;
  ReplayRequest r;
  stream.Rewind();
  while (stream.Next(&r)) {
    if (m.ids.size() + r.ids.size() > max_blocks) {
      stream.Rewind();
      return Status::ResourceExhausted("the workload holds more than " +
                                       std::to_string(max_blocks) +
                                       " block ids; too large to hold in memory");
    }
    offsets.push_back(m.ids.size());
    m.ids.insert(m.ids.end(), r.ids.begin(), r.ids.end());
    m.requests.push_back(r);
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  stream.Rewind();
  for (size_t i = 0; i < m.requests.size(); ++i) {
    m.requests[i].ids =
        std::span<const uint64_t>(m.ids.data() + offsets[i], m.requests[i].ids.size());
  }
  return m;
}

Result<Trace> StreamToTrace(RequestStream& stream, std::string name, uint64_t max_blocks) {
  Trace t;
  t.name = name;
  t.path = std::move(name);
  t.format = TraceFormat::kSynthetic;
  std::unordered_map<uint64_t, int32_t> index;  // stream session -> Trace::sessions index
  ReplayRequest r;
  uint32_t order = 0;
  bool first = true;
  stream.Rewind();
  while (stream.Next(&r)) {
    if (first) {
      t.block_tokens = r.block_tokens;
      t.root = r.root;
      first = false;
    }
    if (t.ids.size() + r.ids.size() > max_blocks) {
      stream.Rewind();
      return Status::ResourceExhausted("stream holds more than " + std::to_string(max_blocks) +
                                       " block ids; too large to hold in memory");
    }
    auto [it, inserted] = index.try_emplace(r.session, static_cast<int32_t>(t.sessions.size()));
    if (inserted) {
      TraceSession s;
      s.name = t.name + "/" + std::to_string(r.session);
      s.start_s = r.start_s;
      auto p = index.find(r.parent_session);
      s.parent = r.parent_session != 0 && p != index.end() ? p->second : -1;
      t.sessions.push_back(std::move(s));
    }
    TraceRequest q;
    q.start_s = r.start_s;
    q.think_s = r.think_s;
    q.api_s = r.api_s;
    q.prompt_tokens = r.prompt_tokens;
    q.output_tokens = r.output_tokens;
    q.ids_begin = static_cast<uint32_t>(t.ids.size());
    q.ids_count = static_cast<uint32_t>(r.ids.size());
    q.order = order++;
    q.stop = r.stop;
    t.ids.insert(t.ids.end(), r.ids.begin(), r.ids.end());
    t.sessions[it->second].requests.push_back(q);
  }
  KVTIER_RETURN_IF_ERROR(stream.status());
  stream.Rewind();
  return t;
}

}  // namespace kvtier::workload
