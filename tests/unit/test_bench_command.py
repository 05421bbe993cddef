"""``hastandby bench`` without a checkout says so, and names the command to run in one; sys.path is left alone."""

from __future__ import annotations

import importlib.util
import sys

from click.testing import CliRunner

from hastandby import cli


def test_bench_without_benchmarks_or_a_checkout_says_it_needs_one(monkeypatch, tmp_path) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "benchmarks" else real_find_spec(name, *args))
    monkeypatch.setattr(cli, "_CHECKOUT", tmp_path)  # an installed package: no benchmarks/ beside it
    path_before = list(sys.path)

    result = CliRunner().invoke(cli.main, ["bench", "failover", "--rounds", "1"])

    assert result.exit_code == 1
    assert "needs a checkout of the hastandby repository" in result.output
    assert "python -m benchmarks.failover --rounds 1" in result.output
    assert sys.path == path_before
