"""Single-file Parquet and CSV exports of collected results, for other tools.

Why not Spark's writers: they write a directory of part files per table,
which spreadsheet users and quick scripts trip over; the summary of even
100,000 rounds is small enough to write from the driver in one file.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

_ARROW_TYPES: dict[type[DataType], pa.DataType] = {
    StringType: pa.string(),
    DoubleType: pa.float64(),
    LongType: pa.int64(),
    IntegerType: pa.int32(),
    BooleanType: pa.bool_(),
}


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of a flat Spark schema of the types the summary uses."""
    return pa.schema([pa.field(f.name, _ARROW_TYPES[type(f.dataType)]) for f in schema.fields])


def write_parquet(rows: Sequence[Mapping[str, object]], schema: StructType, path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(list(rows), schema=arrow_schema(schema)), path)


def write_csv(rows: Sequence[Mapping[str, object]], columns: Sequence[str], path: Path) -> None:
    """CSV with a header line; nulls are empty cells, floats written with repr precision."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row[c] is None else row[c] for c in columns])
