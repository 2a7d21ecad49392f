"""Starts and stops a real `kvtier serve` for the tests, on a private socket, by PID."""

import os
import signal
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def kvtier_bin() -> str:
    """$KVTIER_BIN, else the CLI of a build tree in this checkout; skips the test without one."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        return env
    for build in ("ci-release", "release", "dev"):
        path = os.path.join(ROOT, "build", build, "tools", "kvtier", "kvtier")
        if os.access(path, os.X_OK):
            return path
    pytest.skip("no kvtier binary to run `kvtier serve`: build kvtier-cli (cmake) or set "
                "KVTIER_BIN")


class Daemon:
    """`kvtier serve --config <dir>/serve.yaml --socket <dir>/kv.sock`, its log in <dir>."""

    def __init__(self, directory, layout_yaml: str, disk_dir: str | None = None):
        self.dir = str(directory)
        self.socket = os.path.join(self.dir, "kv.sock")
        self.config = os.path.join(self.dir, "serve.yaml")
        self.log_path = os.path.join(self.dir, "serve.log")
        tiers = "  - {kind: host, capacity: 64MiB}\n"
        if disk_dir:
            tiers += f"  - {{kind: disk, capacity: 256MiB, params: {{path: {disk_dir}}}}}\n"
        with open(self.config, "w") as f:
            f.write(f"layout: {layout_yaml}\ntiers:\n{tiers}")
        self.proc = None

    def start(self, timeout_s: float = 30.0) -> "Daemon":
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([kvtier_bin(), "serve", "--config", self.config, "--socket",
                                      self.socket], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"kvtier serve did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    def stop(self) -> int:
        """SIGTERM (drain) and its exit status."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=60)
            self.proc = None

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()
