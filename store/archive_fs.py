"""The archive's files: run ids that are safe folder names, deletes confined to the archive
root, and fsync so that a rename or a delete of rows happens only after the data is durable.

A run id comes from the `runs` table, which a merged or hand-edited database can fill with
anything; it becomes a path component, so `.`, `..`, separators and leading dots are refused
by a strict pattern, and every delete checks that its target resolves strictly inside the root
(a second line of defence: a symlinked folder, a pattern that someday widens).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

# Letters, digits, '_' and '-', starting with a letter or digit; no '.', so neither '.' nor '..'
# nor a '.partial' suffix can be a run id. What Runner makes: 20261203-183808-1a2b3c.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class UnsafePath(ValueError):
    """A run id that is not a safe folder name, or a path that leaves the archive root."""


def checked_id(run_id) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise UnsafePath(f"run id {run_id!r} is not a safe folder name: allowed 1 to 128 of "
                         "letters, digits, '_' and '-', starting with a letter or digit")
    return run_id


def inside(root: Path, path: Path) -> Path:
    """`path` resolved, if it lies strictly inside `root` (resolved); else UnsafePath."""
    real_root = root.resolve()
    real = path.resolve()
    if real == real_root or real_root not in real.parents:
        raise UnsafePath(f"{path} is not inside the archive folder {real_root}")
    return real


def remove_tree(root: Path, path: Path, missing_ok: bool = True) -> None:
    """rmtree, only strictly inside `root`. A symlink is unlinked, never followed."""
    if path.is_symlink():
        parent = path.parent.resolve()
        if parent != root.resolve():
            inside(root, parent)  # the link's own folder, at least, must be ours
        path.unlink()
        return
    if not path.exists():
        if missing_ok:
            return
        raise FileNotFoundError(path)
    shutil.rmtree(inside(root, path))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a created file, a rename) durable; POSIX needs the folder's
    own fsync for that. Platforms that cannot open a folder skip it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_rename(partial: Path, final: Path) -> None:
    """Files of `partial` to disk, the folder renamed to `final`, the rename to disk."""
    for file in partial.iterdir():
        fsync_file(file)
    fsync_dir(partial)
    partial.rename(final)
    fsync_dir(final.parent)
