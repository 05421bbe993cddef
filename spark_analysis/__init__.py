"""Failover-timing dashboards from failover-benchmark traces, computed with PySpark.

Entry point: ``python -m spark_analysis.failover_dashboard`` (``docs/dashboards.md``);
the trace format is ``docs/failover-traces.md`` and ``trace_schema``.
"""
