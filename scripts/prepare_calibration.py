#!/usr/bin/env python3
"""Regenerate the technical calibration texts shipped with ridgefill (the default calibration mix).

Writes two package data files and the second part of ``python/ridgefill/data/README.md``:

- ``python/ridgefill/data/handbook.json.xz``: *The Debian Administrator's Handbook* (Raphaël Hertzog,
  Roland Mas), English HTML of the Debian package ``debian-handbook`` turned into plain text, exactly
  the ``docs-calib.txt`` of ``scripts/prepare_corpora.py``; redistributed under CC-BY-SA-3.0.
- ``python/ridgefill/data/stdlib.json.xz``: the Python standard-library modules of
  ``prepare_corpora.CODE_CALIB`` of the running interpreter, exactly ``code-calib.txt``; PSF-2.0.

Only the calibration parts are shipped: the cross-domain evaluation texts (the *Debian Reference*,
``prepare_corpora.CODE_EVAL``) are not, so they stay disjoint from the default calibration.

Each file is an xz-compressed UTF-8 JSON object ``{"name", "title", "source", "licence", "text"}``
(see :func:`ridgefill.data.texts.load_technical_texts`). Output is byte-identical across runs given the
pinned package version (:data:`HANDBOOK_VERSION`) and interpreter version (:data:`PYTHON_VERSION`);
other versions are refused, since they would ship different text.

Usage::

    python scripts/prepare_calibration.py              # apt-get download debian-handbook, then build
    python scripts/prepare_calibration.py --deb FILE   # use an already downloaded .deb
    python scripts/prepare_calibration.py --check      # rebuild in memory, compare with the shipped files

Needs ``apt-get`` (run ``apt-get update`` first if apt has no package lists) and ``dpkg-deb``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import lzma
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "python" / "ridgefill" / "data"
HANDBOOK_PACKAGE = "debian-handbook"
HANDBOOK_VERSION = "11.20220922"  #: the Debian package version the shipped handbook text comes from
PYTHON_VERSION = "3.11.7"  #: the interpreter whose standard library the shipped code comes from
FILES = {"handbook": "handbook.json.xz", "stdlib": "stdlib.json.xz"}
#: The line that starts this script's part of data/README.md (scripts/prepare_text.py writes the part before).
README_MARKER = "<!-- technical calibration texts: written by scripts/prepare_calibration.py -->"
HANDBOOK_ATTRIBUTION = ("*The Debian Administrator's Handbook* (Debian 11 edition), by Raphaël Hertzog and "
                        "Roland Mas; copyright 2003-2015 Raphaël Hertzog, 2006-2015 Roland Mas, 2013-2015 "
                        "Freexian SARL")
#: PSF's notice of copyright, as the PSF License Agreement of Python 3.11.7 words it (its clause 2).
PSF_NOTICE = ("Copyright (c) 2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009, 2010, 2011, 2012, 2013, 2014, "
              "2015, 2016, 2017, 2018, 2019, 2020, 2021, 2022, 2023 Python Software Foundation; All Rights Reserved")


class PrepareError(Exception):
    """A step of the preparation failed; the message says what to do."""


def _corpora():
    """``scripts/prepare_corpora.py`` as a module (its HTML-to-text converter and module lists)."""
    spec = importlib.util.spec_from_file_location("prepare_corpora", Path(__file__).with_name("prepare_corpora.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def encode(record: dict) -> bytes:
    """Serialise one record deterministically: UTF-8 JSON (keys sorted), xz preset 9, CRC64."""
    payload = json.dumps(record, ensure_ascii=False, indent=0, sort_keys=True).encode("utf-8") + b"\n"
    return lzma.compress(payload, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


def build(deb: Path, work: Path) -> dict[str, dict]:
    """The two records ``{name: {"name", "title", "source", "licence", "text"}}`` from the handbook .deb
    and the running interpreter's standard library.

    Raises:
        PrepareError: the .deb or the interpreter is not the pinned version.
    """
    corpora = _corpora()
    version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    if version != HANDBOOK_VERSION:
        raise PrepareError(f"{deb.name} is {HANDBOOK_PACKAGE} {version}, but the shipped text is pinned to "
                           f"{HANDBOOK_VERSION}; pass that version with --deb, or update HANDBOOK_VERSION (and "
                           "re-measure the default calibration) to ship the new text")
    if platform.python_version() != PYTHON_VERSION:
        raise PrepareError(f"this is Python {platform.python_version()}, but the shipped standard-library text "
                           f"is pinned to Python {PYTHON_VERSION}; run the script with that interpreter")
    root = work / "handbook"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    code, _ = corpora.code_text(corpora.CODE_CALIB)
    return {
        "handbook": {"name": "handbook", "title": "The Debian Administrator's Handbook",
                     "source": f"Debian package {HANDBOOK_PACKAGE} {version}, usr/share/doc/debian-handbook/"
                               "html/en-US/*.html in file-name order, turned into plain text",
                     "licence": f"CC-BY-SA-3.0; {HANDBOOK_ATTRIBUTION}",
                     "text": corpora.handbook_text(root)},
        "stdlib": {"name": "stdlib", "title": f"Python {PYTHON_VERSION} standard library modules",
                   "source": f"Python {PYTHON_VERSION} standard library: " + ", ".join(corpora.CODE_CALIB),
                   "licence": f"PSF-2.0; {PSF_NOTICE}", "text": code},
    }


def psf_agreement() -> str:
    """The PSF License Agreement (version 2) from the running interpreter's ``LICENSE.txt``, as it stands
    there (from its title to the next agreement's).

    Raises:
        PrepareError: no ``LICENSE.txt`` beside the standard library, or no PSF agreement in it.
    """
    path = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PrepareError(f"cannot read the interpreter's licence file ({exc}); run with a Python "
                           f"{PYTHON_VERSION} that ships LICENSE.txt in its standard library") from None
    start, end = text.find("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2"), text.find("BEOPEN.COM LICENSE AGREEMENT")
    if start < 0 or end < start:
        raise PrepareError(f"{path.name} of this interpreter holds no PSF License Agreement version 2")
    agreement = text[start:end].strip() + "\n"
    if " ".join(PSF_NOTICE.split()) not in " ".join(agreement.replace('"', " ").split()):
        raise PrepareError("the interpreter's PSF License Agreement words its copyright notice differently from "
                           "PSF_NOTICE; update PSF_NOTICE")
    return agreement


def readme_section(records: dict[str, dict], blobs: dict[str, bytes]) -> str:
    """This script's part of data/README.md, starting with :data:`README_MARKER`."""
    rows = "\n".join(
        f"| `{FILES[k]}` | {r['title']} | {len(r['text']):,} | {len(blobs[k]):,} | `{hashlib.sha256(blobs[k]).hexdigest()}` |"
        for k, r in records.items())
    text_rows = "\n".join(f"| {k} | `{hashlib.sha256(r['text'].encode('utf-8')).hexdigest()}` |"
                          for k, r in records.items())
    corpora = _corpora()
    return f"""{README_MARKER}

# Shipped text: the technical calibration texts

The default calibration set `"mix"` (`ridgefill.data.texts.calibration_texts()`) is three texts: the four
calibration novels above joined into one text (`"\\n\\n"` between them, in the order of
`CALIBRATION_BOOKS`), the handbook and the standard-library source below. Calibration takes chunks
round-robin over the three texts, so each domain gets about a third of them. `calibration_texts("novels")`
is the earlier default (the four novels, each a text of its own). Load these two texts with
`ridgefill.data.texts.load_technical_texts()`; each file is an xz-compressed UTF-8 JSON object with the keys
`name`, `title`, `source`, `licence` and `text`.

Only calibration text is shipped. The evaluation parts of the cross-domain measurement
(docs/evaluate.md, "Cross-domain maps": the *Debian Reference* and the standard-library modules
{", ".join(f"`{m}`" for m in corpora.CODE_EVAL)}) are not, and share no text with these.

## Provenance

- `handbook`: Debian package `{HANDBOOK_PACKAGE}`, version `{HANDBOOK_VERSION}`: the English HTML edition
  (`usr/share/doc/debian-handbook/html/en-US/*.html`, every page in file-name order) turned into plain
  text by `scripts/prepare_corpora.py` (`html_to_text`: block elements start new lines, `<pre>` keeps its
  lines, navigation, banners and tables of contents are dropped, runs of blank lines become one). The
  text is the same as the `docs-calib.txt` of the cross-domain measurement.
- `stdlib`: the source files of Python {PYTHON_VERSION}'s standard library
  {", ".join(f"`{m}`" for m in corpora.CODE_CALIB)}, unmodified, each headed by a `# file: <name>` line,
  joined by blank lines (the same text as `code-calib.txt`).

## Licences

- `handbook.json.xz`: {HANDBOOK_ATTRIBUTION}. The book is dual-licensed GPL-2.0+ or CC-BY-SA-3.0
  (Debian's `copyright` file of `{HANDBOOK_PACKAGE}`); this excerpt is redistributed under the
  **Creative Commons Attribution-ShareAlike 3.0 Unported** licence
  (https://creativecommons.org/licenses/by-sa/3.0/). Changes: the HTML was turned into plain text as
  described above (markup, navigation and tables of contents removed); the wording is unchanged. The
  file, as an adaptation, is under the same licence; it is not covered by RidgeFill's Apache-2.0.
- `stdlib.json.xz`: Python {PYTHON_VERSION} standard-library source, under the Python Software
  Foundation License Version 2 (PSF-2.0): "{PSF_NOTICE}". Changes (the summary its clause 3 asks
  for): none to the modules; they are only concatenated, each headed by a `# file: <name>` line. The
  agreement, as the interpreter's `LICENSE.txt` holds it:

```
{psf_agreement().rstrip()}
```

## Contents

| file | text | characters | bytes | SHA-256 of the file |
| --- | --- | ---: | ---: | --- |
{rows}

SHA-256 of each text (UTF-8), as calibration records it in the maps (`calibration_texts`):

| text | SHA-256 |
| --- | --- |
{text_rows}

## Regenerate

```
python scripts/prepare_calibration.py           # needs apt-get and dpkg-deb, and Python {PYTHON_VERSION}
python scripts/prepare_calibration.py --check   # verify the shipped files are reproduced
```

The script downloads `{HANDBOOK_PACKAGE}` with `apt-get download` into a temporary directory (run
`apt-get update` first if apt has no package lists; or pass the .deb with `--deb FILE`), extracts it
with `dpkg-deb -x` and writes both files and this section atomically. It refuses another package or
interpreter version (the text would differ). Output is byte-identical across runs.
"""


def _download(work: Path) -> Path:
    os.chmod(work, 0o755)  # lets apt's sandbox user write there
    print(f"downloading {HANDBOOK_PACKAGE} with apt-get ...", file=sys.stderr)
    proc = subprocess.run(["apt-get", "download", f"{HANDBOOK_PACKAGE}={HANDBOOK_VERSION}"], check=False,
                          cwd=work, capture_output=True, text=True)
    debs = sorted(work.glob(f"{HANDBOOK_PACKAGE}_*.deb"))
    if proc.returncode != 0 or not debs:
        raise PrepareError(f"`apt-get download {HANDBOOK_PACKAGE}={HANDBOOK_VERSION}` failed:\n"
                           f"{proc.stderr.strip()}\nRun `apt-get update` (as root) and try again, or pass the "
                           ".deb with --deb FILE")
    return debs[0]


def _readme_with(current: str, section: str) -> str:
    """``current`` README with this script's part (from :data:`README_MARKER` on) replaced by ``section``."""
    head, sep, _ = current.partition(README_MARKER)
    return (head if sep else current.rstrip("\n") + "\n\n") + section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deb", type=Path, help=f"use this {HANDBOOK_PACKAGE} .deb instead of downloading")
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR, help="output directory (default: the package's data)")
    ap.add_argument("--check", action="store_true", help="rebuild and compare with the files in --out-dir; write nothing")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT / "python"))
    from ridgefill.fileio import atomic_write_all

    try:
        with tempfile.TemporaryDirectory(prefix="ridgefill-calib-") as tmp:
            work = Path(tmp)
            deb = args.deb.resolve() if args.deb else _download(work)
            if not deb.is_file():
                raise PrepareError(f"--deb {deb}: no such file")
            records = build(deb, work)
        blobs = {k: encode(r) for k, r in records.items()}
        readme_path = args.out_dir / "README.md"
        current = readme_path.read_text(encoding="utf-8") if readme_path.is_file() else ""
        readme = _readme_with(current, readme_section(records, blobs))
        if args.check:
            ok = True
            for k, name in FILES.items():
                same = (args.out_dir / name).is_file() and (args.out_dir / name).read_bytes() == blobs[k]
                ok &= same
                print(f"{name}: {'identical' if same else 'DIFFERS'}", file=sys.stderr)
            same = current == readme
            print(f"README.md (technical part): {'identical' if same else 'DIFFERS'}", file=sys.stderr)
            return 0 if ok and same else 1
        writes = [(args.out_dir / FILES[k], (lambda b: lambda tmp: Path(tmp).write_bytes(b))(b))
                  for k, b in blobs.items()]
        writes.append((readme_path, lambda tmp: Path(tmp).write_text(readme, encoding="utf-8")))
        atomic_write_all(writes)
        for k, b in blobs.items():
            print(f"wrote {FILES[k]}: {len(records[k]['text']):,} characters, {len(b):,} bytes, sha256 "
                  f"{hashlib.sha256(b).hexdigest()}", file=sys.stderr)
        return 0
    except (PrepareError, subprocess.CalledProcessError, OSError) as exc:
        print(f"prepare_calibration: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
