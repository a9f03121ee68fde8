"""Keep evaluation text disjoint from calibration text: token-window fingerprints.

Maps fitted on a passage and evaluated on the same passage measure memorised calibration text, not
the fill. Calibration therefore records a fingerprint of the tokens it saw (in the maps metadata,
``calibration_fingerprint``), and every evaluation command checks its documents against it
(:func:`check_disjoint`), refusing overlap with :class:`ridgefill.errors.OverlapError`.

Fingerprint: a 64-bit hash of every run of ``window`` consecutive tokens (a polynomial hash mod
``2⁶⁴``, mixed by the splitmix64 finaliser), keeping those whose hash is ``0 mod sample``
(content-defined sampling: the same windows are kept wherever the text appears). A shared run of
``R ≥ window`` tokens contains ``R − window + 1`` windows, each kept with probability
``1/sample``, so it is missed with probability about ``(1 − 1/sample)^(R − window + 1)``.
Calibration keeps at most about :data:`MAX_KEPT` hashes: ``sample`` is the smallest power of two
``≥ tokens / MAX_KEPT`` (:func:`sample_for`), so up to 4,096 calibration tokens every window is kept
(the check is exact), 65,536 tokens keep one in 16 (a shared run of 256 tokens is missed with
probability ``4·10⁻⁷``, a whole 2,048-token document never in practice). Windows never cross a
calibration chunk's edge, and the tokenizer's special prefix is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import MapsFormatError, OverlapError
from .texts import TECHNICAL_TEXTS, calibration_set_of, technical_text_info

WINDOW = 32  #: tokens per fingerprint window
SAMPLE = 32  #: default: one window in ``SAMPLE`` is kept (content-defined)
MAX_KEPT = 4096  #: calibration fingerprints keep about this many hashes at most (:func:`sample_for`)
_P = np.uint64(0x100000001B3)  # the polynomial hash's base (FNV prime)


def window_hashes(ids, window: int = WINDOW) -> np.ndarray:
    """Mixed 64-bit hashes of every ``window``-token run of ``ids`` (1-D ints): ``[max(0, n − window + 1)]``
    uint64, entry ``i`` for tokens ``i .. i+window-1``."""
    t = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64).astype(np.uint64)
    n = t.size - window + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = np.zeros(n, dtype=np.uint64)
        for j in range(window):
            h = h * _P + t[j: j + n] + np.uint64(1)
        h ^= h >> np.uint64(30)  # splitmix64 finaliser: every bit of h depends on every token
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


@dataclass(frozen=True)
class Fingerprint:
    """Sampled window hashes of a text (see the module docstring).

    Attributes:
        window: tokens per window; sample: one window in ``sample`` kept; hashes: sorted unique uint64.
    """

    window: int
    sample: int
    hashes: np.ndarray

    def kept(self, hashes: np.ndarray) -> np.ndarray:
        """The entries of ``hashes`` this fingerprint's sampling keeps (bool mask)."""
        return hashes % np.uint64(self.sample) == 0

    def to_meta(self) -> dict:
        """JSON-able form stored in the maps metadata: hashes as 16-digit hex strings."""
        return {"window": self.window, "sample": self.sample, "hashes": [f"{int(h):016x}" for h in self.hashes]}

    @classmethod
    def from_meta(cls, meta: object) -> "Fingerprint":
        """Inverse of :meth:`to_meta`. Raises :class:`MapsFormatError` on a malformed value."""
        try:
            window, sample = int(meta["window"]), int(meta["sample"])
            hashes = np.array(sorted({int(h, 16) for h in meta["hashes"]}), dtype=np.uint64)
        except (TypeError, KeyError, ValueError, OverflowError) as e:
            raise MapsFormatError(f"the maps' calibration_fingerprint is malformed ({e}); refit the maps with "
                                  "`ridgefill calibrate`") from None
        if window < 1 or sample < 1:
            raise MapsFormatError(f"the maps' calibration_fingerprint has window={window}, sample={sample}; both "
                                  "must be ≥ 1; refit the maps with `ridgefill calibrate`")
        return cls(window, sample, hashes)


def sample_for(tokens: int) -> int:
    """The sampling period for a calibration of ``tokens`` tokens: the smallest power of two
    ``≥ tokens / MAX_KEPT`` (1 up to ``MAX_KEPT`` tokens)."""
    sample = 1
    while sample * MAX_KEPT < tokens:
        sample *= 2
    return sample


def fingerprint(token_runs: Sequence, *, window: int = WINDOW, sample: int = SAMPLE) -> Fingerprint:
    """Fingerprint of several token runs (e.g. calibration chunks without their special prefix),
    windows taken within each run."""
    fp = Fingerprint(window, sample, np.zeros(0, dtype=np.uint64))
    parts = [h[fp.kept(h)] for h in (window_hashes(r, window) for r in token_runs)]
    return Fingerprint(window, sample, np.unique(np.concatenate(parts)) if parts else fp.hashes)


def text_fingerprint(tokenizer, text: str, *, window: int = WINDOW, sample: int = SAMPLE) -> Fingerprint:
    """Fingerprint of a whole text, tokenized without special tokens (``sample=1`` keeps every window)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return fingerprint([ids], window=window, sample=sample)


REMEDY = ("evaluate on other text (--text), or fit maps on text without it (`ridgefill calibrate --text ... "
          "--out NEW.safetensors`, then --maps NEW)")


def check_disjoint(docs: Sequence, fp: Fingerprint | None, *, names: Sequence[str], calibration: str,
                   prefix_tokens: int = 0, remedy: str = REMEDY) -> None:
    """Refuse evaluation documents that share a fingerprinted window with the calibration text.

    Args:
        docs: token ids of each evaluation document (1-D each; its first ``prefix_tokens`` special
            tokens are skipped); names: a label for each (file and position) used in the message.
        fp: the calibration fingerprint (``None``: nothing to check).
        calibration: what the maps were calibrated on, for the message.
        remedy: what to do, the message's last clause.

    Raises:
        OverlapError: a document shares windows with the calibration text; the message names the
            document, the first shared token offset, the count, and what to do.
    """
    if fp is None or fp.hashes.size == 0:
        return
    for doc, name in zip(docs, names):
        ids = doc[prefix_tokens:] if prefix_tokens else doc
        h = window_hashes(ids, fp.window)
        hit = fp.kept(h) & np.isin(h, fp.hashes)
        if hit.any():
            first = int(np.flatnonzero(hit)[0])
            raise OverlapError(
                f"evaluation {name} overlaps the calibration text ({calibration}): {int(hit.sum())} of its "
                f"{fp.window}-token windows were seen in calibration, the first at token {first}. Evaluating "
                "there measures text the maps were fitted on; " + remedy)


def calibration_label(meta: dict) -> str:
    """What maps were calibrated on, from their metadata: for a shipped calibration set
    (:func:`ridgefill.data.texts.calibration_set_of`) ``"the shipped 'mix' set: novels 22,528, handbook 21,504,
    stdlib 21,504 tokens (4 Austen novels; The Debian Administrator's Handbook; Python 3.11.7 standard
    library modules)"``; for other text ``"name (tokens of text_tokens tokens, sha256 abcd…)"`` per text,
    or the whole-text SHA-256 for files from before texts were recorded."""

    texts = meta.get("calibration_texts")
    shipped = calibration_set_of(meta)
    if shipped is not None and isinstance(texts, list) and texts:
        try:
            return f"the shipped {shipped!r} set: " + _shipped_label(texts)
        except (TypeError, KeyError, ValueError):
            pass
    if shipped is not None:
        return f"the shipped {shipped!r} set (tokens per text unrecorded)"
    if isinstance(texts, list) and texts:
        try:
            return "; ".join(f"{t['name']} ({int(t['calibration_tokens']):,} of {int(t['text_tokens']):,} tokens, "
                             f"sha256 {str(t['sha256'])[:12]})" for t in texts)
        except (TypeError, KeyError, ValueError):
            pass
    digest = meta.get("text_sha256")
    return f"unrecorded text (sha256 of all of it {str(digest)[:12]})" if digest else "unrecorded text"


def _shipped_label(texts: list) -> str:
    """``"novels 22,528, handbook 21,504, stdlib 21,504 tokens (…titles…)"`` for the records of a shipped set."""

    counts = ", ".join(f"{t['name']} {int(t['calibration_tokens']):,}" for t in texts)
    titles = ["4 Austen novels" if t["name"] == "novels" else technical_text_info(t["name"])["title"]
              for t in texts if t["name"] in ("novels", *TECHNICAL_TEXTS)]
    return f"{counts} tokens" + (f" ({'; '.join(titles)})" if titles else "")
