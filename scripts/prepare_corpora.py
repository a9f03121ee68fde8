#!/usr/bin/env python3
"""Build the plain-text corpora of the cross-domain measurement (docs/evaluate.md, "Cross-domain maps").

Three domains, each split into a calibration file and an evaluation file that share no text:

- ``novels``: the four calibration novels shipped with ridgefill (``novels-calib.txt``) and the two
  evaluation novels (``novels-eval.txt``); public domain.
- ``docs``: technical documentation. Calibration: *The Debian Administrator's Handbook* (Debian
  package ``debian-handbook``, its English HTML turned into text; GPL-2+ or CC-BY-SA-3.0).
  Evaluation: the *Debian Reference* (package ``debian-reference-en``, its plain-text edition;
  GPL-2+). Two different books on the same subject.
- ``code``: Python source: modules of the standard library of the running interpreter
  (:data:`CODE_CALIB` and :data:`CODE_EVAL`, disjoint fixed lists; PSF licence).

Usage::

    python scripts/prepare_corpora.py OUT_DIR            # apt-get download the two .deb files
    python scripts/prepare_corpora.py OUT_DIR --debs DIR # use .deb files already in DIR

It writes ``OUT_DIR/<domain>-calib.txt``, ``OUT_DIR/<domain>-eval.txt`` and ``OUT_DIR/sources.json``
(package versions, interpreter version, licences, SHA-256 of every file). Needs ``apt-get`` and
``dpkg-deb`` (Debian/Ubuntu); only the Python standard library and ridgefill itself are imported.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import json
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: Standard-library modules (paths relative to the stdlib folder) for calibration and for evaluation.
CODE_CALIB: tuple[str, ...] = ("argparse.py", "dataclasses.py", "difflib.py", "functools.py", "inspect.py",
                               "pathlib.py", "shutil.py", "subprocess.py", "tarfile.py", "typing.py")
CODE_EVAL: tuple[str, ...] = ("configparser.py", "fractions.py", "pprint.py", "statistics.py", "calendar.py",
                              "gettext.py")
PACKAGES = {"docs-calib": "debian-handbook", "docs-eval": "debian-reference-en"}
LICENCES = {
    "novels": "public domain (Project Gutenberg texts of Jane Austen's novels; ridgefill's shipped austen.json.xz)",
    "debian-handbook": "GPL-2.0+ or CC-BY-SA-3.0 (Raphaël Hertzog, Roland Mas, Freexian SARL)",
    "debian-reference-en": "GPL-2+ (Osamu Aoki)",
    "python-stdlib": "PSF-2.0 (Python Software Foundation License)",
}

_BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "tr", "br", "dt", "dd", "table",
          "blockquote", "ul", "ol", "dl"}
_SKIP_CLASSES = {"docnav", "toc", "navheader", "navfooter", "breadcrumbs"}
_SKIP_IDS = {"banner", "title", "site_footer"}


class _Text(html.parser.HTMLParser):
    """HTML to plain text: block elements start new lines, ``<pre>`` keeps its lines, navigation and
    tables of contents are dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip: list[str] = []  # tags whose content is being skipped (a stack)
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if self.skip:
            self.skip.append(tag)
            return
        if tag in ("script", "style", "head") or classes & _SKIP_CLASSES or a.get("id") in _SKIP_IDS:
            self.skip.append(tag)
            return
        if tag == "pre":
            self.pre += 1
        if tag in _BLOCK:
            self.out.append("\n\n" if tag not in ("br", "li", "tr", "dt", "dd") else "\n")

    def handle_startendtag(self, tag, attrs):
        if not self.skip and tag == "br":
            self.out.append("\n")

    def handle_endtag(self, tag):
        if self.skip:
            self.skip.pop()
            return
        if tag == "pre":
            self.pre -= 1
        if tag in _BLOCK:
            self.out.append("\n\n" if tag not in ("li", "tr", "dt", "dd") else "\n")

    def handle_data(self, data):
        if self.skip:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(markup: str) -> str:
    """Plain text of an HTML page (see :class:`_Text`); runs of blank lines become one blank line."""
    p = _Text()
    p.feed(markup)
    p.close()
    lines = [ln.rstrip() for ln in "".join(p.out).split("\n")]
    text = "\n".join(ln if ln.strip() else "" for ln in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _deb(debs: Path | None, package: str, work: Path) -> Path:
    if debs is not None:
        found = sorted(debs.glob(f"{package}_*.deb"))
        if not found:
            sys.exit(f"error: no {package}_*.deb in {debs}")
        return found[-1]
    subprocess.run(["apt-get", "download", package], cwd=work, check=True)
    return sorted(work.glob(f"{package}_*.deb"))[-1]


def _version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True,
                          text=True).stdout.strip()


def handbook_text(root: Path) -> str:
    """The English handbook: every page of ``html/en-US`` in file-name order, as text."""
    pages = sorted((root / "usr/share/doc/debian-handbook/html/en-US").glob("*.html"))
    return "\n\n".join(html_to_text(p.read_text(encoding="utf-8")).strip() for p in pages) + "\n"


def reference_text(root: Path) -> str:
    """The Debian Reference's own plain-text edition."""
    with gzip.open(root / "usr/share/debian-reference/debian-reference.en.txt.gz", "rt", encoding="utf-8") as f:
        return f.read()


def code_text(names: tuple[str, ...]) -> tuple[str, str]:
    """The listed stdlib modules, each headed by a ``# file: <name>`` line, joined by blank lines."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [f"# file: {n}\n" + (stdlib / n).read_text(encoding="utf-8") for n in names]
    return "\n\n".join(parts), platform.python_version()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--debs", type=Path, default=None, help="folder holding the two .deb files (default: apt-get download)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from ridgefill.data.texts import CALIBRATION_BOOKS, EVALUATION_BOOKS, load_texts
    from ridgefill.fileio import atomic_write

    a.out.mkdir(parents=True, exist_ok=True)
    books = load_texts()
    files = {"novels-calib": "\n\n".join(books[k] for k in CALIBRATION_BOOKS),
             "novels-eval": "\n\n".join(books[k] for k in EVALUATION_BOOKS)}
    sources = {"novels-calib": {"source": list(CALIBRATION_BOOKS), "licence": LICENCES["novels"]},
               "novels-eval": {"source": list(EVALUATION_BOOKS), "licence": LICENCES["novels"]}}
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for key, package in PACKAGES.items():
            deb = _deb(a.debs, package, work)
            root = work / package
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            files[key] = handbook_text(root) if package == "debian-handbook" else reference_text(root)
            sources[key] = {"source": f"Debian package {package} {_version(deb)}", "licence": LICENCES[package]}
    for key, names in (("code-calib", CODE_CALIB), ("code-eval", CODE_EVAL)):
        files[key], version = code_text(names)
        sources[key] = {"source": f"Python {version} standard library: {', '.join(names)}",
                        "licence": LICENCES["python-stdlib"]}
    def write(path: Path, text: str) -> None:  # atomically: an interrupted run leaves no half file
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    for key, text in files.items():
        path = a.out / f"{key}.txt"
        write(path, text)
        sources[key].update(file=path.name, characters=len(text),
                            sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
    write(a.out / "sources.json", json.dumps(sources, indent=2, ensure_ascii=False) + "\n")
    for key, s in sources.items():
        print(f"{key:13s} {s['characters']:>9,} chars  {s['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
