"""Atomic file writes: a failed or interrupted write never replaces an existing file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The file gets the permissions a plain ``open`` would give (``0666`` less the umask). The parent
    folder is created if needed. If ``write`` raises, the temporary file is removed and
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))
