"""Collects what scripts/test-vllm reports: each run's outcome and the measured figures."""

import json
import os

SUMMARY: dict = {}
_RUNS = {"test_run_a_reference": "A", "test_run_b_vllm_prefix_cache": "B",
         "test_run_c_kvtier_loads_turn2": "C", "test_run_d_new_process_from_ssd": "D",
         "test_run_e_corrupted_block_is_recomputed": "E", "test_run_f_daemon_killed": "F",
         "test_run_g_events_name_offloaded_blocks_as_vllm_does[inprocess]": "G",
         "test_run_g_events_name_offloaded_blocks_as_vllm_does[daemon]": "G",
         "test_run_h_eviction_between_schedule_and_load[held]": "H",
         "test_run_h_eviction_between_schedule_and_load[released]": "H"}
_OUTCOMES: dict = {}
_FAMILY_OUTCOMES: dict = {}


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1]
    if "test_vllm_models.py" in report.nodeid and (report.when == "call" or report.skipped):
        _FAMILY_OUTCOMES[name] = "skip" if report.skipped else "fail" if report.failed else "pass"
    if name not in _RUNS:
        return
    run = _RUNS[name]
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
        _OUTCOMES[run] = "skip: " + reason.removeprefix("Skipped: ")
    elif report.failed:
        _OUTCOMES[run] = "fail"
    elif report.when == "call":
        _OUTCOMES.setdefault(run, "pass")


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("KVTIER_VLLM_SUMMARY")
    if not path:
        return
    equal = SUMMARY.get("equal", {})
    doc = {"runs": {r: _OUTCOMES.get(r, "not run") for r in "ABCDEFGH"},
           "tokens_equal": len(equal) == 3 and all(equal.values()),
           "hit_tokens_vllm": SUMMARY.get("hit_tokens_vllm"),
           "hit_tokens_kvtier": SUMMARY.get("hit_tokens_kvtier"),
           "ttft_turn2_s": SUMMARY.get("ttft_turn2_s"),
           "events": SUMMARY.get("events"),
           "eviction_between_schedule_and_load":
               SUMMARY.get("eviction_between_schedule_and_load"),
           "miss_throughput_ratio": SUMMARY.get("miss_throughput_ratio"),
           "miss_rounds": SUMMARY.get("miss_rounds"),
           "miss_throughput_ratio_same_process": SUMMARY.get("miss_throughput_ratio_same_process"),
           "miss_rounds_same_process": SUMMARY.get("miss_rounds_same_process"),
           "miss_hook_share": SUMMARY.get("miss_hook_share"),
           "families": {"tests": _FAMILY_OUTCOMES, "bytes": SUMMARY.get("families")}}
    with open(path, "w") as f:
        json.dump(doc, f)
