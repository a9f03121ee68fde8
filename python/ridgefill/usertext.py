"""The user's own text files (``--text FILE ...``): read as UTF-8, checked, named by their path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .errors import InputError


def read_text_file(path: str | os.PathLike) -> str:
    """The whole UTF-8 text of ``path``.

    Raises:
        InputError: the file does not exist, is not UTF-8, cannot be read, or holds only whitespace.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"text file {str(path)!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"text file {str(path)!r} is not UTF-8 text ({e}); convert it to UTF-8") from None
    except OSError as e:
        raise InputError(f"cannot read text file {str(path)!r}: {e}") from None
    if not text.strip():
        raise InputError(f"text file {str(path)!r} is empty: put plain text in it")
    return text


def read_text_files(paths: Sequence[str | os.PathLike]) -> dict[str, str]:
    """``{path as given: text}`` for every file (:func:`read_text_file`), in order.

    Raises:
        InputError: no path, a file given twice, or a file :func:`read_text_file` refuses.
    """
    if not paths:
        raise InputError("no text file given: pass at least one --text FILE")
    names = [str(p) for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"text file(s) {twice} given more than once: give each file once")
    return {n: read_text_file(n) for n in names}
