"""The Live page's per-viewer cache of settled frame buckets, bounded in entries and bytes.

One entry per (run, bucket) a viewer looked at; its frames and session wall grow with the
run's sessions (26.5 MB for 2,000 sessions, ~1.3 GB at the 100k-session cap), so a viewer who
opens many runs, or one huge run, must not keep them all. Least recently used entries go
first; an entry larger than the whole budget is not kept at all (that run's refreshes scan
again, which is what they cost before the cache existed).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

logger = logging.getLogger(__name__)

MAX_ENTRIES = 4  # runs a viewer switches between (the live one and a few compared with it)
MAX_BYTES = 64 * 2**20  # per viewer: a few viewers of one console stay well under a GB


def _size(entry) -> int:
    """Bytes of an entry's DataFrames (deep: strings counted)."""
    total = 0
    for name in ("frames", "wall", "ticks", "ranks"):
        df = getattr(entry, name, None)
        if df is not None and not df.empty:
            total += int(df.memory_usage(index=True, deep=True).sum())
    return total


class LiveCache:
    """A dict-like LRU for views.live_data: `get(key)` and `cache[key] = entry`."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"cache bounds {max_entries} entries, {max_bytes} bytes must be ≥ 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._sizes: dict = {}

    def get(self, key, default=None):
        if key not in self._entries:
            return default
        self._entries.move_to_end(key)
        return self._entries[key]

    def __setitem__(self, key, entry) -> None:
        size = _size(entry)
        self.pop(key)
        if size > self.max_bytes:
            logger.debug("live cache: %s is %d bytes, over the %d budget: not kept", key, size,
                         self.max_bytes)
            return
        self._entries[key] = entry
        self._sizes[key] = size
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self.pop(oldest)

    def pop(self, key) -> None:
        self._entries.pop(key, None)
        self._sizes.pop(key, None)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())
