"""Atomic file writes (a failed or interrupted write never replaces an existing file) and a lock for
writing files that belong together."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The file gets the permissions a plain ``open`` would give (``0666`` less the umask). The parent
    folder is created if needed. If ``write`` raises, the temporary file is removed and
    ``path`` is left as it was.
    """
    return atomic_write_all([(path, write)])[0]


def atomic_write_all(writes: list[tuple[str | os.PathLike, Callable[[str], None]]]) -> list[Path]:
    """:func:`atomic_write` for files that belong together: every ``write(tmp)`` runs on its own
    temporary file first; only when all have succeeded are they renamed onto their paths, in order. If
    any write raises, no path is touched and every temporary file is removed."""
    done: list[tuple[Path, str]] = []
    try:
        for path, write in writes:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            done.append((path, tmp))
            write(tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        for path, tmp in done:
            os.replace(tmp, path)
    except BaseException:
        for _, tmp in done:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [path for path, _ in done]


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock (``fcntl.flock``) on the lock file ``path`` while the block runs.

    Writers of files that belong together (a maps file and its statistics) take the same lock, so two
    processes cannot interleave their writes. The lock file is created if needed and left in place
    (removing it would race with a waiting process). Where ``fcntl`` is unavailable (not POSIX) this is a
    no-op.
    """
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
