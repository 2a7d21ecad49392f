// Trace readers: the shipped traces parse as documented, bad input gets one clear error that
// names the file and the line or request, and the replay order follows doc/replay.md.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "workload/readers.h"
#include "workload/trace.h"

namespace kvtier::workload {
namespace {

std::string SharedDir() {
  const char* env = std::getenv("KVTIER_SHARED_DIR");
  return env ? env : "";
}

std::string Err(const Result<Trace>& r) { return r.ok() ? "(ok)" : r.status().message(); }

TEST(AgentXReader, ParsesSubAgentsAsChildSessionsAtTheirOffset) {
  const std::string json = R"({"id":"t1","block_size":4,"hash_id_scope":"local","requests":[
    {"t":0,"type":"n","in":8,"out":2,"hash_ids":[1,2],"think_time":0,"api_time":1.5,"stop":"tool_use"},
    {"t":10,"type":"subagent","agent_id":"agent_007","requests":[
       {"t":0,"type":"n","in":5,"out":1,"hash_ids":[9]},
       {"t":2.5,"type":"n","in":9,"out":1,"hash_ids":[9,10,11]}]},
    {"t":20,"type":"n","in":12,"out":3,"hash_ids":[1,2,3],"think_time":4,"stop":"end_turn"}]})";
  auto r = ParseAgentX(json, "mem.json");
  ASSERT_TRUE(r.ok()) << Err(r);
  const Trace& t = *r;
  EXPECT_EQ(t.name, "t1");
  EXPECT_EQ(t.block_tokens, 4u);
  ASSERT_EQ(t.sessions.size(), 2u);
  EXPECT_EQ(t.sessions[1].name, "t1/agent_007");
  EXPECT_EQ(t.sessions[1].parent, 0);
  ASSERT_EQ(t.sessions[1].requests.size(), 2u);
  EXPECT_DOUBLE_EQ(t.sessions[1].requests[0].start_s, 10.0);
  EXPECT_DOUBLE_EQ(t.sessions[1].requests[1].start_s, 12.5);
  EXPECT_EQ(t.sessions[0].requests[0].stop, StopKind::kToolUse);
  EXPECT_DOUBLE_EQ(t.sessions[0].requests[0].api_s, 1.5);
  EXPECT_EQ(t.sessions[0].requests[1].stop, StopKind::kEndTurn);
  EXPECT_DOUBLE_EQ(t.sessions[0].requests[1].think_s, 4.0);
  EXPECT_LT(t.sessions[1].requests[1].think_s, 0);  // not recorded

  // Replay order: by start time; the parent's t=20 request comes after the sub-agent's.
  auto stream = StreamTraces(std::span<const Trace>(&t, 1));
  ReplayRequest q;
  std::vector<std::pair<double, uint64_t>> seen;
  while (stream->Next(&q)) seen.emplace_back(q.start_s, q.session);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], std::make_pair(0.0, uint64_t{1}));
  EXPECT_EQ(seen[1], std::make_pair(10.0, uint64_t{2}));
  EXPECT_EQ(seen[2], std::make_pair(12.5, uint64_t{2}));
  EXPECT_EQ(seen[3], std::make_pair(20.0, uint64_t{1}));
}

TEST(AgentXReader, LocalIdsAreSaltedPerTraceGlobalIdsAreNot) {
  auto make = [](const char* id, const char* scope) {
    return std::string(R"({"id":")") + id + R"(","block_size":64,"hash_id_scope":")" + scope +
           R"(","requests":[{"t":0,"type":"n","in":64,"hash_ids":[1]}]})";
  };
  auto a = ParseAgentX(make("a", "local"), "a.json");
  auto b = ParseAgentX(make("b", "local"), "b.json");
  auto a2 = ParseAgentX(make("a", "local"), "a2.json");
  auto ga = ParseAgentX(make("a", "global"), "ga.json");
  auto gb = ParseAgentX(make("b", "global"), "gb.json");
  ASSERT_TRUE(a.ok() && b.ok() && a2.ok() && ga.ok() && gb.ok());
  EXPECT_NE(a->root, b->root);
  EXPECT_EQ(a->root, a2->root);
  EXPECT_EQ(ga->root, gb->root);
  EXPECT_NE(ga->root, a->root);
}

TEST(AgentXReader, ErrorsNameTheFileAndTheRequest) {
  auto bad = [](const std::string& requests) {
    return ParseAgentX(R"({"id":"x","block_size":64,"requests":[)" + requests + "]}", "bad.json");
  };
  EXPECT_EQ(Err(bad(R"({"t":0,"type":"n","in":"12","hash_ids":[]})")),
            "bad.json: requests[0]: 'in' must be a non-negative integer");
  EXPECT_EQ(
      Err(bad(
          R"({"t":0,"type":"n","in":64,"hash_ids":[1]},{"t":1,"type":"n","in":-5,"hash_ids":[]})")),
      "bad.json: requests[1]: 'in' is negative (-5)");
  EXPECT_EQ(
      Err(bad(R"({"t":0,"type":"n","in":640,"hash_ids":[1,2]})")),
      "bad.json: requests[0]: hash_ids has 2 ids but 'in' = 640 tokens needs 10 blocks of 64");
  EXPECT_EQ(
      Err(bad(
          R"({"t":0,"type":"subagent","requests":[{"t":0,"type":"n","in":64,"hash_ids":[-1]}]})")),
      "bad.json: requests[0].requests[0]: hash_ids[0] is not a non-negative integer");
  EXPECT_EQ(Err(bad(R"({"t":-1,"type":"n","in":0,"hash_ids":[]})")),
            "bad.json: requests[0]: 't' must be >= 0, got -1.000000");
  EXPECT_EQ(Err(bad(R"({"type":"n","in":0,"hash_ids":[]})")), "bad.json: requests[0]: missing 't'");
  EXPECT_EQ(Err(ParseAgentX(R"({"id":"x","requests":[]})", "nb.json")),
            "nb.json: top level: missing 'block_size'");
  EXPECT_EQ(Err(ParseAgentX(R"([1,2])", "arr.json")), "arr.json: top level: not a JSON object");
}

TEST(AgentXReader, SyntaxErrorsNameTheLine) {
  const std::string truncated = "{\"id\":\"x\",\n\"block_size\":64,\n\"requests\":[{\"t\":0,";
  std::string e = Err(ParseAgentX(truncated, "cut.json"));
  EXPECT_EQ(e.rfind("cut.json: line 3, column ", 0), 0u) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  e = Err(ParseAgentX("{\"id\":\"x\",\n\"block_size\":64 \"requests\":[]}", "comma.json"));
  EXPECT_EQ(e.rfind("comma.json: line 2, column ", 0), 0u) << e;
}

// An integer too large for 64 bits is valid JSON that simdjson refuses with "Problem while
// parsing a number" and no place: the error now names the value's path (and line, for JSONL).
TEST(AgentXReader, IntegerTooLargeNamesItsPath) {
  EXPECT_EQ(Err(ParseAgentX("{\"block_size\": 64, \"requests\": [{\"t\": 0, \"in\": 1},\n"
                            "{\"t\": 1, \"in\": 99999999999999999999999}]}",
                            "big.json")),
            "big.json: requests[1].in: integer 99999999999999999999999 does not fit in 64 bits");
  EXPECT_EQ(Err(ParseMooncake("{\"timestamp\": 0, \"input_length\": 99999999999999999999999, "
                              "\"hash_ids\": [1]}\n",
                              "big.jsonl")),
            "big.jsonl:1: input_length: integer 99999999999999999999999 does not fit in 64 bits");
}

TEST(MooncakeReader, ParsesAndNamesTheLineOfABadRecord) {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 1500, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [0]}\n";
  auto r = ParseMooncake(good, "m.jsonl");
  ASSERT_TRUE(r.ok()) << Err(r);
  EXPECT_EQ(r->block_tokens, 512u);
  ASSERT_EQ(r->sessions.size(), 2u);
  EXPECT_DOUBLE_EQ(r->sessions[1].requests[0].start_s, 1.5);
  EXPECT_EQ(r->prompt_tokens(), 1112u);

  EXPECT_EQ(
      Err(ParseMooncake(good + "{\"timestamp\": 2, \"input_length\": 9, \"hash_ids\": [0, 1]}\n",
                        "m.jsonl")),
      "m.jsonl:3: hash_ids has 2 ids but input_length 9 needs 1 blocks of 512");
  EXPECT_EQ(Err(ParseMooncake(good + "{\"timestamp\": 2, \"input_length\": -9, \"hash_ids\": []}",
                              "m.jsonl")),
            "m.jsonl:3: 'input_length' is negative (-9)");
  const std::string e = Err(ParseMooncake(good + "{\"timestamp\": 2, \"input_le", "m.jsonl"));
  EXPECT_EQ(e.rfind("m.jsonl:3: column ", 0), 0u) << e;
}

TEST(DetectFormat, TellsAgentXFromMooncake) {
  EXPECT_EQ(*DetectFormat("{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [0]}\n{}", "m"),
            TraceFormat::kMooncake);
  EXPECT_EQ(*DetectFormat("{\"id\":\"x\",\"block_size\":64,\"requests\":[]}", "a"),
            TraceFormat::kAgentX);
  EXPECT_EQ(DetectFormat("[]", "z.json").status().message(),
            "z.json: not a trace (expected a JSON object at line 1)");
  EXPECT_FALSE(DetectFormat("{\"foo\": 1}", "f.json").ok());
}

// Lets this process map at most `extra` bytes more than it maps now (a sanitizer's shadow
// included). For a forked child: the limit stays with it.
bool LimitAddressSpaceTo(uint64_t extra) {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  unsigned long long pages = 0;
  const bool read = statm != nullptr && std::fscanf(statm, "%llu", &pages) == 1;
  if (statm != nullptr) std::fclose(statm);
  if (!read) return false;
  rlimit lim{};
  ::getrlimit(RLIMIT_AS, &lim);
  lim.rlim_cur = pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) + extra;
  return ::setrlimit(RLIMIT_AS, &lim) == 0;
}

// A file that is no trace was read whole before its format was looked at (a 5 GB sparse file:
// 27 s and 5.3 GB of memory to be refused). Now the head decides: under an address-space limit
// far below the file's size, it is refused, not read. Runs in a child (the limit stays there).
TEST(LoadTraces, FileThatIsNoTraceIsRefusedFromItsHead) {
  const std::string path = ::testing::TempDir() + "/sparse_" + std::to_string(::getpid()) + ".json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    std::filesystem::resize_file(path, 4ull << 30);  // 4 GiB of holes
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(20);
    // 2 GiB more than the process maps now (a sanitizer's shadow included): less than the file.
    if (!LimitAddressSpaceTo(2ull << 30)) _exit(10);
    const std::vector<std::string> paths = {path};
    Result<std::vector<workload::Trace>> t = workload::LoadTraces(paths, std::nullopt);
    if (t.ok()) _exit(11);
    if (t.status().message().find("not a trace") == std::string::npos) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::filesystem::remove(path);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check failed";
}

// A Mooncake file was read whole before parsing: now it is read line by line, so a file larger
// than the process may map is parsed up to its bad line and refused there, naming it.
TEST(LoadTraces, MooncakeIsStreamedLineByLine) {
  const std::string path =
      ::testing::TempDir() + "/stream_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"timestamp\": 0, \"input_length\": 512, \"hash_ids\": [7]}\n", f);
    std::fclose(f);
    std::filesystem::resize_file(path, 3ull << 30);  // then 3 GiB of holes, no newline
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(60);
    if (!LimitAddressSpaceTo(1ull << 30)) _exit(10);
    const std::vector<std::string> paths = {path};
    try {
      Result<std::vector<workload::Trace>> t =
          workload::LoadTraces(paths, workload::TraceFormat::kMooncake);
      if (t.ok()) _exit(11);
      if (t.status().message().find(":2: line longer than 64 MiB") == std::string::npos) _exit(12);
    } catch (const std::bad_alloc&) {
      _exit(14);  // read whole
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::filesystem::remove(path);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check failed";
}

TEST(LoadTraces, ShippedTracesMatchTheirReadme) {
  const std::string dir = SharedDir();
  if (dir.empty() || !std::filesystem::exists(dir + "/traces/agentx-weka")) {
    GTEST_SKIP() << "KVTIER_SHARED_DIR does not hold traces/ (set by ctest)";
  }
  std::vector<std::string> paths = {dir + "/traces/agentx-weka", dir + "/traces/mooncake"};
  auto traces = LoadTraces(paths);
  ASSERT_TRUE(traces.ok()) << traces.status().ToString();
  ASSERT_EQ(traces->size(), 7u);
  const Trace& t274 = (*traces)[2];
  EXPECT_EQ(t274.name, "trace_0274");
  EXPECT_EQ(t274.format, TraceFormat::kAgentX);
  EXPECT_EQ(t274.sessions.size(), 4u);  // 3 sub-agents
  EXPECT_EQ(t274.num_requests(), 105u);
  // The first sub-agent starts at its recorded t; its second request 5 s later.
  EXPECT_DOUBLE_EQ(t274.sessions[1].requests[0].start_s, 160.959);
  EXPECT_DOUBLE_EQ(t274.sessions[1].requests[1].start_s, 165.959);
  const Trace& moon = (*traces)[6];
  EXPECT_EQ(moon.format, TraceFormat::kMooncake);
  EXPECT_EQ(moon.num_requests(), 12031u);

  auto stream = StreamTraces(*traces);
  auto stats = ComputeStats(*stream);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests, 20u + 6 + 105 + 53 + 143 + 7 + 12031);
}

}  // namespace
}  // namespace kvtier::workload
