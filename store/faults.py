"""Tell a storage failure (the disk, the file, the database itself) from a bad row.

The writer retries a failed batch row by row to find the one bad row; that is right for a bad
row and wrong when the store itself fails, where every row fails at ~12 ms each and the writer
falls behind the producer. DuckDB raises a full disk as a TransactionException ("Failed to
commit: Could not write file ...: File too large") or an IOException, so the type alone does
not tell: the message is read too.
"""

from __future__ import annotations

import duckdb

# Lower-case fragments of DuckDB's and the OS's messages for a store that cannot write.
STORAGE_MESSAGES = ("could not write file", "could not read file", "no space left",
                    "file too large", "disk full", "disk is full", "i/o error",
                    "input/output error", "database has been invalidated", "read-only file",
                    "permission denied", "could not fsync", "could not truncate",
                    "could not open file")


def is_storage_failure(exc: BaseException) -> bool:
    """True when `exc` says the store cannot write at all (not that one row is bad)."""
    if isinstance(exc, (OSError, duckdb.IOException, duckdb.FatalException)):
        return True
    text = str(exc).lower()
    return any(fragment in text for fragment in STORAGE_MESSAGES)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
