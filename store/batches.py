"""A batch of rows (dicts) as a table DuckDB can scan: Arrow, or pandas where Arrow refuses.

Arrow because DuckDB scans an Arrow table without the GIL, where a DataFrame's scan takes it
back for its columns in every statement that reads the batch (the rows and their rollup
deltas: store/rollups.py). With DataFrames the writer thread held the GIL for much of each
batch, and the engine's loop thread, which stamps each frame's tokens as they come, waited
behind it (issue 39: benchmarks/writer_gil.py, benchmarks/frame_floor.py --profile).
"""

from __future__ import annotations

import logging

import pandas as pd
import pyarrow as pa

logger = logging.getLogger(__name__)

FRAME_SLICE = 2048  # rows per pandas call when a batch becomes a DataFrame (~5 ms of GIL)
# What Arrow refuses in a batch (mixed types in a column, an int past int64): that batch goes
# the pandas way, as every batch did before (the same rows in, the same rows stored).
_ARROW_REFUSALS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def batch_of(rows: list[dict]):
    """The rows as an Arrow table: the columns are every key any row has (first seen first),
    a missing key is NULL and NaN is NULL (as DuckDB reads a DataFrame's). One conversion per
    column, so the GIL is never held for a whole batch. A DataFrame (`frame`) where Arrow
    refuses the values."""
    try:
        columns = dict.fromkeys(key for row in rows for key in row)
        return pa.table({c: pa.array([row.get(c) for row in rows], from_pandas=True)
                         for c in columns})
    except _ARROW_REFUSALS as exc:
        logger.debug("a batch of %d rows Arrow refused (%s) is a DataFrame", len(rows), exc)
        return frame(rows)


def frame(rows: list[dict]) -> pd.DataFrame:
    """The rows as a DataFrame, built FRAME_SLICE rows at a time: one pandas call holds the
    GIL throughout (~2 µs a row), and the run's tick thread must not wait out 50k rows."""
    if len(rows) <= FRAME_SLICE:
        return pd.DataFrame(rows)
    return pd.concat([pd.DataFrame(rows[i:i + FRAME_SLICE])
                      for i in range(0, len(rows), FRAME_SLICE)], ignore_index=True)


def columns_of(batch) -> list[str]:
    """The column names of a batch from `batch_of`."""
    return list(batch.column_names if isinstance(batch, pa.Table) else batch.columns)
