"""Starts and stops a real `kvtier serve` for the tests, on a private socket, by PID
(kvtier.bench.serve_daemon, which the comparison harness shares)."""

import os

import pytest

from kvtier.bench.serve_daemon import ServeDaemon, find_kvtier_bin

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def kvtier_bin() -> str:
    """$KVTIER_BIN, else the CLI of a build tree in this checkout; skips the test without one."""
    path = find_kvtier_bin(ROOT)
    if path is None:
        pytest.skip("no kvtier binary to run `kvtier serve`: build kvtier-cli (cmake) or set "
                    "KVTIER_BIN")
    return path


class Daemon(ServeDaemon):
    """A host tier (host_capacity, 64 MiB) and, with disk_dir, an SSD tier (256 MiB) below it."""

    def __init__(self, directory, layout_yaml: str, disk_dir: str | None = None,
                 host_capacity: str = "64MiB"):
        tiers = [f"{{kind: host, capacity: {host_capacity}}}"]
        if disk_dir:
            tiers.append(f"{{kind: disk, capacity: 256MiB, params: {{path: {disk_dir}}}}}")
        super().__init__("", directory, layout_yaml, tiers)

    def start(self, timeout_s: float = 30.0) -> "Daemon":
        self.binary = kvtier_bin()  # here, so a test that never starts it is not skipped
        try:
            return super().start(timeout_s)
        except RuntimeError as e:
            raise AssertionError(str(e)) from None
