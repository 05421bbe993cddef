"""A real, throw-away Prometheus server (Debian's ``prometheus``) scraping test nodes on loopback.

``PrometheusServer(tmp_path, targets)`` writes a configuration that scrapes
each ``HOST:PORT`` every second, starts the server on a free loopback port
with its data in ``tmp_path``, and ``query()`` asks its HTTP API
(``/api/v1/query``).  ``stop()`` (SIGTERM, then SIGKILL, by PID) always runs in
the fixture's teardown.  A missing binary fails the test with a message that
says how to get one (``scripts/setup`` installs it), as a missing etcd does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from hastandby.testing.nodes import free_port

PROMETHEUS_BINARY_ENV = "HASTANDBY_PROMETHEUS"
SCRAPE_INTERVAL = "1s"


class PrometheusUnavailable(RuntimeError):
    pass


def binary() -> str:
    path = os.environ.get(PROMETHEUS_BINARY_ENV) or shutil.which("prometheus")
    if not path:
        raise PrometheusUnavailable(
            "no prometheus binary: run scripts/setup (it installs the Debian package 'prometheus'), "
            f"or name one in ${PROMETHEUS_BINARY_ENV}")
    return path


class PrometheusServer:
    def __init__(self, directory: Path, targets: list[str]) -> None:
        self.directory = Path(directory) / "prometheus"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.directory / "prometheus.yml"
        # JSON is YAML: no YAML writer needed.
        self.config.write_text(json.dumps({
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                       "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": "hastandby", "static_configs": [{"targets": targets}]}],
        }, indent=2))
        self.log_path = self.directory / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> "PrometheusServer":
        command = [binary(), f"--config.file={self.config}", f"--storage.tsdb.path={self.directory / 'data'}",
                   f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {timeout}s:\n{self.log()}")

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            answer = json.load(reply)
        assert answer.get("status") == "success", answer
        return answer["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {...labels}, "value": [time, "text"]}, ...]."""
        data = self.api("query", query=expression)
        assert data["resultType"] == "vector", data
        return data["result"]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
