"""Loss on context-dependent tokens (paper, "Evaluation"): ΔNLL vs exact with bootstrap intervals.

Averaged over every token, RidgeFill's error is small because most tokens are predictable from the
last few dozen tokens, which the exact tail computes exactly. This module scores three token classes
of the exact tail (the last ``tail`` rows of a ``doc_tokens``-token prompt; row ``p`` predicts token
``p + 1``):

- **all** exact-row tokens;
- **key** tokens: tokens whose exact NLL with the full prefix is lower, by at least ``τ`` nats, than
  with only a short local window (:func:`local_window_nll`, :func:`key_token_mask`); these are the
  tokens that need the filled region;
- **novel** text: documents the model cannot have memorised (:func:`ridgefill.evaluate.documents.renamed_texts`): the evaluation
  novels with every recurring proper name (characters, places) replaced, consistently within the
  book, by an invented name. Verbatim recall of the novel cannot predict these names; they have to be
  copied from the context. The novel set's passages are taken from the other half of each book
  (:func:`ridgefill.evaluate.documents.novel_documents`), so they do not repeat the plain set's passages.

ΔNLL is ``mean(NLL_mode − NLL_exact)`` over the class's tokens, in nats/token (a ratio of sums over
documents), with a 95 % percentile bootstrap interval that resamples documents
(:func:`ridgefill.evaluate.stats.bootstrap_ci`), since tokens within a document are not independent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError
from ..fill import prefill_instrumented
from ..select import needs_maps
from .stats import bootstrap_ci



# --------------------------------------------------------------------------------------------------
# Per-token NLL
# --------------------------------------------------------------------------------------------------

def token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """NLL (nats) of ``targets`` ``[rows]`` under ``logits`` ``[rows, vocab]``; float64 ``[rows]``."""
    logp = F.log_softmax(logits.double(), dim=-1)
    return -logp.gather(1, targets[:, None].to(logp.device))[:, 0].cpu()


@torch.inference_mode()
def local_window_nll(model: torch.nn.Module, doc: Tensor, positions: Tensor, window: int, *,
                     batch: int = 8, prefix_tokens: int = 0) -> Tensor:
    """NLL of token ``p + 1`` at each row ``p`` in ``positions``, seeing only a short local window.

    Strided windows (the standard trick, instead of one forward per token): rows are grouped in
    blocks ``[jW, (j+1)W)``; block ``j`` is scored by one exact forward over tokens
    ``[(j-1)W, (j+1)W)`` (positions restarting at 0), so row ``p`` sees the ``p − (j−1)W + 1``
    tokens ending at itself: between ``W + 1`` and ``2W`` tokens (fewer only in block 0, where
    the whole prefix is shorter than that). Windows of equal length run as one batch. A window
    that does not start at row 0 gets the document's first ``prefix_tokens`` tokens (the tokenizer's
    special prefix, Gemma's ``<bos>``) in front, so every forward starts as the model expects.

    Args:
        doc: ``[N + 1]`` int64 token ids (the prompt plus the token the last row predicts).
        positions: ``[rows]`` int64 rows ``p`` with ``0 ≤ p < N``.
        window: ``W ≥ 1`` tokens.

    Returns:
        ``[rows]`` float64 NLL in nats, in the order of ``positions``.

    Raises:
        InputError: ``window < 1`` or a row outside ``0..N-1``.
    """
    positions = torch.as_tensor(positions, dtype=torch.long).cpu()
    n = doc.numel() - 1
    if window < 1:
        raise InputError(f"window={window} must be ≥ 1 token")
    if positions.numel() and (positions.min() < 0 or positions.max() >= n):
        raise InputError(f"positions must lie in 0..{n - 1} (rows with a next token in the document)")
    device = next(model.parameters()).device
    out = torch.empty(positions.numel(), dtype=torch.float64)
    blocks = torch.div(positions, window, rounding_mode="floor")
    jobs: dict[tuple[int, bool], list[tuple[int, int]]] = {}  # (length, prefixed) -> [(block, start)]
    for j in blocks.unique().tolist():
        start = max(0, (j - 1) * window)
        end = min(n, (j + 1) * window)
        jobs.setdefault((end - start, start > 0), []).append((j, start))
    for (length, prefixed), items in jobs.items():
        for b in range(0, len(items), batch):
            part = items[b: b + batch]
            pre = doc[:prefix_tokens] if prefixed else doc[:0]
            ids = torch.stack([torch.cat([pre, doc[s: s + length]]) for _, s in part]).to(device)
            skip = min(max(j * window, int(positions.min())) - s for j, s in part)  # rows nobody scores
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=length - skip).logits
            for row, (j, s) in enumerate(part):
                sel = (blocks == j).nonzero()[:, 0]
                p = positions[sel]
                out[sel] = token_nll(logits[row, p - s - skip], doc[p + 1])
    return out


def key_token_mask(nll_full: Tensor, nll_local: Tensor, tau: float) -> Tensor:
    """Key tokens: ``nll_local − nll_full ≥ τ`` (bool, same shape). Raises :class:`InputError` if
    ``τ < 0`` or the shapes differ."""
    if not tau >= 0:
        raise InputError(f"τ={tau} must be ≥ 0 nats")
    if nll_full.shape != nll_local.shape:
        raise InputError(f"NLL shapes differ: {tuple(nll_full.shape)} vs {tuple(nll_local.shape)}")
    return (nll_local - nll_full) >= tau


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------

@dataclass
class DocScores:
    """Per-token NLLs (nats, float64) of one document's exact tail.

    Attributes:
        set: ``"plain"`` or ``"novel"``; positions: the scored rows ``[T]``.
        exact: ``[T]`` exact NLL with the full prefix; local: ``[T]`` with the local window only.
        fill: ``{"<split>/<variant>": [T]}`` NLL under each fill variant.
    """

    set: str
    positions: list[int]
    exact: list[float]
    local: list[float]
    fill: dict[str, list[float]] = field(default_factory=dict)


def tail_nll(model: torch.nn.Module, doc: Tensor, *, tail: int, mode: str, maps=None, split: int | None = None,
             kv_hook=None, select=None) -> tuple[Tensor, Tensor, object]:
    """Prefill ``doc[:-1]`` (``N`` rows) with ``mode`` (and row selection ``select``, a
    :class:`ridgefill.select.Select`; ``None``: off) and score the exact tail (the last ``T`` rows; rows
    made exact by selection are not scored, so every system scores the same tokens).

    Returns:
        ``(nll [T] float64 nats, positions [T] int64, PrefillResult)``.
    """
    device = next(model.parameters()).device
    ids = doc[None, :-1].to(device)
    res = prefill_instrumented(model, ids, maps, tail=tail, mode=mode, split=split, logits="exact", kv_hook=kv_hook,
                               select=select)
    pos = res.exact_positions[-tail:].cpu()
    return token_nll(res.logits[0, -tail:], doc[pos + 1]), pos, res


def score_documents(model: torch.nn.Module, docs: Sequence[Tensor], sets: Sequence[str], *, tail: int,
                    window: int, variants: Mapping[str, Callable[[Tensor], Tensor]], prefix_tokens: int = 0,
                    progress: Callable[[str], None] | None = None) -> list[DocScores]:
    """Exact, local-window and fill NLLs for every document.

    Args:
        docs: ``[N + 1]`` int64 each; sets: the set name of each document.
        variants: ``{name: fn(doc, exact) -> nll [T]}``, each scoring the same exact tail (see
            :func:`fill_variants`, :func:`ridgefill.evaluate.splice.splice_variants`); called once per
            document with the document's exact :class:`ridgefill.fill.PrefillResult`.
        prefix_tokens: special tokens every document starts with (passed to :func:`local_window_nll`).
        progress: called with a short status line after each document.
    """
    if len(docs) != len(sets):
        raise InputError("score_documents: one set name per document")
    out = []
    for i, (doc, name) in enumerate(zip(docs, sets)):
        t0 = time.perf_counter()
        exact, pos, exact_res = tail_nll(model, doc, tail=tail, mode="exact")
        local = local_window_nll(model, doc, pos, window, prefix_tokens=prefix_tokens)
        rec = DocScores(name, pos.tolist(), exact.tolist(), local.tolist())
        for key, fn in variants.items():
            rec.fill[key] = fn(doc, exact_res).tolist()
        out.append(rec)
        if progress:
            progress(f"document {i + 1}/{len(docs)} ({name}) in {time.perf_counter() - t0:.0f} s")
    return out


def fill_variants(model: torch.nn.Module, maps_by_split: Mapping[int, object], modes: Sequence[str], *,
                  tail: int, selects: Sequence = (), select_modes: Sequence[str] = ("ridge",)
                  ) -> dict[str, Callable[[Tensor], Tensor]]:
    """``{"<S>/<mode>": fn(doc, exact) -> nll [T]}`` for every split and fill mode (``ridge`` and
    ``centred`` need maps), then ``"<S>/<mode>+sel"`` (``+sel<i>`` for several) for every
    :class:`ridgefill.select.Select` in ``selects`` and mode in ``select_modes``."""
    out = {}
    systems = [(mode, None, "") for mode in modes if mode != "exact"]
    systems += [(mode, sel, "+sel" + (str(i) if len(selects) > 1 else ""))
                for mode in (select_modes if selects else ()) for i, sel in enumerate(selects)]
    for split, maps in maps_by_split.items():
        for mode, sel, suffix in systems:
            if needs_maps(mode, sel) and maps is None:
                raise InputError(f"mode {mode!r}" + ("" if needs_maps(mode) else " with a query-agnostic selection")
                                 + f" at split {split} needs maps")
            out[f"{split}/{mode}{suffix}"] = (
                lambda doc, _exact, s=split, m=mode, mp=maps, sl=sel:
                tail_nll(model, doc, tail=tail, mode=m, maps=mp if needs_maps(m, sl) else None,
                         split=s, select=sl)[0])
    return out


def summarise(records: Sequence[DocScores], *, tau: float, resamples: int = 10000, seed: int = 0) -> list[dict]:
    """ΔNLL vs exact with bootstrap intervals for every (document set, token class, variant).

    Token classes: ``all``; ``key`` (:func:`key_token_mask` with ``τ``). Document sets: each set name
    present, and ``"all"`` (every document) when there are several.

    Returns:
        rows ``{"set", "tokens", "variant", "delta_nll": Estimate.as_dict(), "nll", "exact_nll"}``.
    """
    names = sorted({r.set for r in records})
    groups = {n: [r for r in records if r.set == n] for n in names}
    if len(names) > 1:
        groups["all"] = list(records)
    variants = list(records[0].fill) if records else []
    rows = []
    for gname, recs in groups.items():
        for cls in ("all", "key"):
            masks = []
            for r in recs:
                ex, lo = torch.tensor(r.exact), torch.tensor(r.local)
                masks.append(torch.ones_like(ex, dtype=torch.bool) if cls == "all" else key_token_mask(ex, lo, tau))
            counts = [int(m.sum()) for m in masks]
            if sum(counts) == 0:
                continue
            for var in variants:
                sums = [float((torch.tensor(r.fill[var]) - torch.tensor(r.exact))[m].sum()) for r, m in zip(recs, masks)]
                est = bootstrap_ci(sums, counts, resamples=resamples, seed=seed)
                nll = sum(float(torch.tensor(r.fill[var])[m].sum()) for r, m in zip(recs, masks)) / sum(counts)
                ex = sum(float(torch.tensor(r.exact)[m].sum()) for r, m in zip(recs, masks)) / sum(counts)
                rows.append({"set": gname, "tokens": cls, "variant": var, "delta_nll": est.as_dict(),
                             "nll": nll, "exact_nll": ex})
    return rows


def key_token_stats(records: Sequence[DocScores], tau: float) -> dict:
    """How many tokens are key tokens, per set and overall."""
    out = {}
    for name in sorted({r.set for r in records}) + ["all"]:
        recs = [r for r in records if name == "all" or r.set == name]
        n = sum(len(r.exact) for r in recs)
        k = sum(int(key_token_mask(torch.tensor(r.exact), torch.tensor(r.local), tau).sum()) for r in recs)
        out[name] = {"documents": len(recs), "tokens": n, "key_tokens": k,
                     "key_fraction": k / n if n else math.nan}
    return out
