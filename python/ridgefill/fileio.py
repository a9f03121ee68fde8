"""Atomic file writes (a failed or interrupted write never replaces an existing file; a full disk raises
:class:`~ridgefill.errors.WriteError` naming the bytes needed and where) and a lock for writing files that
belong together."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Union

from .errors import WriteError


#: What a write takes: the file's bytes, or a function that writes the file at the path it is given.
Payload = Union[bytes, Callable[[str], None]]


def atomic_write(path: str | os.PathLike, data: Payload) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it onto ``path``.

    ``data`` is the file's bytes, or ``write(tmp_path)``, a function that writes the file. The file gets
    the permissions a plain ``open`` would give (``0666`` less the umask). The parent folder is created if
    needed. If the write fails, the temporary file is removed and ``path`` is left as it was.

    Raises:
        WriteError: the folder cannot be created or the file cannot be written (a full disk, no permission);
            the message names the file, the bytes needed and the bytes free there. Raised before anything is
            written when ``data`` is bytes and the folder has less room than they need.
    """
    return atomic_write_all([(path, data)])[0]


def _free(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _size(n: int | None) -> str:
    return "an unknown number of bytes" if n is None else f"{n:,} bytes"


def _write_error(path: Path, needed: int | None, e: OSError | None) -> WriteError:
    free = _free(path.parent) if path.parent.is_dir() else None
    why = ("no space left on device" if e is None or e.errno in (errno.ENOSPC, errno.EDQUOT)
           else f"{type(e).__name__}: {e.strerror or e}")
    return WriteError(f"cannot write {str(path)!r} ({why}): the write needs {_size(needed)} in its folder "
                      f"{str(path.parent)!r}, which has {_size(free)} free; free some space there or write to "
                      "another folder (nothing at that path was replaced)", str(path), needed, free)


def atomic_write_all(writes: list[tuple[str | os.PathLike, Payload]]) -> list[Path]:
    """:func:`atomic_write` for files that belong together: every payload goes to its own temporary
    file first; only when all have succeeded are they renamed onto their paths, in order. If any write
    fails, no path is touched and every temporary file is removed. Where every payload is bytes, the
    room they need together is checked in each folder before anything is written.

    Raises:
        WriteError: as :func:`atomic_write`, for the first file that fails.
    """
    writes = [(Path(path), data) for path, data in writes]
    for path, _ in writes:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _write_error(path, None, e) from e
    need: dict[Path, int] = {}
    for path, data in writes:
        if isinstance(data, (bytes, bytearray, memoryview)):
            need[path.parent] = need.get(path.parent, 0) + len(data)
    for path, data in writes:  # before anything is written: does every folder have room?
        free = _free(path.parent)
        if path.parent in need and free is not None and need[path.parent] > free:
            raise _write_error(path, need[path.parent], None)
    done: list[tuple[Path, str]] = []
    try:
        for path, data in writes:
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            except OSError as e:
                raise _write_error(path, need.get(path.parent), e) from e
            done.append((path, tmp))
            try:
                os.close(fd)
                if callable(data):
                    data(tmp)
                else:
                    with open(tmp, "wb") as fh:
                        _write_bytes(fh, data)
            except OSError as e:
                if isinstance(e, WriteError):
                    raise
                raise _write_error(path, need.get(path.parent), e) from e
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


def _write_bytes(fh, data: bytes) -> None:
    """Write ``data`` to the open file ``fh`` and flush it to the disk (a full disk shows here, not later)."""
    fh.write(data)
    fh.flush()
    os.fsync(fh.fileno())


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    return atomic_write(path, text.encode("utf-8"))


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, remove: bool = False) -> Iterator[None]:
    """Hold an exclusive advisory lock (``fcntl.flock``) on the lock file ``path`` while the block runs.

    Writers of files that belong together (a maps file and its statistics) take the same lock, so two
    processes cannot interleave their writes. The lock file is created if needed. With ``remove``, the
    holder deletes it before letting go, so nothing is left beside the files it guards; this stays safe
    because every taker, once it holds the lock, checks that ``path`` is still the file it locked (same
    device and inode) and starts again on the new file otherwise: a process that waited on a file removed
    meanwhile never runs beside one that locked its successor. Where ``fcntl`` is unavailable (not POSIX)
    this is a no-op.
    """
    path = Path(path)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = open(path, "a+b")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            held = os.fstat(fh.fileno())
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                break
        except BaseException:
            fh.close()
            raise
        fh.close()  # removed or replaced while this process waited: lock the file now at path
    try:
        yield
    finally:
        try:
            if remove:
                path.unlink(missing_ok=True)
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()
