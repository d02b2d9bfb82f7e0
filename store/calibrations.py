"""Calibrations in the store: the newest one for an engine + model + machine + dtype."""

from __future__ import annotations


def latest(cur, engine: str, model: str, machine: str, dtype: str) -> dict | None:
    """The newest calibration row for this engine, model, machine and dtype (None: never
    calibrated; rows from before the ladder of periods have no dtype and never match)."""
    df = cur.execute(
        "SELECT * FROM calibrations WHERE engine = ? AND model = ? AND machine = ? "
        "AND dtype = ? AND periods IS NOT NULL ORDER BY calibrated_at DESC LIMIT 1",
        [engine, model, machine, dtype]).fetchdf()
    return None if df.empty else df.iloc[0].to_dict()


def save(store, row: dict) -> None:
    """Queue the row on the store's writer and wait until it is in the file."""
    store.writer.add("calibrations", row)
    store.writer.flush()
