"""One Spark session (``local[2]``, the job's own settings) for all spark tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark_analysis.failover_dashboard import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[2]")
    yield session
    session.stop()
