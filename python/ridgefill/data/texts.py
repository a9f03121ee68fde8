"""The text RidgeFill ships and reads: the bundled novels, the technical calibration texts, the
calibration sets, and the user's own text files.

The six Jane Austen novels ship inside the package (``ridgefill/data/austen.json.xz``; provenance and
licences in ``data/README.md``). :data:`CALIBRATION_BOOKS` and :data:`EVALUATION_BOOKS` split them into
two disjoint sets, so maps are never evaluated on the text they were fitted on. Two technical calibration
texts ship too (``handbook.json.xz``, ``stdlib.json.xz``: :func:`load_technical_texts`), and
:func:`calibration_texts` gives the default calibration set, the ``"mix"`` of novels, handbook and stdlib.
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from ..errors import AssetError, InputError

__all__ = ["ALL_BOOKS", "CALIBRATION_BOOKS", "CALIBRATION_SETS", "DEFAULT_CALIBRATION_SET", "EVALUATION_BOOKS",
           "TECHNICAL_TEXTS", "calibration_set_of", "calibration_texts", "load_technical_texts", "load_texts",
           "read_text_file", "read_text_files", "technical_text_info", "text_hash", "text_sha256"]

# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------

#: Books whose text may be used to fit maps (about 775K SmolLM2 tokens).
CALIBRATION_BOOKS: tuple[str, ...] = ("Emma", "Mansfield Park", "Pride & Prejudice", "Sense & Sensibility")
#: Books held out for evaluation (about 222K SmolLM2 tokens); disjoint from :data:`CALIBRATION_BOOKS`.
EVALUATION_BOOKS: tuple[str, ...] = ("Persuasion", "Northanger Abbey")
#: All six titles, in the order they are stored (publication order).
ALL_BOOKS: tuple[str, ...] = ("Sense & Sensibility", "Pride & Prejudice", "Mansfield Park", "Emma",
                              "Northanger Abbey", "Persuasion")

_TEXT_FILE = "austen.json.xz"


@functools.lru_cache(maxsize=1)
def _read_texts() -> dict[str, str]:
    res = resources.files("ridgefill").joinpath("data", _TEXT_FILE)
    try:
        raw = res.read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise AssetError(
            f"the shipped text file ridgefill/data/{_TEXT_FILE} is missing ({exc}); reinstall ridgefill, "
            "or regenerate it with `python scripts/prepare_text.py` from a source checkout") from exc
    try:
        texts = json.loads(lzma.decompress(raw).decode("utf-8"))
    except (lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AssetError(
            f"the shipped text file ridgefill/data/{_TEXT_FILE} is corrupted ({exc}); reinstall ridgefill, "
            "or regenerate it with `python scripts/prepare_text.py`") from exc
    if not isinstance(texts, dict) or sorted(texts) != sorted(ALL_BOOKS) or not all(
            isinstance(t, str) and t for t in texts.values()):
        raise AssetError(
            f"ridgefill/data/{_TEXT_FILE} does not hold the six expected novels {list(ALL_BOOKS)}; "
            "regenerate it with `python scripts/prepare_text.py`")
    return texts


def load_texts() -> dict[str, str]:
    """Return the six shipped Austen novels as ``{title: text}``.

    Titles are those of :data:`ALL_BOOKS` (e.g. ``"Pride & Prejudice"``). Each text is the whole novel,
    paragraphs separated by ``"\\n\\n"`` and the lines of a paragraph joined with single spaces. The
    file is decompressed once per process (cached); each call returns a new dict, so callers may
    modify it freely.

    Raises:
        AssetError: the shipped file is missing or corrupted.
    """
    return dict(_read_texts())


# The technical calibration texts (scripts/prepare_calibration.py; data/README.md for provenance and licences)
TECHNICAL_TEXTS: tuple[str, ...] = ("handbook", "stdlib")
_TECHNICAL_FILES = {"handbook": "handbook.json.xz", "stdlib": "stdlib.json.xz"}
_TECHNICAL_KEYS = {"name", "title", "source", "licence", "text"}
#: The shipped calibration sets (:func:`calibration_texts`) and the default one.
CALIBRATION_SETS: tuple[str, ...] = ("mix", "novels")
DEFAULT_CALIBRATION_SET = "mix"


@functools.lru_cache(maxsize=None)
def _read_technical(name: str) -> dict[str, str]:
    file = _TECHNICAL_FILES[name]
    fix = "reinstall ridgefill, or regenerate it with `python scripts/prepare_calibration.py` from a source checkout"
    try:
        raw = resources.files("ridgefill").joinpath("data", file).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise AssetError(f"the shipped text file ridgefill/data/{file} is missing ({exc}); {fix}") from exc
    try:
        record = json.loads(lzma.decompress(raw).decode("utf-8"))
    except (lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AssetError(f"the shipped text file ridgefill/data/{file} is corrupted ({exc}); {fix}") from exc
    if (not isinstance(record, dict) or set(record) != _TECHNICAL_KEYS or record.get("name") != name
            or not all(isinstance(v, str) and v for v in record.values())):
        raise AssetError(f"ridgefill/data/{file} does not hold the expected record (keys "
                         f"{sorted(_TECHNICAL_KEYS)}, name {name!r}); {fix}")
    return record


def load_technical_texts() -> dict[str, str]:
    """Return the two shipped technical calibration texts as ``{"handbook": text, "stdlib": text}``.

    ``handbook``: *The Debian Administrator's Handbook* (Debian ``debian-handbook`` 11.20220922, English
    HTML as plain text; CC-BY-SA-3.0, Raphaël Hertzog and Roland Mas), about 1.14 M characters, 277 K
    SmolLM2 tokens. ``stdlib``: ten Python 3.11.7 standard-library modules (PSF-2.0), about 0.82 M
    characters, 202 K tokens. Neither overlaps the evaluation novels or the cross-domain evaluation
    texts. Provenance: ``ridgefill/data/README.md``; built by ``scripts/prepare_calibration.py``.

    Raises:
        AssetError: a shipped file is missing or corrupted.
    """
    return {name: _read_technical(name)["text"] for name in TECHNICAL_TEXTS}


def technical_text_info(name: str) -> dict[str, str]:
    """``{"name", "title", "source", "licence"}`` of a shipped technical text (``"handbook"`` or
    ``"stdlib"``). Raises :class:`AssetError` for another name or a bad file."""
    if name not in _TECHNICAL_FILES:
        raise AssetError(f"no shipped technical text {name!r}; the texts are {list(TECHNICAL_TEXTS)}")
    return {k: v for k, v in _read_technical(name).items() if k != "text"}


def calibration_texts(name: str = DEFAULT_CALIBRATION_SET) -> dict[str, str]:
    """The shipped calibration text of set ``name``, as ``{text name: text}`` for
    :func:`ridgefill.calibration.calibrate` (which takes chunks round-robin over the texts).

    - ``"mix"`` (the default): ``{"novels", "handbook", "stdlib"}``: the four :data:`CALIBRATION_BOOKS`
      joined into one text (``"\\n\\n"`` between them, in that order) and the two technical texts of
      :func:`load_technical_texts`. Three texts, so each domain gets a third of the chunks (64 chunks
      of 1,024 tokens: 22 novels, 21 handbook, 21 stdlib). These are the texts of the cross-domain
      measurement's ``mix32`` (docs/evaluate.md, "Cross-domain maps"), which cut the off-domain ΔNLL
      by about 0.1 nats/token on documentation and code at no measurable cost on the novels.
    - ``"novels"``: the earlier default, ``{title: text}`` of the four :data:`CALIBRATION_BOOKS`
      (reproduces the maps and figures measured before the mix).

    Every text is disjoint from :data:`EVALUATION_BOOKS`. Returns a new dict per call.

    Raises:
        InputError: an unknown ``name`` (the message lists :data:`CALIBRATION_SETS`).
        AssetError: a shipped file is missing or corrupted.
    """
    books = load_texts()
    if name == "novels":
        return {k: books[k] for k in CALIBRATION_BOOKS}
    if name == "mix":
        return {"novels": "\n\n".join(books[k] for k in CALIBRATION_BOOKS), **load_technical_texts()}
    raise InputError(f"unknown calibration set {name!r}: use one of {', '.join(CALIBRATION_SETS)}")


def calibration_set_of(meta: dict) -> str | None:
    """The shipped calibration set (:data:`CALIBRATION_SETS`) maps were fitted on, from their metadata's
    ``text_sha256`` (:func:`ridgefill.calibration.text_hash` of the texts in order); ``None`` for other
    text or no record."""

    digest = meta.get("text_sha256")
    if not isinstance(digest, str):
        return None
    for name in CALIBRATION_SETS:
        if digest == _set_hash(name):
            return name
    return None


@functools.lru_cache(maxsize=None)
def _set_hash(name: str) -> str:
    return text_hash(list(calibration_texts(name).values()))


def text_sha256(text: str) -> str:
    """Return the SHA-256 of ``text`` encoded as UTF-8, as 64 lowercase hex digits.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text_sha256 expects a str, got {type(text).__name__}")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_hash(texts: Sequence[str]) -> str:
    """SHA-256 (hex) of the calibration texts, in order, separated by NUL (the maps' ``text_sha256``)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


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
