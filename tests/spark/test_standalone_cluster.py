"""The dashboard job on a real Spark standalone cluster gives what it gives on a local master.

A master and one worker are started from the pyspark distribution
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``)
on loopback, and stopped by PID.  The job runs twice on the same traces
(classic rounds of every fault, ``kill9-broker`` included, and nemesis
rounds): as the CLI runs it against the cluster, in a process of its own (one
SparkContext per process), and in this process on the tests' ``local[2]``
session (a second CLI process, with a JVM of its own, cost a quarter of the
test).  Every CSV it writes must be byte for byte the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from spark_analysis import synthetic
from spark_analysis import trace_schema as ts
from spark_analysis.failover_dashboard import run
from hastandby.testing.nodes import free_port

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 90.0
JOB_TIMEOUT = 300.0
OUTPUTS = ("summary.csv", "aggregates.csv", "fault_types.csv", "nemesis.csv", "problems.csv")


def _spark_env(log_dir: Path) -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(log_dir)}


def _start(name: str, args: list[str], log_dir: Path, ready: str) -> subprocess.Popen[bytes]:
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                                   stderr=subprocess.STDOUT, env=_spark_env(log_dir))
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if ready in log.read_text(errors="replace"):
            return process
        if process.poll() is not None:
            break
        time.sleep(0.2)
    _stop(process)
    raise AssertionError(f"spark {name} not ready ({ready!r}):\n{log.read_text(errors='replace')[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(_start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                         "--port", str(port), "--webui-port", str(free_port())],
                              logs, "I have been elected leader"))
        started.append(_start("worker", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                         "--webui-port", str(free_port()), "--cores", "2", "--memory", "2g",
                                         "--work-dir", str(logs / "work")],
                              logs, "Successfully registered with master"))
        yield url
    finally:
        for process in reversed(started):
            _stop(process)


def _dashboard(traces: Path, out: Path, master: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "spark_analysis.failover_dashboard", "--traces", str(traces), "--out", str(out),
         "--master", master],
        capture_output=True, text=True, timeout=JOB_TIMEOUT, env=_spark_env(out.parent))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_the_job_on_a_standalone_cluster_equals_the_local_one(master, spark, tmp_path):
    traces = tmp_path / "traces"
    classic = synthetic.generate_rounds(  # two rounds of each fault
        8, seed=11, configs=[synthetic.RoundConfig(fault, 2.0, 3, 200)
                             for fault in (*ts.FAULTS, ts.FAULT_KILL9_BROKER)])
    synthetic.write_traces(classic + synthetic.generate_nemesis_rounds(4, seed=5), traces)
    on_cluster = _dashboard(traces, tmp_path / "cluster", master)
    locally = run(str(traces), tmp_path / "local", spark=spark)
    assert "rounds" in on_cluster and locally.rounds > 0
    for name in OUTPUTS:
        assert (tmp_path / "cluster" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    page = (tmp_path / "cluster" / "dashboard.html").read_text()
    for fault in (*ts.FAULTS, ts.FAULT_KILL9_BROKER, ts.FAULT_NEMESIS):
        assert f"<h3>{fault}</h3>" in page, fault
