// AgentX / WEKA session JSON reader (simdjson DOM; the error path re-parses for a location).
#include <simdjson.h>

#include <cmath>
#include <string>

#include "workload/json_error.h"
#include "workload/readers.h"

namespace kvtier::workload {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

class AgentXParser {
 public:
  AgentXParser(std::string_view source, Trace* trace) : source_(source), trace_(trace) {}

  Status Fail(const std::string& where, const std::string& what) const {
    return Status::InvalidArgument(std::string(source_) + ": " + where + ": " + what);
  }

  // A non-negative integer field; `required` = false leaves *out untouched when absent.
  Status UInt(const object& o, const char* key, const std::string& where, bool required,
              uint64_t* out) const {
    element e;
    if (o[key].get(e) != simdjson::SUCCESS) {
      return required ? Fail(where, std::string("missing '") + key + "'") : Status::Ok();
    }
    int64_t i = 0;
    uint64_t u = 0;
    if (e.is_uint64() && e.get_uint64().get(u) == simdjson::SUCCESS) {
      *out = u;
      return Status::Ok();
    }
    if (e.is_int64() && e.get_int64().get(i) == simdjson::SUCCESS) {
      return Fail(where, std::string("'") + key + "' is negative (" + std::to_string(i) + ")");
    }
    double d = 0;
    if (e.get_double().get(d) == simdjson::SUCCESS) {
      return Fail(where, std::string("'") + key + "' must be a non-negative integer, got " +
                             std::to_string(d));
    }
    return Fail(where, std::string("'") + key + "' must be a non-negative integer");
  }

  // A non-negative number of seconds; absent leaves *out as is.
  Status Seconds(const object& o, const char* key, const std::string& where, bool required,
                 double* out) const {
    element e;
    if (o[key].get(e) != simdjson::SUCCESS) {
      return required ? Fail(where, std::string("missing '") + key + "'") : Status::Ok();
    }
    if (e.is_null() && !required) return Status::Ok();
    double d = 0;
    if (e.get_double().get(d) != simdjson::SUCCESS) {
      return Fail(where, std::string("'") + key + "' must be a number");
    }
    if (!(d >= 0) || !std::isfinite(d)) {
      return Fail(where, std::string("'") + key + "' must be >= 0, got " + std::to_string(d));
    }
    *out = d;
    return Status::Ok();
  }

  Status Requests(const array& requests, const std::string& prefix, int32_t session_index,
                  int depth) {
    if (depth > 8) return Fail(prefix, "sub-agents nested deeper than 8");
    size_t index = 0;
    for (element e : requests) {
      const std::string where = prefix + "[" + std::to_string(index++) + "]";
      object r;
      if (e.get_object().get(r) != simdjson::SUCCESS) return Fail(where, "not an object");
      double t = 0;
      KVTIER_RETURN_IF_ERROR(Seconds(r, "t", where, /*required=*/true, &t));
      std::string_view type;
      if (r["type"].get(type) != simdjson::SUCCESS) {
        return Fail(where, "missing or non-string 'type'");
      }
      const double session_start = trace_->sessions[session_index].start_s;
      if (type == "subagent") {
        array sub;
        if (r["requests"].get(sub) != simdjson::SUCCESS) {
          return Fail(where, "sub-agent without a 'requests' array");
        }
        std::string_view agent_id;
        std::string name = trace_->sessions[session_index].name + "/";
        if (r["agent_id"].get(agent_id) == simdjson::SUCCESS) {
          name += std::string(agent_id);
        } else {
          name += "subagent_" + std::to_string(trace_->sessions.size());
        }
        TraceSession child;
        child.name = std::move(name);
        child.parent = session_index;
        child.start_s = session_start + t;
        trace_->sessions.push_back(std::move(child));
        const int32_t child_index = static_cast<int32_t>(trace_->sessions.size() - 1);
        KVTIER_RETURN_IF_ERROR(Requests(sub, where + ".requests", child_index, depth + 1));
        continue;
      }
      TraceRequest q;
      q.start_s = session_start + t;
      uint64_t in = 0, out = 0;
      KVTIER_RETURN_IF_ERROR(UInt(r, "in", where, /*required=*/true, &in));
      KVTIER_RETURN_IF_ERROR(UInt(r, "out", where, /*required=*/false, &out));
      if (in > UINT32_MAX || out > UINT32_MAX) return Fail(where, "token count over 2^32");
      q.prompt_tokens = static_cast<uint32_t>(in);
      q.output_tokens = static_cast<uint32_t>(out);
      KVTIER_RETURN_IF_ERROR(Seconds(r, "think_time", where, false, &q.think_s));
      KVTIER_RETURN_IF_ERROR(Seconds(r, "api_time", where, false, &q.api_s));
      std::string_view stop;
      if (r["stop"].get(stop) == simdjson::SUCCESS) {
        q.stop = stop == "tool_use"   ? StopKind::kToolUse
                 : stop == "end_turn" ? StopKind::kEndTurn
                 : stop.empty()       ? StopKind::kUnknown
                                      : StopKind::kOther;
      }
      array ids;
      if (r["hash_ids"].get(ids) != simdjson::SUCCESS) {
        return Fail(where, "missing or non-array 'hash_ids'");
      }
      q.ids_begin = static_cast<uint32_t>(trace_->ids.size());
      for (element id : ids) {
        uint64_t v = 0;
        if (id.get_uint64().get(v) != simdjson::SUCCESS) {
          return Fail(where, "hash_ids[" + std::to_string(trace_->ids.size() - q.ids_begin) +
                                 "] is not a non-negative integer");
        }
        trace_->ids.push_back(v);
      }
      if (trace_->ids.size() > UINT32_MAX) return Fail(where, "more than 2^32 block ids");
      q.ids_count = static_cast<uint32_t>(trace_->ids.size() - q.ids_begin);
      // One id per block; the trace's last id may stand for a partial block (or be left out).
      const uint64_t full = in / block_tokens_;
      const uint64_t all = (in + block_tokens_ - 1) / block_tokens_;
      if (q.ids_count != full && q.ids_count != all) {
        return Fail(where, "hash_ids has " + std::to_string(q.ids_count) + " ids but 'in' = " +
                               std::to_string(in) + " tokens needs " + std::to_string(full) +
                               (full == all ? "" : " or " + std::to_string(all)) + " blocks of " +
                               std::to_string(block_tokens_));
      }
      q.order = order_++;
      trace_->sessions[session_index].requests.push_back(q);
    }
    return Status::Ok();
  }

  Status Parse(std::string_view json) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(json);
    element doc;
    if (auto err = parser.parse(padded).get(doc); err != simdjson::SUCCESS) {
      std::string where = LocateJsonError(json);
      if (where.empty()) where = simdjson::error_message(err);
      return Status::InvalidArgument(std::string(source_) + ": " + where);
    }
    object root;
    if (doc.get_object().get(root) != simdjson::SUCCESS) {
      return Fail("top level", "not a JSON object");
    }
    uint64_t block_size = 0;
    KVTIER_RETURN_IF_ERROR(UInt(root, "block_size", "top level", true, &block_size));
    if (block_size == 0 || block_size > (1u << 20)) {
      return Fail("top level",
                  "'block_size' must be in [1, 2^20], got " + std::to_string(block_size));
    }
    block_tokens_ = static_cast<uint32_t>(block_size);
    trace_->block_tokens = block_tokens_;
    std::string_view id;
    if (root["id"].get(id) == simdjson::SUCCESS && !id.empty()) {
      trace_->name = std::string(id);
    }
    std::string_view scope = "local";
    if (root["hash_id_scope"].get(scope) != simdjson::SUCCESS) scope = "local";
    if (scope != "local" && scope != "global") {
      return Fail("top level", "'hash_id_scope' must be \"local\" or \"global\", got \"" +
                                   std::string(scope) + "\"");
    }
    // Local ids mean nothing outside their file: salt them with the trace id.
    trace_->root = Namespace{.model_id = scope == "local" ? "agentx:" + trace_->name
                                                          : std::string("agentx:global")}
                       .Root();
    array requests;
    if (root["requests"].get(requests) != simdjson::SUCCESS) {
      return Fail("top level", "missing or non-array 'requests'");
    }
    TraceSession top;
    top.name = trace_->name;
    trace_->sessions.push_back(std::move(top));
    return Requests(requests, "requests", 0, 0);
  }

 private:
  std::string_view source_;
  Trace* trace_;
  uint32_t block_tokens_ = 64;
  uint32_t order_ = 0;
};

std::string BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t dot = base.rfind('.');
  if (dot != std::string_view::npos && dot > 0) base = base.substr(0, dot);
  return std::string(base);
}

}  // namespace

Result<Trace> ParseAgentX(std::string_view json, std::string_view source) {
  Trace trace;
  trace.format = TraceFormat::kAgentX;
  trace.path = std::string(source);
  trace.name = BaseName(source);
  AgentXParser parser(source, &trace);
  KVTIER_RETURN_IF_ERROR(parser.Parse(json));
  return trace;
}

}  // namespace kvtier::workload
