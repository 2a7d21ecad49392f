"""scripts/compare-vllm's report (python/kvtier/bench/compare_vllm.py runs the configurations):
each configuration's runs aggregated into compare.json's figures (medians, p99, spreads, paired
ratios to baseline and bound, per reused-prefix bucket), the table it prints, and compare.svg."""

import math
import statistics

# Reused-prefix buckets (tokens): name, lower bound.
BUCKETS = [("<512", 0), ("512-1K", 512), ("1K-2K", 1024), ("2K-4K", 2048), (">=4K", 4096)]


# ----------------------------------------------------------------------------------------------
# Aggregation.

def _pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 5)


def _bucket(prefix):
    name = BUCKETS[0][0]
    for b, lo in BUCKETS:
        if prefix >= lo:
            name = b
    return name


def _resumed(records):
    return [r for r in records if r["prefix_tokens"] > 0]


def _first(records):
    return [r for r in records if r["prefix_tokens"] == 0]


def _key(r):
    return (r["workload"], r["session"], r["turn"])


def _round_p50s(runs, select):
    return [_pct([r["ttft_s"] for r in run["records"] if select(r)], 0.5) for run in runs]


def _paired(runs, ref_runs, select):
    """Median over rounds of (this run's p50 / the reference's p50 in the same round)."""
    ratios = []
    for a, b in zip(runs, ref_runs):
        pa = _pct([r["ttft_s"] for r in a["records"] if select(r)], 0.5)
        pb = _pct([r["ttft_s"] for r in b["records"] if select(r)], 0.5)
        if pa and pb:
            ratios.append(pa / pb)
    return (round(statistics.median(ratios), 4), [round(x, 4) for x in ratios]) if ratios \
        else (None, [])


def _paired_turns(runs, ref_runs, select):
    """Median over every selected request of (its TTFT / the reference's same request's TTFT in
    the same round): each turn against the identical turn, so a bucket that mixes long and short
    turns, whose p50 jumps from one kind to the other between rounds, is still compared alike."""
    ratios = []
    for a, b in zip(runs, ref_runs):
        ref = {_key(r): r["ttft_s"] for r in b["records"]}
        for r in a["records"]:
            t = ref.get(_key(r))
            if select(r) and r["ttft_s"] and t:
                ratios.append(r["ttft_s"] / t)
    return round(statistics.median(ratios), 4) if ratios else None


def aggregate(results, errors, configs):
    base = results.get("baseline") or []
    bound = results.get("bound") or []
    base_out = {_key(r): r["out"] for r in base[0]["records"]} if base else {}
    out = {}
    for c in configs:
        runs = results.get(c) or []
        if c in errors or not runs:
            out[c] = {"error": errors.get(c, "did not run"), "tokens_equal": None,
                      "first_turn_ttft_s": None, "resumed_ttft_s": {}}
            continue
        recs = [r for run in runs for r in run["records"]]
        if base_out:
            equal = all(base_out.get(_key(r)) == r["out"] for r in recs)
        else:
            equal = None
        doc = {"error": None, "tokens_equal": equal, "rounds": len(runs)}
        firsts = _first(recs)
        doc["first_turn_ttft_s"] = {"p50": _pct([r["ttft_s"] for r in firsts], 0.5),
                                    "p99": _pct([r["ttft_s"] for r in firsts], 0.99),
                                    "n": len(firsts)}
        sel_first = (lambda r: r["prefix_tokens"] == 0)
        doc["first_turn_ttft_s"]["vs_baseline"], doc["first_turn_ttft_s"]["rounds_vs_baseline"] \
            = _paired(runs, base, sel_first) if c != "baseline" else (1.0, [])
        doc["first_turn_ttft_s"]["turns_vs_baseline"] = \
            _paired_turns(runs, base, sel_first) if c != "baseline" else 1.0
        buckets = {}
        for b, lo in BUCKETS:
            def sel(r, b=b):
                return r["prefix_tokens"] > 0 and _bucket(r["prefix_tokens"]) == b
            xs = [r for r in recs if sel(r)]
            if not xs:
                continue
            p50s = _round_p50s(runs, sel)
            vb, vb_rounds = _paired(runs, base, sel) if c != "baseline" else (1.0, [])
            vbound, _ = _paired(runs, bound, sel) if c != "bound" else (1.0, [])
            buckets[b] = {"p50": _pct([r["ttft_s"] for r in xs], 0.5),
                          "p99": _pct([r["ttft_s"] for r in xs], 0.99),
                          "min_prefix_tokens": min(r["prefix_tokens"] for r in xs),
                          "median_prefix_tokens": int(statistics.median(
                              r["prefix_tokens"] for r in xs)),
                          "n": len(xs), "round_p50_min": min(p for p in p50s if p is not None),
                          "round_p50_max": max(p for p in p50s if p is not None),
                          "vs_baseline": vb, "rounds_vs_baseline": vb_rounds,
                          "vs_bound": vbound,
                          "turns_vs_baseline": _paired_turns(runs, base, sel)
                          if c != "baseline" else 1.0,
                          "turns_vs_bound": _paired_turns(runs, bound, sel)
                          if c != "bound" else 1.0}
        doc["resumed_ttft_s"] = buckets
        miss = [run["miss_same_process"] for run in runs if run.get("miss_same_process")]
        ratios = [x for m in miss for x in m["ratios"]]
        if ratios:
            # Each no-reuse prompt with the connector on over one with it off, in one process.
            doc["miss_same_process"] = {
                "on_over_off_p50": round(statistics.median(ratios), 4), "pairs": len(ratios),
                "rounds": [m["on_over_off_p50"] for m in miss]}
        wl = {}
        for name in runs[0]["workloads"]:
            walls = [run["workloads"][name]["wall_s"] for run in runs]
            wl[name] = {"wall_s": round(statistics.median(walls), 3),
                        "wall_s_min": min(walls), "wall_s_max": max(walls),
                        "output_tokens_per_s": round(statistics.median(
                            run["workloads"][name]["output_tokens_per_s"] for run in runs), 2),
                        "prompt_tokens": runs[0]["workloads"][name]["prompt_tokens"]}
            if base and c != "baseline":
                ratios = [a["workloads"][name]["wall_s"] / b["workloads"][name]["wall_s"]
                          for a, b in zip(runs, base)]
                wl[name]["wall_vs_baseline"] = round(statistics.median(ratios), 4)
                wl[name]["rounds_wall_vs_baseline"] = [round(x, 4) for x in ratios]
        doc["workloads"] = wl
        tiers = {}
        for run in runs[:1]:
            by_tier = ((run.get("kvtier_stats") or {}).get("worker") or {}) \
                .get("connector", {}).get("by_tier") or {}
            for t, v in by_tier.items():
                tiers[t] = v.get("loaded_tokens")
        if tiers:
            doc["offload_tier_loaded_tokens_round0"] = tiers
        doc["vllm_cpu_s"] = statistics.median(run["cpu_s"] for run in runs)
        doc["vllm_peak_rss_mib"] = statistics.median(run["peak_rss_mib"] for run in runs)
        ds = [run["daemon"] for run in runs if run.get("daemon")]
        if ds:
            doc["daemon_cpu_s"] = statistics.median(d["cpu_s"] for d in ds)
            doc["daemon_peak_rss_mib"] = statistics.median(d["peak_rss_mib"] for d in ds)
        doc["run_elapsed_s"] = [run["elapsed_s"] for run in runs]
        doc["connector"] = runs[0].get("connector")
        if runs[0].get("env"):
            doc["env"] = runs[0]["env"]
        out[c] = doc
    return out


def table(configs):
    """The printed table: one row per configuration."""
    cols = [b for b, _ in BUCKETS]
    head = ["config", "first p50 (x base)", *[f"{b} p50/p99 (x base, x bound)" for b in cols],
            "no-reuse wall x base", "miss on/off", "equal"]
    rows = [head]
    for c, d in configs.items():
        if d.get("error"):
            rows.append([c, "skipped: " + d["error"][:110]])
            continue
        f = d["first_turn_ttft_s"]
        row = [c, f"{f['p50']:.3f}s ({f.get('turns_vs_baseline') or 1.0:.3f})"]
        for b in cols:
            x = d["resumed_ttft_s"].get(b)
            if not x:
                row.append("-")
                continue
            # Paired by turn (turns_vs_*); compare.json has the ratios of round p50s beside them.
            vb = f"{x['turns_vs_baseline']:.2f}" if x.get("turns_vs_baseline") else "-"
            vbd = f"{x['turns_vs_bound']:.2f}" if x.get("turns_vs_bound") else "-"
            row.append(f"{x['p50']:.3f}/{x['p99']:.3f} ({vb}, {vbd})")
        nr = d["workloads"].get("no_reuse", {})
        row.append(f"{nr.get('wall_vs_baseline', 1.0):.3f}" if nr else "-")
        m = d.get("miss_same_process")
        row.append(f"{m['on_over_off_p50']:.3f}" if m else "-")
        row.append(str(d["tokens_equal"]))
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# ----------------------------------------------------------------------------------------------
# The picture, an SVG written by hand: TTFT against reused-prefix length (log x).

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f"]


def svg(configs, path):
    series = []
    for i, (c, d) in enumerate(configs.items()):
        if d.get("error") or not d.get("resumed_ttft_s"):
            continue
        pts = sorted((v["median_prefix_tokens"], v["p50"], v["p99"])
                     for v in d["resumed_ttft_s"].values())
        series.append((c, COLORS[i % len(COLORS)], pts))
    W, H, L, R, T, B = 760, 440, 70, 190, 30, 50
    xs = [p[0] for _, _, pts in series for p in pts] or [100, 1000]
    ys = [p[k] for _, _, pts in series for p in pts for k in (1, 2) if p[k]] or [0.1, 1.0]
    x0, x1 = math.log10(max(1, min(xs)) / 1.3), math.log10(max(xs) * 1.3)
    # Log y too: the offloads' TTFTs are a tenth of the baseline's at long prefixes.
    y0, y1 = math.log10(min(ys) / 1.2), math.log10(max(ys) * 1.2)

    def X(v):
        return L + (math.log10(max(v, 1)) - x0) / (x1 - x0) * (W - L - R)

    def Y(v):
        return T + (1 - (math.log10(max(v, 1e-6)) - y0) / (y1 - y0)) * (H - T - B)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="18">TTFT of resumed turns against reused-prefix length '
         f'(p50 solid, p99 dashed)</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for v in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20):
        if not y0 <= math.log10(v) <= y1:
            continue
        o.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    for v in (128, 256, 512, 1024, 2048, 4096, 8192):
        if x0 <= math.log10(v) <= x1:
            o.append(f'<text x="{X(v):.1f}" y="{H - B + 16}" text-anchor="middle">{v}</text>')
            o.append(f'<line x1="{X(v):.1f}" y1="{T}" x2="{X(v):.1f}" y2="{H - B}" '
                     f'stroke="#eee"/>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">reused prefix '
             f'(tokens, bucket median)</text>')
    o.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
             f'text-anchor="middle">TTFT (s, log)</text>')
    for n, (c, col, pts) in enumerate(series):
        for idx, dash in ((1, ""), (2, ' stroke-dasharray="5,4"')):
            d = " ".join(f"{X(p[0]):.1f},{Y(p[idx]):.1f}" for p in pts)
            o.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2"{dash}/>')
        for p in pts:
            o.append(f'<circle cx="{X(p[0]):.1f}" cy="{Y(p[1]):.1f}" r="3" fill="{col}"/>')
        ly = T + 14 + 18 * n
        o.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 36}" y2="{ly - 4}" '
                 f'stroke="{col}" stroke-width="2"/>')
        o.append(f'<text x="{W - R + 42}" y="{ly}">{c}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
