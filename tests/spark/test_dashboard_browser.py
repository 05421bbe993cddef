"""The dashboard as an operator sees it: in headless Chromium, charts counted, screenshot kept.

Chromium is required, not optional: CI installs Debian's ``chromium``; if it
is missing this test fails (it is never skipped).  The screenshot and the
page are kept in ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from spark_analysis import failover_dashboard, render, synthetic

pytestmark = pytest.mark.spark

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WINDOW = (1400, 3000)
CHART = '<svg class="chart"'
NEMESIS_ROUNDS = 9  # three of them fail the checker: INVALID, MISMATCH, NO VERDICT
CHARTS_EXPECTED = 4 * 3 + 2 + 1
"""Per fault type (kill9, sigstop, sigterm, nemesis): stacked phases, box plot, histogram;
2 dip curves; the injections per fault type."""


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed for this test and was not found: "
                "install Debian's package (apt-get install -y chromium)")


def run_chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}", *args,
    ]
    done = subprocess.run(command, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


@pytest.fixture(scope="module")
def dashboard(spark, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("dashboard")
    rounds = synthetic.generate_rounds(2 * len(synthetic.DEFAULT_CONFIGS), seed=5, lossy_every=9)
    paths = synthetic.write_traces(rounds, base / "traces")
    with paths[-1].open("a") as f:
        f.write('{"round": "syn-000047", "t": 1700002830.0, "event": "acks", "k": 1\n')
    synthetic.write_traces(synthetic.generate_nemesis_rounds(NEMESIS_ROUNDS, seed=5),
                           base / "traces")
    result = failover_dashboard.run(str(base / "traces"), base / "out", spark=spark)
    assert (result.rounds, result.rejected_rounds, result.malformed_lines) == (56, 1, 1)
    assert (result.nemesis_rounds, result.failing_nemesis_rounds) == (NEMESIS_ROUNDS, 3)
    return result.html


def test_outputs_for_other_tools(dashboard):
    import pyarrow.parquet as pq

    table = pq.read_table(dashboard.parent / "summary.parquet")
    assert table.num_rows == 56
    csv_lines = (dashboard.parent / "summary.csv").read_text().splitlines()
    assert len(csv_lines) == 57 and csv_lines[0].startswith("round,file,fault,")
    assert table.column_names == csv_lines[0].split(",")
    nemesis_lines = (dashboard.parent / "nemesis.csv").read_text().splitlines()
    assert len(nemesis_lines) == 1 + NEMESIS_ROUNDS and nemesis_lines[0].startswith("round,file,")
    fault_types = (dashboard.parent / "fault_types.csv").read_text().splitlines()
    assert fault_types[0].startswith("fault_type,role,injected,rounds,")
    assert {line.split(",")[0] for line in fault_types[1:]} >= {"kill9", "sigstop", "sigterm"}


def test_page_has_every_section_and_needs_no_network(dashboard):
    html = dashboard.read_text()
    for section, title in render.SECTIONS:
        assert f'<section id="{section}"><h2>{title}</h2>' in html
    assert "<script" not in html and "<link" not in html and " src=" not in html
    assert set(re.findall(r"https?://[^\"' )]+", html)) == {"http://www.w3.org/2000/svg"}
    assert 'id="lost-alert"' in html  # lossy rounds are shown in red
    assert '<div class="alert red" id="nemesis-alert">' in html  # so are failing nemesis rounds
    assert html.count(CHART) == CHARTS_EXPECTED


def _png_size_and_ink(png: bytes) -> tuple[tuple[int, int], float]:
    """(width, height) and the share of non-white bytes in the decoded scanlines."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    data, pos = b"", 8
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(data)
    return (width, height), sum(1 for b in raw[::97] if b != 0xFF) / len(raw[::97])


def test_headless_chromium_renders_the_charts(dashboard, tmp_path):
    url = dashboard.resolve().as_uri()
    dom = run_chromium(tmp_path / "profile-dom", "--dump-dom", url).stdout.decode()
    assert dom.count(CHART) == CHARTS_EXPECTED
    assert dom.count('class="segment"') >= 5 * 25  # 5 phases x 25 configurations
    assert dom.count('class="box"') == 25
    assert dom.count('class="series"') == 2
    assert "Failover dashboard" in dom
    nemesis = dom[dom.index('<section id="nemesis">'):dom.index('<section id="fault-types">')]
    assert nemesis.count('<tr class="bad">') == 3  # the failing rounds, marked
    assert "<h3>Failing rounds</h3>" in nemesis

    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / "dashboard.png"
    png.unlink(missing_ok=True)
    shutil.copy(dashboard, ARTIFACTS / "dashboard.html")
    run_chromium(tmp_path / "profile-shot", f"--screenshot={png}",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", url)
    size, ink = _png_size_and_ink(png.read_bytes())
    assert size == WINDOW
    assert ink > 0.02, "the screenshot is (almost) blank"

