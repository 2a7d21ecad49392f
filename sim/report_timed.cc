// Timed-replay reports and the HTML page (inline SVG, no scripts, no external resources).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>

#include "sim/report.h"

namespace kvtier::sim {
namespace {

nlohmann::json PercentilesJson(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p75", p.p75},
          {"p90", p.p90},   {"p95", p.p95}, {"p99", p.p99}};
}

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string F(double v, int digits = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

const char* kColors[] = {"#2b6cb0", "#38a169", "#d69e2e", "#805ad5", "#c53030", "#718096"};

std::string RunLabel(const TimedResult& r) {
  std::string tiers;
  for (const auto& t : r.tiers) tiers += (tiers.empty() ? "" : "+") + t.tier;
  return r.policy + " C=" + std::to_string(r.concurrency) + " " + tiers +
         (r.replicas > 1 ? " x" + std::to_string(r.replicas) : "");
}

// Horizontal stacked bars: the prompt-token split of each run, with the ideal hit rate marked.
std::string HitBars(const std::vector<std::string>& labels,
                    const std::vector<std::array<double, 5>>& splits,
                    const std::vector<double>& ideal) {
  const int w = 760, row = 26, left = 230;
  const int h = 40 + row * static_cast<int>(labels.size()) + 30;
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' width='" + std::to_string(w) +
                  "' height='" + std::to_string(h) + "' font-family='sans-serif' font-size='12'>";
  s += "<text x='4' y='16' font-weight='bold'>Prompt tokens by source (| = ideal hit rate)</text>";
  const char* names[] = {"HBM hit", "host hit", "SSD hit", "remote hit", "recomputed"};
  const char* colors[] = {"#2b6cb0", "#38a169", "#d69e2e", "#805ad5", "#cbd5e0"};
  for (size_t i = 0; i < labels.size(); ++i) {
    const int y = 28 + row * static_cast<int>(i);
    s += "<text x='4' y='" + std::to_string(y + 15) + "'>" + Esc(labels[i]) + "</text>";
    double x = left;
    const double span = w - left - 20;
    for (int k = 0; k < 5; ++k) {
      const double bw = span * splits[i][k];
      if (bw <= 0) continue;
      s += "<rect x='" + F(x) + "' y='" + std::to_string(y) + "' width='" + F(bw) +
           "' height='20' fill='" + colors[k] + "'><title>" + names[k] + " " +
           F(100 * splits[i][k], 1) + "%</title></rect>";
      x += bw;
    }
    if (i < ideal.size() && ideal[i] >= 0) {
      const double ix = left + span * ideal[i];
      s += "<line x1='" + F(ix) + "' x2='" + F(ix) + "' y1='" + std::to_string(y - 2) + "' y2='" +
           std::to_string(y + 22) + "' stroke='black' stroke-width='2'/>";
    }
  }
  const int ly = h - 12;
  for (int k = 0; k < 5; ++k) {
    s += "<rect x='" + std::to_string(left + 105 * k) + "' y='" + std::to_string(ly - 10) +
         "' width='12' height='12' fill='" + colors[k] + "'/><text x='" +
         std::to_string(left + 105 * k + 16) + "' y='" + std::to_string(ly) + "'>" + names[k] +
         "</text>";
  }
  return s + "</svg>";
}

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;
  bool dashed_halo = false;
  bool line = true;
  bool dots = true;
  std::vector<std::string> point_labels;  // drawn beside each point when given
};

struct Mark {  // a labelled vertical line at x
  double x;
  std::string label;
};

// Axis ticks at 1-2-5 steps covering [lo, hi], about `want` of them, and the digits they need.
std::vector<double> NiceTicks(double lo, double hi, int want, int* digits) {
  const double raw = (hi - lo) / std::max(1, want);
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  *digits = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  // From the last tick at or below lo to the first at or above hi: the axis ends on labels.
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  for (double k = first; k <= last; k += 1) ticks.push_back(k == 0 ? 0 : k * step);
  return ticks;
}

// A line / scatter chart with 1-2-5 ticks (powers of ten on a log x axis).
std::string Chart(const std::string& title, const std::string& xl, const std::string& yl,
                  const std::vector<Series>& series, bool log_x = false,
                  const std::vector<Mark>& marks = {}) {
  const int w = 760, h = 340, l = 70, r = 170, t = 30, b = 45;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto tx = [&](double x) { return log_x ? std::log10(std::max(x, 1e-9)) : x; };
  for (const auto& se : series) {
    for (auto [x, y] : se.points) {
      x0 = std::min(x0, tx(x));
      x1 = std::max(x1, tx(x));
      y1 = std::max(y1, y);
      y0 = std::min(y0, y);
    }
  }
  if (x0 == INFINITY) x0 = x1 = y0 = y1 = 0;
  if (!(x1 > x0)) {
    x0 -= 1;
    x1 += 1;
  }
  if (!(y1 > y0)) {
    y0 -= 1;
    y1 += 1;
  }
  // Snap the data range out to the ticks so the axes start and end on a label.
  int xd = 0, yd = 0;
  std::vector<double> yt = NiceTicks(y0, y1, 5, &yd);
  y0 = yt.front();
  y1 = yt.back();
  std::vector<double> xt;
  if (log_x) {
    x0 = std::floor(x0);
    x1 = std::ceil(x1);
    for (double e = x0; e <= x1; e += 1) xt.push_back(e);
  } else {
    xt = NiceTicks(x0, x1, 6, &xd);
    x0 = xt.front();
    x1 = xt.back();
  }
  auto px = [&](double x) { return l + (tx(x) - x0) / (x1 - x0) * (w - l - r); };
  auto pxt = [&](double v) { return l + (v - x0) / (x1 - x0) * (w - l - r); };
  auto py = [&](double y) { return h - b - (y - y0) / (y1 - y0) * (h - t - b); };
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' width='" + std::to_string(w) +
                  "' height='" + std::to_string(h) + "' font-family='sans-serif' font-size='12'>";
  s += "<text x='4' y='16' font-weight='bold'>" + Esc(title) + "</text>";
  for (double v : yt) {
    if (v < y0 || v > y1) continue;
    s += "<line x1='" + std::to_string(l) + "' x2='" + std::to_string(w - r) + "' y1='" + F(py(v)) +
         "' y2='" + F(py(v)) + "' stroke='#eee'/>";
    s += "<text x='" + std::to_string(l - 6) + "' y='" + F(py(v) + 4) + "' text-anchor='end'>" +
         F(v, yd) + "</text>";
  }
  for (double v : xt) {
    const double sx = pxt(v);
    std::string label =
        log_x ? (v >= 0 ? F(std::pow(10, v), 0) : F(std::pow(10, v), int(-v))) : F(v, xd);
    s += "<line x1='" + F(sx) + "' x2='" + F(sx) + "' y1='" + std::to_string(h - b) + "' y2='" +
         std::to_string(h - b + 4) + "' stroke='#333'/>";
    s += "<text x='" + F(sx) + "' y='" + std::to_string(h - b + 16) + "' text-anchor='middle'>" +
         label + "</text>";
  }
  s += "<line x1='" + std::to_string(l) + "' y1='" + std::to_string(h - b) + "' x2='" +
       std::to_string(w - r) + "' y2='" + std::to_string(h - b) + "' stroke='#333'/>";
  s += "<line x1='" + std::to_string(l) + "' y1='" + std::to_string(t) + "' x2='" +
       std::to_string(l) + "' y2='" + std::to_string(h - b) + "' stroke='#333'/>";
  s += "<text x='" + std::to_string((l + w - r) / 2) + "' y='" + std::to_string(h - 8) +
       "' text-anchor='middle'>" + Esc(xl) + "</text>";
  s += "<text x='14' y='" + std::to_string((t + h - b) / 2) + "' transform='rotate(-90 14 " +
       std::to_string((t + h - b) / 2) + ")' text-anchor='middle'>" + Esc(yl) + "</text>";
  for (const Mark& m : marks) {
    const double mx = px(m.x);
    s += "<line x1='" + F(mx) + "' x2='" + F(mx) + "' y1='" + std::to_string(t) + "' y2='" +
         std::to_string(h - b) + "' stroke='#c53030' stroke-dasharray='5,3'/>";
    s += "<text x='" + F(mx + 4) + "' y='" + std::to_string(t + 12) + "' fill='#c53030'>" +
         Esc(m.label) + "</text>";
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& se = series[i];
    const char* c = kColors[i % 6];
    if (se.line && se.points.size() > 1) {
      std::string pts;
      for (auto [x, y] : se.points) pts += F(px(x)) + "," + F(py(y)) + " ";
      s += "<polyline fill='none' stroke='" + std::string(c) + "' stroke-width='2' points='" + pts +
           "'/>";
    }
    for (size_t k = 0; k < se.points.size(); ++k) {
      const auto [x, y] = se.points[k];
      if (se.dashed_halo) {
        s += "<circle cx='" + F(px(x)) + "' cy='" + F(py(y)) + "' r='9' fill='none' stroke='" + c +
             "' stroke-dasharray='3,2'/>";
      }
      if (se.dots && (!se.line || se.points.size() < 40)) {
        s += "<circle cx='" + F(px(x)) + "' cy='" + F(py(y)) + "' r='3.5' fill='" + c + "'/>";
      }
      if (k < se.point_labels.size()) {
        s += "<text x='" + F(px(x) + 11) + "' y='" + F(py(y) + 4) +
             "' font-size='10' fill='#444'>" + Esc(se.point_labels[k]) + "</text>";
      }
    }
    s += "<text x='" + std::to_string(w - r + 10) + "' y='" + std::to_string(t + 16 * i + 10) +
         "' fill='" + c + "'>" + Esc(se.label) + (se.dashed_halo ? " (dashed halo)" : "") +
         "</text>";
  }
  return s + "</svg>";
}

// The host pool of a run as a multiple of its HBM KV capacity (0 = no host tier).
double PoolMultiple(const TimedResult& r) {
  for (const auto& t : r.tiers) {
    if (t.tier == "host" && !r.tiers.empty() && r.tiers[0].capacity_blocks > 0) {
      return static_cast<double>(t.capacity_blocks) /
             static_cast<double>(r.tiers[0].capacity_blocks);
    }
  }
  return 0;
}

bool HasRemote(const TimedResult& r) {
  for (const auto& t : r.tiers) {
    if (t.tier == "remote") return true;
  }
  return false;
}

// Runs that differ only in host pool size, in pool order.
struct PoolGroup {
  std::string label;
  std::vector<const TimedResult*> runs;
  int knee = -1;  // index of the first pool after which one more step adds < 1 point; -1 none
};

std::vector<PoolGroup> PoolGroups(const std::vector<TimedResult>& runs) {
  std::vector<PoolGroup> groups;
  std::vector<std::string> keys;
  for (const auto& r : runs) {
    const std::string key = r.gpu + "|" + r.model + "|" + r.policy + "|" +
                            std::to_string(r.concurrency) + "|" + std::to_string(r.replicas) + "|" +
                            std::to_string(r.dp) + (HasRemote(r) ? "|remote" : "");
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      groups.push_back({r.policy + " C=" + std::to_string(r.concurrency) +
                            (r.replicas > 1 ? " x" + std::to_string(r.replicas) : "") +
                            (HasRemote(r) ? " +remote" : ""),
                        {}});
      it = keys.end() - 1;
    }
    groups[it - keys.begin()].runs.push_back(&r);
  }
  for (auto& g : groups) {
    std::stable_sort(g.runs.begin(), g.runs.end(), [](const TimedResult* a, const TimedResult* b) {
      return PoolMultiple(*a) < PoolMultiple(*b);
    });
    for (size_t i = 0; i + 1 < g.runs.size(); ++i) {
      if (PoolMultiple(*g.runs[i]) > 0 &&
          g.runs[i + 1]->hit_rate() - g.runs[i]->hit_rate() < 0.01) {
        g.knee = static_cast<int>(i);
        break;
      }
    }
  }
  return groups;
}

std::string Multiple(double m) { return F(m, m == std::floor(m) ? 0 : 1) + "x"; }

// A legend-sized name of a run: what varies in a sweep.
std::string ShortLabel(const TimedResult& r) {
  const double pool = PoolMultiple(r);
  return "C=" + std::to_string(r.concurrency) +
         (pool > 0 ? " pool " + Multiple(pool) : " HBM only") + (HasRemote(r) ? " +remote" : "") +
         (r.replicas > 1 ? " x" + std::to_string(r.replicas) : "");
}

// The plain-language answer a sweep gives, one sentence per pool group.
std::string Answer(const std::vector<PoolGroup>& groups) {
  std::string s;
  for (const auto& g : groups) {
    if (g.runs.size() < 2) continue;
    const TimedResult& any = *g.runs.front();
    std::string who = "At C=" + std::to_string(any.concurrency) + " on " +
                      std::to_string(any.replicas * any.tp) + " x " + any.gpu + " with " +
                      any.model + " (" + any.policy + ")";
    if (g.knee >= 0) {
      const TimedResult& k = *g.runs[g.knee];
      s += "<li>" + Esc(who) + ", a host pool of " + Multiple(PoolMultiple(k)) +
           " the HBM KV gives " + F(100 * k.hit_rate(), 1) + "% hits (ideal " +
           F(100 * k.ideal_hit_rate, 1) + "%); beyond " + Multiple(PoolMultiple(k)) +
           " each step adds less than a point.</li>";
    } else {
      const TimedResult& last = *g.runs.back();
      s += "<li>" + Esc(who) +
           ", hits still grow by a point or more per step up to a host pool of " +
           Multiple(PoolMultiple(last)) + " the HBM KV (" + F(100 * last.hit_rate(), 1) +
           "% hits, ideal " + F(100 * last.ideal_hit_rate, 1) + "%): try larger pools.</li>";
    }
  }
  return s.empty() ? "" : "<ul class='answer'>" + s + "</ul>";
}

// Indices of the runs no other run beats on both interactivity and throughput.
std::vector<size_t> ParetoFront(const std::vector<std::pair<double, double>>& pts) {
  std::vector<size_t> idx(pts.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return pts[a].first != pts[b].first ? pts[a].first > pts[b].first
                                        : pts[a].second > pts[b].second;
  });
  std::vector<size_t> front;
  double best_y = -INFINITY;
  for (size_t i : idx) {
    if (pts[i].second > best_y) {
      front.push_back(i);
      best_y = pts[i].second;
    }
  }
  std::reverse(front.begin(), front.end());  // by interactivity, ascending
  return front;
}

std::string DefinitionsHtml(const nlohmann::json& defs) {
  std::string s = "<h2>Definitions</h2><dl>";
  for (auto it = defs.begin(); it != defs.end(); ++it) {
    s += "<dt><code>" + Esc(it.key()) + "</code></dt><dd>" + Esc(it.value().get<std::string>()) +
         "</dd>";
  }
  return s + "</dl>";
}

std::string Page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + Esc(title) +
         "</title><style>body{font-family:sans-serif;max-width:820px;margin:20px "
         "auto}table{font-size:13px}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
         "text-align:right}.answer{font-size:1.1em;background:#f0f7ff;padding:10px 10px 10px "
         "30px;border-left:4px solid #2b6cb0}dd{margin:0 0 6px "
         "20px;color:#333}</style></head><body><h1>" +
         Esc(title) + "</h1>" + body + "</body></html>\n";
}

}  // namespace

nlohmann::json TimedMetricDefinitions() {
  return {
      {"hit_rate",
       "prompt tokens not recomputed (HBM hits + tokens loaded from host, SSD or remote) / all "
       "prompt tokens, token-weighted over the measured requests"},
      {"ideal_hit_rate",
       "the same requests against an infinite cache: leading blocks seen before, in tokens / all "
       "prompt tokens"},
      {"hbm_hit_share", "prompt tokens found in HBM / all prompt tokens (InferenceX 'HBM hit')"},
      {"dram_hit_share",
       "prompt tokens loaded from host DRAM / all prompt tokens (InferenceX 'DRAM hit')"},
      {"ttft_s", "request arrival to its first token (queueing, loads and prefill)"},
      {"itl_s",
       "inter-token latency: one sample per output token after the first (decode step / "
       "speculative acceptance length); percentiles over tokens"},
      {"tpot_s",
       "per request, its decode time per output token (decode step / speculative acceptance "
       "length, fixed when its decode starts); percentiles over requests"},
      {"interactivity_tokens_per_s",
       "InferenceX: 1 / percentile(ITL) at p50, p75 and p90, tokens/s per user; the headline is "
       "p90's"},
      {"throughput_per_gpu",
       "tokens / measured seconds / GPUs (replicas x tp); input counts every prompt token, cached "
       "ones included; total = input + output"},
      {"concurrency_live_trees",
       "InferenceX concurrency: session trees (a session and its sub-agents) live at once, "
       "time-averaged over the measured window; 'concurrency' is the target"},
      {"measured_window_s",
       "metrics cover requests that arrive in [start, start + length); without --window-s the "
       "whole run"},
  };
}

nlohmann::json CacheMetricDefinitions() {
  return {
      {"hit_rate",
       "token-weighted: sum of hit tokens / sum of prompt tokens (hit tokens = min(leading "
       "cached blocks x block size, prompt tokens))"},
      {"per_request_mean_hit_rate",
       "Mooncake FAST'25 capacity curve: the mean over requests of hit tokens / prompt tokens"},
      {"ideal", "the same replay with an infinite cache"},
      {"min", "Belady's MIN, block-granular, descendants evicted first among equal next uses"},
  };
}

void PrintDefinitions(const nlohmann::json& defs, std::FILE* out) {
  std::fprintf(out, "definitions:\n");
  for (auto it = defs.begin(); it != defs.end(); ++it) {
    std::fprintf(out, "  %s: %s\n", it.key().c_str(), it.value().get<std::string>().c_str());
  }
}

nlohmann::json TimedJson(const TimedResult& r) {
  nlohmann::json j;
  j["mode"] = "timed";
  j["gpu"] = r.gpu;
  j["model"] = r.model;
  j["policy"] = r.policy;
  j["concurrency"] = r.concurrency;
  j["concurrency_live_trees"] = r.live_trees_mean;
  j["replicas"] = r.replicas;
  j["dp"] = r.dp;
  j["dp_routing"] = r.dp_round_robin ? "round-robin" : "affinity";
  j["agentx_rules"] = r.agentx_rules;
  j["measured_window_s"] = {{"start", r.window_start_s}, {"length", r.measured_s}};
  j["tp"] = r.tp;
  j["block_bytes"] = r.block_bytes;
  j["capacity_tokens"] = r.capacity_tokens;
  j["hbm_kv_bytes"] = r.hbm_kv_bytes;
  j["requests"] = r.requests;
  j["prompt_tokens"] = r.prompt_tokens;
  j["output_tokens"] = r.output_tokens;
  j["hit_tokens"] = r.prompt_tokens - r.recomputed;
  j["hit_rate"] = r.hit_rate();
  j["ideal_hit_rate"] = r.ideal_hit_rate;
  j["hbm_hit_share"] = r.hbm_hit_share();
  j["dram_hit_share"] = r.dram_hit_share();
  j["tokens_by_source"] = {{"hbm", r.hbm_tokens},
                           {"host", r.host_tokens},
                           {"disk", r.disk_tokens},
                           {"remote", r.remote_tokens},
                           {"recomputed", r.recomputed}};
  j["loadable_but_recomputed_tokens"] = r.loadable_recomputed;
  j["ttft_s"] = PercentilesJson(r.ttft_s);
  j["tpot_s"] = PercentilesJson(r.tpot_s);
  j["e2e_s"] = PercentilesJson(r.e2e_s);
  j["itl_s"] = PercentilesJson(r.itl_s);
  j["makespan_s"] = r.makespan_s;
  j["throughput_per_gpu"] = {{"input_tokens_per_s", r.input_tokens_per_s_per_gpu},
                             {"output_tokens_per_s", r.output_tokens_per_s_per_gpu},
                             {"total_tokens_per_s", r.total_tokens_per_s_per_gpu}};
  j["interactivity_tokens_per_s"] = {
      {"p50", r.interactivity_p50}, {"p75", r.interactivity_p75}, {"p90", r.interactivity}};
  nlohmann::json tiers = nlohmann::json::array();
  for (size_t i = 0; i < r.tiers.size(); ++i) {
    const auto& t = r.tiers[i];
    tiers.push_back(
        {{"tier", t.tier},
         {"load_bytes", t.load_bytes},
         {"store_bytes", t.store_bytes},
         {"capacity_blocks", t.capacity_blocks},
         {"peak_blocks", t.peak_blocks},
         {"occupancy", i < r.occupancy_frac.size() ? r.occupancy_frac[i] : std::vector<double>{}}});
  }
  j["tiers"] = tiers;
  j["occupancy_t_s"] = r.occupancy_t;
  j["wall_s"] = r.wall_s;
  j["metric_definitions"] = TimedMetricDefinitions();
  return j;
}

void PrintTimedTable(const TimedResult& r, std::FILE* out) {
  std::fprintf(out,
               "timed replay: %s on %u x %s (tp %u), policy %s, concurrency %u, %llu requests, "
               "%.1f s simulated (%.2f s wall)\n",
               r.model.c_str(), r.replicas, r.gpu.c_str(), r.tp, r.policy.c_str(), r.concurrency,
               static_cast<unsigned long long>(r.requests), r.makespan_s, r.wall_s);
  const double p = r.prompt_tokens ? static_cast<double>(r.prompt_tokens) : 1;
  std::fprintf(out,
               "prompt tokens: %.3f G; HBM hit %.1f%%, host %.1f%%, SSD %.1f%%, remote %.1f%%, "
               "recomputed %.1f%% (of which loadable %.1f%%); hit rate %.1f%% vs ideal %.1f%%\n",
               r.prompt_tokens / 1e9, 100 * r.hbm_tokens / p, 100 * r.host_tokens / p,
               100 * r.disk_tokens / p, 100 * r.remote_tokens / p, 100 * r.recomputed / p,
               100 * r.loadable_recomputed / p, 100 * r.hit_rate(), 100 * r.ideal_hit_rate);
  std::fprintf(out, "%-8s %9s %9s %9s %9s %9s\n", "latency", "mean", "p50", "p90", "p95", "p99");
  auto row = [&](const char* n, const Percentiles& q) {
    std::fprintf(out, "%-8s %9.3f %9.3f %9.3f %9.3f %9.3f\n", n, q.mean, q.p50, q.p90, q.p95,
                 q.p99);
  };
  row("TTFT s", r.ttft_s);
  row("TPOT s", r.tpot_s);
  row("ITL s", r.itl_s);
  row("E2E s", r.e2e_s);
  std::fprintf(out,
               "throughput per GPU: %.0f input tok/s (cached included), %.1f output tok/s, %.0f "
               "total; interactivity (1/ITL) p50 %.1f, p75 %.1f, p90 %.1f tok/s per user\n",
               r.input_tokens_per_s_per_gpu, r.output_tokens_per_s_per_gpu,
               r.total_tokens_per_s_per_gpu, r.interactivity_p50, r.interactivity_p75,
               r.interactivity);
  std::fprintf(out,
               "HBM hit %.1f%%, DRAM hit %.1f%% of all prompt tokens; live session trees %.1f "
               "(target %u); measured [%.0f s, +%.0f s)%s%s\n",
               100 * r.hbm_hit_share(), 100 * r.dram_hit_share(), r.live_trees_mean, r.concurrency,
               r.window_start_s, r.measured_s, r.agentx_rules ? "; AgentX rules" : "",
               r.dp > 1 ? (std::string("; dp ") + std::to_string(r.dp) +
                           (r.dp_round_robin ? " round-robin" : " affinity"))
                              .c_str()
                        : "");
  for (const auto& t : r.tiers) {
    std::fprintf(
        out, "tier %-6s capacity %10llu blocks, peak %10llu; loaded %8.2f GB, stored %8.2f GB\n",
        t.tier.c_str(), static_cast<unsigned long long>(t.capacity_blocks),
        static_cast<unsigned long long>(t.peak_blocks), t.load_bytes / 1e9, t.store_bytes / 1e9);
  }
  PrintDefinitions(TimedMetricDefinitions(), out);
}

std::string TimedCsv(const std::vector<TimedResult>& runs) {
  std::string s =
      "gpu,model,policy,concurrency,replicas,tp,tiers,requests,prompt_tokens,hbm,host,disk,"
      "remote,recomputed,hit_rate,ideal_hit_rate,ttft_mean,ttft_p50,ttft_p90,ttft_p95,ttft_p99,"
      "tpot_mean,e2e_mean,input_tps_per_gpu,output_tps_per_gpu,interactivity_p90,"
      "interactivity_p50,interactivity_p75,total_tps_per_gpu,hbm_hit_share,dram_hit_share,"
      "live_trees,dp\n";
  for (const auto& r : runs) {
    std::string tiers;
    for (const auto& t : r.tiers) tiers += (tiers.empty() ? "" : "+") + t.tier;
    char b[1024];
    std::snprintf(
        b, sizeof b,
        "%s,%s,%s,%u,%u,%u,%s,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%.6f,%.4f,%.4f,%.4f,"
        "%.4f,%.4f,%.5f,%.4f,%.1f,%.2f,%.2f,%.2f,%.2f,%.1f,%.6f,%.6f,%.2f,%u\n",
        r.gpu.c_str(), r.model.c_str(), r.policy.c_str(), r.concurrency, r.replicas, r.tp,
        tiers.c_str(), static_cast<unsigned long long>(r.requests),
        static_cast<unsigned long long>(r.prompt_tokens),
        static_cast<unsigned long long>(r.hbm_tokens),
        static_cast<unsigned long long>(r.host_tokens),
        static_cast<unsigned long long>(r.disk_tokens),
        static_cast<unsigned long long>(r.remote_tokens),
        static_cast<unsigned long long>(r.recomputed), r.hit_rate(), r.ideal_hit_rate,
        r.ttft_s.mean, r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p95, r.ttft_s.p99, r.tpot_s.mean,
        r.e2e_s.mean, r.input_tokens_per_s_per_gpu, r.output_tokens_per_s_per_gpu, r.interactivity,
        r.interactivity_p50, r.interactivity_p75, r.total_tokens_per_s_per_gpu, r.hbm_hit_share(),
        r.dram_hit_share(), r.live_trees_mean, r.dp);
    s += b;
  }
  return s;
}

std::string TimedHtml(const std::vector<TimedResult>& runs, const std::string& title) {
  std::string body;
  const std::vector<PoolGroup> groups = PoolGroups(runs);
  body += Answer(groups);
  std::vector<std::string> labels;
  std::vector<std::array<double, 5>> splits;
  std::vector<double> ideal;
  for (const auto& r : runs) {
    const double p = r.prompt_tokens ? static_cast<double>(r.prompt_tokens) : 1;
    labels.push_back(RunLabel(r) +
                     (PoolMultiple(r) > 0 ? " pool " + Multiple(PoolMultiple(r)) : ""));
    splits.push_back({r.hbm_tokens / p, r.host_tokens / p, r.disk_tokens / p, r.remote_tokens / p,
                      r.recomputed / p});
    ideal.push_back(r.ideal_hit_rate);
  }
  // Pool-size sweep: hit rate vs host pool, one line per group, the knee marked.
  std::vector<Series> pool;
  std::vector<Mark> knees;
  for (const auto& g : groups) {
    if (g.runs.size() < 2) continue;
    Series se{g.label, {}, false, true};
    for (const TimedResult* r : g.runs)
      se.points.emplace_back(PoolMultiple(*r), 100 * r->hit_rate());
    if (g.knee >= 0) {
      knees.push_back({PoolMultiple(*g.runs[g.knee]), "knee " + g.label.substr(g.label.find("C=")) +
                                                          ": " +
                                                          Multiple(PoolMultiple(*g.runs[g.knee]))});
    }
    pool.push_back(std::move(se));
  }
  if (!pool.empty()) {
    body += "<h2>How big a host pool</h2>";
    body +=
        Chart("Hit rate vs host pool (knee: one more step adds < 1 point)",
              "host pool (x HBM KV capacity)", "hit rate (% of prompt tokens)", pool, false, knees);
  }
  // Throughput per GPU vs interactivity with the Pareto frontier; offload points haloed.
  std::vector<std::pair<double, double>> pts;
  for (const auto& r : runs) pts.emplace_back(r.interactivity, r.total_tokens_per_s_per_gpu);
  Series front{"Pareto frontier", {}, false, true};
  front.dots = false;
  for (size_t i : ParetoFront(pts)) front.points.push_back(pts[i]);
  Series on{"offload", {}, true, false}, off{"HBM only", {}, false, false};
  for (size_t i = 0; i < runs.size(); ++i) {
    Series& se = runs[i].offload ? on : off;
    se.points.push_back(pts[i]);
    se.point_labels.push_back(
        "C=" + std::to_string(runs[i].concurrency) +
        (PoolMultiple(runs[i]) > 0 ? " " + Multiple(PoolMultiple(runs[i])) : ""));
  }
  std::vector<Series> tp;
  tp.push_back(front);
  if (!off.points.empty()) tp.push_back(off);
  if (!on.points.empty()) tp.push_back(on);
  body += "<h2>Throughput vs interactivity</h2>";
  body += Chart("Throughput per GPU vs interactivity (InferenceX definitions)",
                "interactivity: 1 / p90 ITL (tok/s per user)", "tokens/s per GPU (in + out)", tp);
  body += "<h2>Where prompt tokens came from</h2>";
  body += HitBars(labels, splits, ideal);
  // TTFT CDF per run (at most 6 runs drawn).
  std::vector<Series> cdf;
  for (size_t i = 0; i < runs.size() && cdf.size() < 6; ++i) {
    Series se{ShortLabel(runs[i]), {}, false, true};
    const auto& v = runs[i].ttft_samples;
    const size_t n = v.size();
    for (size_t k = 0; k < n; k += std::max<size_t>(1, n / 200)) {
      se.points.emplace_back(std::max(v[k], 1e-4), static_cast<double>(k + 1) / n);
    }
    if (n) se.points.emplace_back(std::max(v.back(), 1e-4), 1.0);
    se.dots = false;
    cdf.push_back(std::move(se));
  }
  body += "<h2>Time to first token</h2>";
  body += Chart(runs.size() > 6 ? "TTFT CDF (first 6 runs)" : "TTFT CDF", "TTFT (s, log scale)",
                "fraction of requests", cdf, /*log_x=*/true);
  body +=
      "<h2>Every run</h2><table><tr><th>run</th><th>hit</th><th>ideal</th><th>HBM hit</th>"
      "<th>DRAM hit</th><th>TTFT p50 s</th><th>TTFT p99 s</th><th>interactivity p90</th>"
      "<th>tok/s/GPU</th><th>live trees</th></tr>";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    body += "<tr><td style='text-align:left'>" + Esc(labels[i]) + "</td><td>" +
            F(100 * r.hit_rate(), 1) + "%</td><td>" + F(100 * r.ideal_hit_rate, 1) + "%</td><td>" +
            F(100 * r.hbm_hit_share(), 1) + "%</td><td>" + F(100 * r.dram_hit_share(), 1) +
            "%</td><td>" + F(r.ttft_s.p50, 3) + "</td><td>" + F(r.ttft_s.p99, 3) + "</td><td>" +
            F(r.interactivity, 1) + "</td><td>" + F(r.total_tokens_per_s_per_gpu, 0) + "</td><td>" +
            F(r.live_trees_mean, 1) + "</td></tr>";
  }
  body += "</table>";
  body += DefinitionsHtml(TimedMetricDefinitions());
  return Page(title, body);
}

std::string CacheCompareHtml(const CacheCompareResult& r, const std::string& title) {
  std::vector<std::string> labels;
  std::vector<std::array<double, 5>> splits;
  std::vector<double> ideal;
  auto add = [&](const CacheReplayResult& p) {
    labels.push_back(p.policy);
    splits.push_back({p.hit_rate(), 0, 0, 0, 1 - p.hit_rate()});
    ideal.push_back(r.ideal.hit_rate());
  };
  if (r.min) add(*r.min);
  for (const auto& p : r.policies) add(p);
  std::string body =
      "<p>" + std::to_string(r.stats.requests) + " requests, capacity " +
      std::to_string(r.capacity_tokens) + " tokens (" +
      F(r.stats.live_context_mean_tokens > 0 ? r.capacity_tokens / r.stats.live_context_mean_tokens
                                             : 0) +
      "x mean live context); cache hits drawn as HBM.</p>";
  body += HitBars(labels, splits, ideal);
  body += DefinitionsHtml(CacheMetricDefinitions());
  return Page(title, body);
}

}  // namespace kvtier::sim
