"""The product, its docs and tests describe the present: no citation of a development period.

Scans README.md, docs/ (every file, `.xz` ones decompressed), python/, tests/ and scripts/ for an
ordinal ("first" … "twentieth", any "-teenth" form) followed by the word for a development period, and
for that word itself (whole word, any case, plural too). research/ (the research log and its results)
and CHANGELOG.md hold the history and are not scanned; nor are the shipped third-party texts
(`python/**/data/*.json.xz`: novels, a handbook, Python source, where the word has its ordinary
meanings). pytest's fixture scope of that name (`scope="…"`) is an API constant, not prose, and is
allowed. The word is assembled at run time so that this file does not match itself.
"""

import lzma
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "docs", "python", "tests", "scripts")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}

PERIOD = "ses" + "sion"
ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
            r"|\w+teenth|twentieth")
ORDINAL_PERIOD = re.compile(rf"\b(?:{ORDINALS})[\s\-]+{PERIOD}s?\b", re.IGNORECASE)
PERIOD_WORD = re.compile(rf"\b{PERIOD}s?\b", re.IGNORECASE)
PYTEST_SCOPE = re.compile(rf"""scope\s*=\s*["']{PERIOD}["']""")


def _files() -> list[Path]:
    """Tracked and untracked, not ignored, files under the scanned paths (git), else a directory walk."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *SCANNED],
                             cwd=ROOT, capture_output=True, check=True).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for name in SCANNED:
            top = ROOT / name
            paths += [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
    return sorted(p for p in paths if p.is_file() and not SKIPPED_DIRS.intersection(p.parts)
                  and not any(part.endswith(".egg-info") for part in p.parts) and not _third_party_text(p))


def _third_party_text(path: Path) -> bool:
    """A shipped calibration or evaluation corpus (``python/**/data/*.json.xz``)."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] == "python" and rel.parent.name == "data" and rel.name.endswith(".json.xz")


def _text(path: Path) -> str | None:
    """The file's text (`.xz` decompressed), or None for a binary file."""
    data = path.read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def history_citations(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line citing a development period."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        prose = PYTEST_SCOPE.sub("", line)
        if ORDINAL_PERIOD.search(prose) or PERIOD_WORD.search(prose):
            hits.append((number, line.strip()))
    return hits


def test_the_pattern_finds_ordinal_and_word_citations_and_allows_the_pytest_scope():
    assert history_citations(f"docs/evaluate.md, \"Tenth {PERIOD}\"") == [(1, f"docs/evaluate.md, \"Tenth {PERIOD}\"")]
    assert len(history_citations(f"the eighteenth-{PERIOD}'s probe\nplain line\nthe {PERIOD.upper()}S of work")) == 2
    assert history_citations(f"as the seventeenth {PERIOD}s found")[0][0] == 1
    assert history_citations(f'@pytest.fixture(scope="{PERIOD}")') == []
    assert history_citations("the first row, the tenth trial, a possession, sessionless") == []


def test_no_history_citations_in_the_product_docs_and_tests():
    files = _files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    hits = []
    for path in files:
        text = _text(path)
        if text is not None:
            hits += [f"{path.relative_to(ROOT)}:{n}: {line[:120]}" for n, line in history_citations(text)]
    assert not hits, f"{len(hits)} history citations (move them to research/log.md):\n" + "\n".join(hits)
