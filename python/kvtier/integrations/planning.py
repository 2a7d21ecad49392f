"""An engine connector's load-vs-recompute decision, engine-neutral (no vLLM or torch import).

    model = CostModel("auto", block_tokens=128, block_bytes=..., tiers=[("host", "host"), ...],
                      profile_path=None)
    model.add_load("disk", blocks=8, nbytes=..., seconds=...)   # the connector's own loads
    model.add_step(tokens=512, pairs=..., seconds=...)          # the engine's forward passes
    decision = model.decide(prompt_tokens, resident_blocks, ["host", "host", "disk", ...])

The decision is kvtier's Planner (ChoosePrefix: load a head of the hit, compute the rest), the
cost model of `kvtier plan` and the timed replay, over a cost profile that starts from a
calibration file when one is given and is then learned on the running engine: each tier's fixed
cost and bandwidth from the loads the connector timed, the prefill coefficients from the
engine's steps (tokens computed and key tokens attended against the step's seconds). Without a
file, a tier with too few timed loads is loaded anyway (to learn it), and until the prefill rate
is known every hit is loaded (the connector's behaviour before the planner).
Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass

import kvtier

MODES = ("auto", "always-load", "never-load")
# Before a tier has been timed: (fixed seconds per load, bytes per second) by tier kind.
PRIOR_TIERS = {"host": (50e-6, 5e9), "disk": (300e-6, 1e9), "remote": (2e-3, 2e8)}
MIN_TIER_SAMPLES = 2  # timed loads before a tier's own figures replace its prior
MIN_STEP_SAMPLES = 8  # timed steps before the prefill fit is used, of which
MIN_PREFILL_SAMPLES = 4  # steps that computed a prompt (PREFILL_TOKENS tokens or more)
PREFILL_TOKENS = 32
WINDOW = 256  # most recent samples kept per tier and for the steps
REFIT_S = 0.5  # at most one refit per this many seconds


@dataclass
class Decision:
    load_blocks: int  # leading blocks of the hit to load; the rest is recomputed
    choice: str  # "load", "recompute", "split", or why it was not planned
    predicted_s: float = 0.0
    load_all_s: float = 0.0
    recompute_all_s: float = 0.0


def whole_or_none(d: Decision, n: int) -> Decision:
    """d for a hit that resumes only at its end (a model with state groups: no state inside it):
    a split becomes all n blocks or none, whichever the model prices cheaper."""
    if not 0 < d.load_blocks < n:
        return d
    load = d.load_all_s <= d.recompute_all_s
    return Decision(n if load else 0, "load" if load else "recompute",
                    min(d.load_all_s, d.recompute_all_s), d.load_all_s, d.recompute_all_s)


def _fit_line(samples) -> tuple[float, float] | None:
    """seconds = a + bytes / bw by least squares; (a, bw), or None without two distinct sizes."""
    n = len(samples)
    if n < 2:
        return None
    mx = sum(b for b, _ in samples) / n
    my = sum(s for _, s in samples) / n
    sxx = sum((b - mx) ** 2 for b, _ in samples)
    if sxx <= 0:
        return None
    slope = sum((b - mx) * (s - my) for b, s in samples) / sxx
    if slope <= 0:
        return None
    return max(0.0, my - slope * mx), 1.0 / slope


class CostModel:
    def __init__(self, mode: str, *, block_tokens: int, block_bytes: int,
                 tiers: list[tuple[str, str]], profile_path: str | None = None):
        """tiers: (name, kind) of the cache's tiers, in the cache's order (a lookup's source)."""
        if mode not in MODES:
            raise ValueError(f"planner: {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self._lock = threading.Lock()
        self._tiers = list(tiers)
        self._base = self._load_profile(profile_path, block_tokens, block_bytes)
        self._calibrated_prefill = profile_path is not None
        self._from_file = {t["name"] for t in self._base["tiers"]} if profile_path else set()
        self._loads: dict[str, deque] = {}
        self._steps: deque = deque(maxlen=WINDOW)
        self._planner: kvtier.Planner | None = None
        self._dirty = True
        self._fit_at = 0.0
        self.prefill_source = "file" if profile_path else "none"

    def _load_profile(self, path, block_tokens, block_bytes) -> dict:
        prof = {"version": 1, "machine": "", "model": "", "threads": 1,
                "block_tokens": block_tokens, "block_bytes": block_bytes,
                "prefill": {"fixed_s": 0.0, "per_token_s": 0.0, "per_token_context_s": 0.0},
                "load_fixed_s": 0.0, "tiers": []}
        if path:
            with open(path) as f:
                text = f.read()
            kvtier.Planner(text, path)  # refuses a bad file, naming it and the key
            prof = json.loads(text)
            if prof["block_tokens"] != block_tokens or prof["block_bytes"] != block_bytes:
                raise ValueError(
                    f"cost profile {path}: block_tokens {prof['block_tokens']} / block_bytes "
                    f"{prof['block_bytes']} differ from this cache's {block_tokens} / "
                    f"{block_bytes}: calibrate for this model and block size")
        named = {t["name"] for t in prof["tiers"]}
        for name, kind in self._tiers:
            if name not in named:
                lat, bw = PRIOR_TIERS.get(kind, PRIOR_TIERS["remote"])
                prof["tiers"].append({"name": name, "latency_s": lat, "bytes_per_s": bw})
        return prof

    # ----------------------------------------------------------------------------- samples

    def add_load(self, tier: str, blocks: int, nbytes: int, seconds: float) -> None:
        if blocks <= 0 or seconds <= 0:
            return
        with self._lock:
            self._loads.setdefault(tier, deque(maxlen=WINDOW)).append((nbytes, seconds))
            self._dirty = True

    def add_step(self, tokens: int, pairs: float, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            self._steps.append((float(tokens), float(pairs), seconds))
            self._dirty = True

    # ---------------------------------------------------------------------------- the model

    def _profile_locked(self) -> dict:
        prof = json.loads(json.dumps(self._base))
        for t in prof["tiers"]:
            fit = _fit_line(list(self._loads.get(t["name"], ())))
            if fit is not None:
                t["latency_s"], t["bytes_per_s"] = fit
            elif self._loads.get(t["name"]):
                # One size seen: keep the bandwidth, take the fixed cost from the timings.
                s = sorted(sec - b / t["bytes_per_s"] for b, sec in self._loads[t["name"]])
                t["latency_s"] = max(0.0, s[len(s) // 2])
        prefills = sum(1 for s in self._steps if s[0] >= PREFILL_TOKENS)
        if len(self._steps) >= MIN_STEP_SAMPLES and prefills >= MIN_PREFILL_SAMPLES:
            try:
                prof["prefill"] = kvtier.fit_prefill(list(self._steps))
                self.prefill_source = "learned"
                self._calibrated_prefill = True
            except kvtier.KvtierError:
                pass  # the steps do not determine it yet: keep the previous one
        return prof

    def planner(self) -> kvtier.Planner | None:
        with self._lock:
            now = time.monotonic()
            if self._planner is None or (self._dirty and now - self._fit_at >= REFIT_S):
                prof = self._profile_locked()
                self._base["prefill"] = prof["prefill"]
                self._dirty = False
                self._fit_at = now
                try:
                    self._planner = kvtier.Planner(json.dumps(prof), "learned profile")
                except kvtier.KvtierError:
                    self._planner = None
            return self._planner

    def profile_json(self) -> str | None:
        p = self.planner()
        return p.profile_json if p is not None else None

    def crossovers(self, max_tokens: int = 1 << 20) -> dict[str, int | None]:
        """Per tier, the prompt length from which loading everything beats recomputing."""
        p = self.planner()
        if p is None or not self._calibrated_prefill:
            return {}
        out = {}
        for name, _ in self._tiers:
            x = p.crossover_tokens(p.tier_index(name), max_tokens)
            out[name] = x or None
        return out

    def _unlearned(self, tier: str) -> bool:
        with self._lock:
            return tier not in self._from_file and len(self._loads.get(tier, ())) < MIN_TIER_SAMPLES

    def decide(self, prompt_tokens: int, resident_blocks: int, block_tiers: list[str]) -> Decision:
        """How many of the hit's leading blocks (block_tiers: the tier of each) to load."""
        n = len(block_tiers)
        if n == 0:
            return Decision(0, "none")
        if self.mode == "always-load":
            return Decision(n, "always-load")
        if self.mode == "never-load":
            return Decision(0, "never-load")
        # Learn before judging: a tier never timed is loaded.
        if any(self._unlearned(t) for t in set(block_tiers)):
            return Decision(n, "explore")
        p = self.planner()
        if p is None or not self._calibrated_prefill:
            return Decision(n, "uncalibrated")
        idx = [p.tier_index(t) for t in block_tiers]
        plan = p.choose_prefix(prompt_tokens, resident_blocks, idx)
        return Decision(plan.load_blocks, plan.choice, plan.predicted_s, plan.load_all_s,
                        plan.recompute_all_s)
