"""A private `kvtier serve` for tests and benchmarks: its own folder, socket and log, started and
stopped by PID (never by name), with the CPU time and peak RSS it used."""

import os
import signal
import subprocess
import time


def find_kvtier_bin(root: str) -> str | None:
    """$KVTIER_BIN, else the CLI of a build tree under `root` (a checkout); None without one."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        return env
    for build in ("ci-release", "release", "rel", "dev"):
        path = os.path.join(root, "build", build, "tools", "kvtier", "kvtier")
        if os.access(path, os.X_OK):
            return path
    return None


def wait_rusage(proc: subprocess.Popen, timeout_s: float) -> dict:
    """Waits for `proc` (at most timeout_s, then SIGKILL) and returns its exit status, CPU
    seconds (user + system) and peak RSS in MiB, from wait4."""
    if proc.returncode is not None:  # already reaped (poll): no rusage left to read
        return {"rc": proc.returncode, "cpu_s": None, "peak_rss_mib": None}
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
            "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}


class ServeDaemon:
    """`kvtier serve --config <dir>/serve.yaml --socket <dir>/kv.sock`, its log in <dir>.

    tiers: YAML list items, e.g. ["{kind: host, capacity: 64MiB}"]."""

    def __init__(self, binary: str, directory, layout_yaml: str, tiers: list[str]):
        self.binary = binary
        self.dir = str(directory)
        self.socket = os.path.join(self.dir, "kv.sock")
        self.config = os.path.join(self.dir, "serve.yaml")
        self.log_path = os.path.join(self.dir, "serve.log")
        with open(self.config, "w") as f:
            f.write(f"layout: {layout_yaml}\ntiers:\n" + "".join(f"  - {t}\n" for t in tiers))
        self.proc = None
        self.usage: dict | None = None

    def start(self, timeout_s: float = 30.0) -> "ServeDaemon":
        """Starts it and waits for its socket; raises RuntimeError (with the log) on failure."""
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config,
                                          "--socket", self.socket], stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kvtier serve did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    def stop(self) -> int:
        """SIGTERM (drain) and its exit status; its CPU time and peak RSS go to self.usage."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        self.usage = wait_rusage(self.proc, 60)
        self.proc = None
        return self.usage["rc"]

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.usage = wait_rusage(self.proc, 60)
            self.proc = None

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()
