"""Read trace files into Spark, keeping the file and line number of every line.

Why whole files: a malformed line must be reported by file and line number,
and Spark's line-oriented text reader loses line numbers once a file is
split.  Traces are one small file per round, so each is read whole
(``wholetext``) and split into numbered lines inside Spark.  Lines are parsed
against the explicit schema of :func:`trace_schema.spark_schema` (never
inferred); a line that is not a JSON object of that schema, or lacks a field
its event requires, is kept aside with the reason instead of being dropped.
The nemesis's fields (:func:`trace_schema.nemesis_spark_schema`) are parsed
only on the few lines of the events that carry them, so that many classic
rounds do not pay for them.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from spark_analysis import trace_schema as ts

CORRUPT = "_corrupt_record"
NEMESIS_CORRUPT = "_corrupt_nemesis_record"
NEMESIS_FIELDS = "_nemesis"
REASON = "reason"
FILE = "file"
LINE = "line"
TEXT_SHOWN = 200
"""Characters of a malformed line kept in the problem report."""


class NoTracesError(RuntimeError):
    """No trace file matched the given paths."""


@dataclass(frozen=True)
class Lines:
    """The parsed lines of all traces, split into usable events and malformed lines.

    ``events`` has columns ``file``, ``line`` and every schema field;
    ``malformed`` has ``file``, ``line``, ``reason`` and ``text``; there are
    ``malformed_count`` of them.
    """

    events: DataFrame
    malformed: DataFrame
    malformed_count: int
    _cached: DataFrame

    def release(self) -> None:
        """Drop the cached parsed lines once every result has been collected."""
        self._cached.unpersist()


def roots_by_name_pattern(paths: Sequence[str]) -> dict[str, list[str]]:
    """Directories to list, grouped by the file-name pattern to keep from them.

    A path whose last part is a wildcard pattern ending in ``.jsonl``
    (``traces/*.jsonl``) is a pattern on file names under the directories
    the rest matches; any other path (a directory, a glob of directories, a
    file) keeps the ``*.jsonl`` files below it.  Why: Spark lists a
    directory in one go but checks every file a glob matches one by one,
    which takes ~20 s for 10,000 traces.
    """
    roots: dict[str, list[str]] = {}
    for path in paths:
        head, tail = posixpath.split(path.rstrip("/"))
        if head and tail.endswith(ts.TRACE_SUFFIX) and any(w in tail for w in "*?[{"):
            roots.setdefault(tail, []).append(head)
        else:
            roots.setdefault(f"*{ts.TRACE_SUFFIX}", []).append(path)
    return roots


def read_lines(spark: SparkSession, paths: Sequence[str]) -> Lines:
    """Read the trace files at ``paths`` (directories, searched recursively, or globs)."""
    files = []
    try:
        for pattern, roots in roots_by_name_pattern(paths).items():
            files.append(
                spark.read.option("pathGlobFilter", pattern)
                .option("recursiveFileLookup", True)
                .text(roots, wholetext=True)
            )
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            raise NoTracesError(f"no trace files at {', '.join(paths)}") from exc
        raise
    raw = functools.reduce(DataFrame.unionAll, files)
    numbered = raw.select(
        F.regexp_replace("_metadata.file_path", "^file:(//)?", "").alias(FILE),
        F.posexplode(F.split("value", "\r?\n")).alias("pos", "text"),
    ).where(F.trim("text") != "")
    options = {"mode": "PERMISSIVE", "allowNonNumericNumbers": "false"}
    schema = StructType(ts.spark_schema(with_nemesis=False).fields
                        + [StructField(CORRUPT, StringType())])
    nemesis_fields = ts.nemesis_spark_schema().fieldNames()
    nemesis_schema = StructType(ts.nemesis_spark_schema().fields
                                + [StructField(NEMESIS_CORRUPT, StringType())])
    parsed = numbered.select(
        FILE,
        (F.col("pos") + 1).alias(LINE),
        "text",
        F.from_json("text", schema, {**options, "columnNameOfCorruptRecord": CORRUPT}).alias("j"),
    ).select(FILE, LINE, "text", "j.*")
    parsed = parsed.select("*", F.when(
        F.col(ts.EVENT).isin(*ts.NEMESIS_FIELD_EVENTS),
        F.from_json("text", nemesis_schema,
                    {**options, "columnNameOfCorruptRecord": NEMESIS_CORRUPT}),
    ).alias("x")).select("*", *[F.col(f"x.{name}").alias(name)
                                for name in nemesis_fields + [NEMESIS_CORRUPT]]).drop("x")
    reason = _malformation()
    core = [c for c in parsed.columns
            if c not in ("text", CORRUPT, NEMESIS_CORRUPT, *nemesis_fields)]
    # The nemesis's fields are cached as one struct, null on other lines: cheap to keep.
    checked = parsed.select(
        *core,
        F.when(F.col(ts.EVENT).isin(*ts.NEMESIS_FIELD_EVENTS),
               F.struct(*nemesis_fields)).alias(NEMESIS_FIELDS),
        reason.alias(REASON),
        F.when(reason.isNotNull(), F.substring("text", 1, TEXT_SHOWN)).alias("text"),
    ).persist()
    # One pass over the files fills the cache and counts; every later query reads the cache.
    counts = dict(checked.groupBy(F.col(REASON).isNull().alias("ok")).count().collect())
    if not counts:
        checked.unpersist()
        raise NoTracesError(f"no lines in *{ts.TRACE_SUFFIX} files at {', '.join(paths)}")
    events = checked.where(F.col(REASON).isNull()).select(
        *core, *[F.col(f"{NEMESIS_FIELDS}.{name}").alias(name) for name in nemesis_fields])
    malformed = checked.where(F.col(REASON).isNotNull()).select(FILE, LINE, REASON, "text")
    return Lines(events, malformed, counts.get(False, 0), checked)


def _malformation() -> Column:
    """Why a parsed line is unusable, or null if it is fine."""
    event = F.col(ts.EVENT)
    missing_by_event = F.lit(None).cast("string")
    for name, fields in ts.REQUIRED_FIELDS.items():
        missing = F.concat_ws(", ", *[F.when(F.col(f).isNull(), F.lit(f)) for f in fields])
        missing_by_event = F.when(
            (event == name) & (missing != ""), F.concat(F.lit(f"{name} lacks "), missing)
        ).otherwise(missing_by_event)
    return (
        F.when(F.col(CORRUPT).isNotNull() | F.col(NEMESIS_CORRUPT).isNotNull(),
               F.lit("not a JSON object of the trace schema"))
        .when(~F.rtrim("text").endswith("}"), F.lit("text after the JSON object"))
        .when(F.col(ts.ROUND).isNull(), F.lit("missing round"))
        .when(F.col(ts.T).isNull(), F.lit("missing t"))
        .when(event.isNull(), F.lit("missing event"))
        .when(
            (event == ts.ROUND_START) & (F.col(ts.SCHEMA) != ts.SCHEMA_VERSION),
            F.concat(F.lit("unsupported schema "), F.col(ts.SCHEMA).cast("string")),
        )
        .when(
            (event == ts.ACKS) & F.exists(ts.N, lambda c: c.isNull() | (c < 0)),
            F.lit("acks counts must be non-negative integers"),
        )
        .otherwise(missing_by_event)
    )
