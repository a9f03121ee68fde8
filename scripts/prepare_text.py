#!/usr/bin/env python3
"""Regenerate the real text shipped with ridgefill.

Builds ``python/ridgefill/data/austen.json.xz`` (a JSON object mapping each
novel's title to its text) and ``python/ridgefill/data/README.md`` from the
Debian package ``r-cran-janeaustenr``, which carries the six Jane Austen
novels of the R package *janeaustenr* (Project Gutenberg public-domain texts)
as an R lazy-load database (``data/Rdata.rdb`` + ``data/Rdata.rdx``).

Only the Python standard library plus ``apt-get`` and ``dpkg-deb`` are needed;
the R serialisation format is parsed by the small reader below (no R, no
third-party parser).  Output is deterministic: re-running with the same
package version gives byte-identical files.

Usage::

    python scripts/prepare_text.py               # apt-get download, then build
    python scripts/prepare_text.py --deb FILE    # use an already downloaded .deb
    python scripts/prepare_text.py --check       # rebuild in memory, compare

Text preparation: each R object is a character vector of lines.  Blank lines
separate paragraphs; the lines of a paragraph are stripped and joined with
single spaces; paragraphs are joined with a blank line (``"\\n\\n"``).  Nothing
else is changed (Gutenberg's ``_underscore_`` italics, chapter headings and the
title lines are kept as they are).
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import json
import lzma
import os
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

DEB_PACKAGE = "r-cran-janeaustenr"
R_PACKAGE = "janeaustenr"
REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "python" / "ridgefill" / "data"
OUTPUT_NAME = "austen.json.xz"
#: Where scripts/prepare_calibration.py's part of data/README.md starts (this script writes the part before).
TECHNICAL_MARKER = "<!-- technical calibration texts: written by scripts/prepare_calibration.py -->"

# R object name -> title, in publication order.  The titles are those used by
# janeaustenr's own ``austen_books()`` function.
BOOKS: tuple[tuple[str, str], ...] = (
    ("sensesensibility", "Sense & Sensibility"),
    ("prideprejudice", "Pride & Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
)


class PrepareError(Exception):
    """A step of the preparation failed; the message says what to do."""


# --------------------------------------------------------------------------
# Minimal reader for R's XDR serialisation format (versions 2 and 3).
# It supports exactly the object types that occur in a lazy-load index and
# in character-vector data objects; anything else raises PrepareError.
# --------------------------------------------------------------------------

_NILVALUE_SXP = 254
_REFSXP = 255
_SYMSXP = 1
_LISTSXP = 2
_CHARSXP = 9
_LGLSXP = 10
_INTSXP = 13
_REALSXP = 14
_STRSXP = 16
_VECSXP = 19
_NA_INT = -(2**31)


class _RReader:
    """Decode one R-serialised object from bytes (XDR, version 2 or 3)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.refs: list[object] = []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def _bytes(self, n: int) -> bytes:
        b = self.data[self.pos : self.pos + n]
        if len(b) != n:
            raise PrepareError("truncated R serialised data")
        self.pos += n
        return b

    def read(self) -> object:
        if self._bytes(2) != b"X\n":
            raise PrepareError("R data is not in XDR serialisation format")
        version = self._int()
        self._int()  # R version that wrote it
        self._int()  # minimal R version to read it
        if version == 3:
            self._bytes(self._int())  # native encoding name
        elif version != 2:
            raise PrepareError(f"unsupported R serialisation version {version}")
        return self._item()

    def _length(self) -> int:
        n = self._int()
        if n == -1:  # long vector: two more ints
            hi, lo = self._int(), self._int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def _charsxp(self, levels: int) -> str | None:
        n = self._int()
        if n == -1:
            return None  # NA_character_
        raw = self._bytes(n)
        if levels & 4:  # LATIN1_MASK
            return raw.decode("latin-1")
        return raw.decode("utf-8")

    def _item(self) -> object:
        flags = self._int()
        sxp = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if sxp == _NILVALUE_SXP:
            return None
        if sxp == _REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            if not 1 <= idx <= len(self.refs):
                raise PrepareError(f"R data holds a reference to undefined object #{idx}")
            return self.refs[idx - 1]
        if sxp == _SYMSXP:
            name = self._item()  # a CHARSXP
            sym = ("symbol", name)
            self.refs.append(sym)
            return sym
        if sxp == _LISTSXP:  # pairlist -> list of (tag, value); attrs dropped
            out: list[tuple[str | None, object]] = []
            while True:
                if has_attr:
                    self._item()
                tag = self._item() if has_tag else None
                value = self._item()
                out.append((tag[1] if isinstance(tag, tuple) else None, value))
                flags = self._int()
                if flags & 0xFF == _NILVALUE_SXP:
                    return out
                if flags & 0xFF != _LISTSXP:
                    raise PrepareError("unsupported pairlist tail in R data")
                has_attr = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
        if sxp == _CHARSXP:
            return self._charsxp(levels)
        if sxp in (_LGLSXP, _INTSXP):
            n = self._length()
            vals = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
            value: object = [None if v == _NA_INT else v for v in vals]
        elif sxp == _REALSXP:
            n = self._length()
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif sxp == _STRSXP:
            n = self._length()
            strings = []
            for _ in range(n):
                cflags = self._int()
                if cflags & 0xFF != _CHARSXP:
                    raise PrepareError("character vector element is not a CHARSXP")
                strings.append(self._charsxp(cflags >> 12))
            value = strings
        elif sxp == _VECSXP:
            n = self._length()
            value = [self._item() for _ in range(n)]
        else:
            raise PrepareError(f"unsupported R object type {sxp} in R data")
        if has_attr:
            attrs = dict(self._item())  # pairlist of attributes
            names = attrs.get("names")
            if names is not None and isinstance(value, list):
                return dict(zip(names, value))
        return value


def _unserialize(data: bytes) -> object:
    return _RReader(data).read()


def _lazyload_entry(rdb: bytes, offset: int, length: int, compressed: int) -> bytes:
    """Decompress one entry of an R lazy-load .rdb file."""
    blob = rdb[offset : offset + length]
    (size,) = struct.unpack_from(">I", blob, 0)
    if compressed in (1, True):
        out = zlib.decompress(blob[4:])
    else:  # types 2 (bzip2) and 3 (xz) have a one-byte method marker
        method, payload = blob[4:5], blob[5:]
        if method == b"Z":
            out = zlib.decompress(payload)
        elif method == b"2":
            out = bz2.decompress(payload)
        elif method == b"X":
            out = lzma.decompress(payload)
        elif method == b"0":
            out = payload
        else:
            raise PrepareError(f"unknown lazy-load compression marker {method!r}")
    if len(out) != size:
        raise PrepareError("lazy-load entry has the wrong uncompressed size")
    return out


def read_lazyload_db(rdx_path: Path, rdb_path: Path) -> dict[str, object]:
    """Read every variable of an R lazy-load database (.rdx index + .rdb)."""
    index = _unserialize(gzip.decompress(rdx_path.read_bytes()))
    if not isinstance(index, dict) or "variables" not in index:
        raise PrepareError(f"{rdx_path.name} is not an R lazy-load index")
    compressed = index.get("compressed", [1])
    compressed = compressed[0] if isinstance(compressed, list) else compressed
    rdb = rdb_path.read_bytes()
    out = {}
    for name, (offset, length) in index["variables"].items():
        out[name] = _unserialize(_lazyload_entry(rdb, offset, length, compressed))
    return out


# --------------------------------------------------------------------------
# Text preparation
# --------------------------------------------------------------------------


def lines_to_text(lines: list[str | None]) -> str:
    """Join a character vector of lines into paragraphs separated by "\\n\\n"."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        stripped = (line or "").strip()
        if stripped:
            current.append(" ".join(stripped.split()))
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def build_from_tree(root: Path) -> dict[str, str]:
    """Build {title: text} from an extracted r-cran-janeaustenr package tree."""
    hits = sorted(root.glob(f"usr/lib/R/*/{R_PACKAGE}/data/Rdata.rdx"))
    if not hits:
        raise PrepareError(
            f"no {R_PACKAGE}/data/Rdata.rdx in the extracted package at {root}; "
            f"is this really {DEB_PACKAGE}?"
        )
    rdx = hits[0]
    objects = read_lazyload_db(rdx, rdx.with_suffix(".rdb"))
    texts = {}
    for obj_name, title in BOOKS:
        lines = objects.get(obj_name)
        if not isinstance(lines, list) or not all(
            isinstance(x, str) or x is None for x in lines
        ):
            raise PrepareError(f"R object {obj_name!r} is missing or not a character vector")
        texts[title] = lines_to_text(lines)
    return texts


def encode(texts: dict[str, str]) -> bytes:
    """Serialise {title: text} deterministically: UTF-8 JSON, xz preset 9."""
    payload = json.dumps(texts, ensure_ascii=False, indent=0).encode("utf-8") + b"\n"
    return lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


def deb_version(deb: Path) -> str:
    """Return the Version field of a .deb file."""
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()


def download_deb(workdir: Path) -> Path:
    """apt-get download the package into workdir and return the .deb path."""
    os.chmod(workdir, 0o755)  # lets apt's sandbox user write there
    print(f"downloading {DEB_PACKAGE} with apt-get ...", file=sys.stderr)
    proc = subprocess.run(
        ["apt-get", "download", DEB_PACKAGE], check=False, cwd=workdir, capture_output=True, text=True
    )
    debs = sorted(workdir.glob(f"{DEB_PACKAGE}_*.deb"))
    if proc.returncode != 0 or not debs:
        raise PrepareError(
            f"`apt-get download {DEB_PACKAGE}` failed:\n{proc.stderr.strip()}\n"
            "Run `apt-get update` (as root) and try again, or download the .deb "
            "some other way and pass it with --deb FILE."
        )
    return debs[0]


def readme(texts: dict[str, str], version: str, blob: bytes) -> str:
    """Render data/README.md for the shipped file."""
    rows = "\n".join(
        f"| {title} | {'calibration' if title not in ('Persuasion', 'Northanger Abbey') else 'evaluation'} "
        f"| {len(text):,} | {text.count(chr(10) * 2) + 1:,} |"
        for title, text in texts.items()
    )
    total = sum(len(t) for t in texts.values())
    return f"""# Shipped text: the six Jane Austen novels

`{OUTPUT_NAME}` is an xz-compressed UTF-8 JSON object mapping each novel's
title to its full text. Load it with `ridgefill.data.texts.load_texts()`.

## Provenance

- Debian package `{DEB_PACKAGE}`, version `{version}`, which packages
- the R package `{R_PACKAGE}` (Julia Silge; CRAN), whose data objects are
- the Project Gutenberg e-texts of Jane Austen's six completed novels.

The R objects are character vectors of lines (the Gutenberg line breaks).
They were turned into text as follows: blank lines separate paragraphs; the
lines of a paragraph are stripped and joined with single spaces (runs of
whitespace collapsed to one space); paragraphs are joined with a blank line
(`"\\n\\n"`). Nothing else is changed: title lines, chapter headings and
Gutenberg's `_underscore_` italics are kept. Titles are those used by
janeaustenr's `austen_books()`.

## Licences

- The novels are in the public domain (Project Gutenberg texts; Austen died in 1817).
- The R package `{R_PACKAGE}` and its Debian packaging are under the MIT licence
  (copyright 2016-2017 Julia Silge; Debian packaging 2021 Andreas Tille).

## Contents

| title | ridgefill split | characters | paragraphs |
| --- | --- | ---: | ---: |
{rows}
| total | | {total:,} | |

Calibration books (`ridgefill.data.texts.CALIBRATION_BOOKS`) and evaluation books
(`ridgefill.data.texts.EVALUATION_BOOKS`) are disjoint.

- file: `{OUTPUT_NAME}`, {len(blob):,} bytes
- SHA-256: `{hashlib.sha256(blob).hexdigest()}`

## Regenerate

```
python scripts/prepare_text.py           # needs apt-get and dpkg-deb (Debian/Ubuntu)
python scripts/prepare_text.py --check   # verify the shipped files are reproduced
```

The script downloads `{DEB_PACKAGE}` with `apt-get download` into a temporary
directory (run `apt-get update` first if apt has no package lists; or pass an
already downloaded package with `--deb FILE`), extracts it with `dpkg-deb -x`,
parses the R lazy-load database with a small built-in reader (no R needed) and
writes both files atomically. Output is byte-identical across runs.
"""


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deb", type=Path, help=f"use this {DEB_PACKAGE} .deb instead of downloading")
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR, help="output directory")
    ap.add_argument(
        "--check", action="store_true", help="rebuild and compare with the files in --out-dir; write nothing"
    )
    args = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="ridgefill-text-") as tmp:
            work = Path(tmp)
            deb = args.deb.resolve() if args.deb else download_deb(work)
            if not deb.is_file():
                raise PrepareError(f"--deb {deb}: no such file")
            version = deb_version(deb)
            tree = work / "tree"
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
            texts = build_from_tree(tree)
        blob = encode(texts)
        doc = readme(texts, version, blob).encode("utf-8")
        out_blob, out_doc = args.out_dir / OUTPUT_NAME, args.out_dir / "README.md"
        # README.md's part from TECHNICAL_MARKER on is scripts/prepare_calibration.py's: kept as it is
        current = out_doc.read_bytes() if out_doc.is_file() else b""
        _, sep, rest = current.partition(TECHNICAL_MARKER.encode("utf-8"))
        if sep:
            doc += b"\n" + sep + rest
        if args.check:
            ok = out_blob.is_file() and out_blob.read_bytes() == blob
            ok_doc = current == doc
            print(f"{out_blob.name}: {'identical' if ok else 'DIFFERS'}", file=sys.stderr)
            print(f"{out_doc.name}: {'identical' if ok_doc else 'DIFFERS'}", file=sys.stderr)
            return 0 if ok and ok_doc else 1
        _write_atomic(out_blob, blob)
        _write_atomic(out_doc, doc)
        for title, text in texts.items():
            print(f"{title}: {len(text):,} characters", file=sys.stderr)
        print(
            f"wrote {out_blob} ({len(blob):,} bytes, sha256 {hashlib.sha256(blob).hexdigest()})",
            file=sys.stderr,
        )
        return 0
    except (PrepareError, subprocess.CalledProcessError, OSError) as exc:
        print(f"prepare_text: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
