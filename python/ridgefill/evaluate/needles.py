"""Filled-region needle retrieval, RULER-style (paper, "Evaluation").

A needle sentence ``"One of the special magic numbers for {key} is: {value}."`` (key: an
adjective-noun pair such as ``"quiet-harbour"``; value: a 7-digit number) is placed between sentences
of real prose (the evaluation novels, :data:`ridgefill.data.texts.EVALUATION_BOOKS`) at a depth **inside
the filled rows** (rows ``< N − tail``); the question, RULER's template with its answer prefix, is
in the exact tail. The model answers greedily (:func:`ridgefill.fill.generate_after`, every decoding
step runs the full model); the score is RULER's string match: 100 if the value appears in the answer
(case-insensitive), else 0.

Variants: ``single`` (one needle; its depth cycles evenly over the filled region across trials) and
``multikey`` (four needles with distinct keys and values at random filled depths; one key is asked,
the others are distractors). Each trial is seeded by ``(seed, variant, length, trial)``, so any
subset of a run reproduces. Optionally the prompt is wrapped in the model's chat template.

Layout of a case's ``N`` tokens (segments tokenized separately and concatenated, so every needle's
token span is known exactly)::

    [chat prefix] header  prose … needle … prose … needle …  prose | question + answer prefix
    └────────────────────── filled rows: 0 .. N−tail−1 ──────────┘ └─ exact tail ─────────────┘

The question segment must fit in the tail; every needle must end inside the filled rows (checked).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..calibration import special_prefix
from ..errors import InputError
from ..fill import generate_after, prefill_instrumented
from ..select import Select, as_selection, needs_maps
from .stats import wilson_interval

ADJECTIVES: tuple[str, ...] = (
    "quiet", "amber", "brisk", "hollow", "silver", "gentle", "crimson", "wooden", "frozen", "narrow",
    "golden", "bitter", "velvet", "rustic", "lucky", "sleepy", "proud", "humble", "distant", "hidden",
    "bright", "rapid", "stormy", "tender", "ancient", "cobalt", "dusty", "eager", "fragile", "mellow")
NOUNS: tuple[str, ...] = (
    "harbour", "lantern", "meadow", "kettle", "falcon", "orchard", "compass", "violin", "pebble", "saddle",
    "window", "thistle", "anchor", "basket", "candle", "ribbon", "glacier", "otter", "bridge", "teapot",
    "scarf", "ladder", "mirror", "acorn", "garden", "cannon", "feather", "barrel", "island", "whistle")
VARIANTS: tuple[str, ...] = ("single", "multikey")
MULTIKEY_NEEDLES = 4

NEEDLE = "One of the special magic numbers for {key} is: {value}."
HEADER = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the numbers afterwards.")
QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
            "The special magic number for {key} mentioned in the provided text is")
CHAT_ANSWER = "The special magic number for {key} mentioned in the provided text is"
CHAT_QUESTION = "What is the special magic number for {key} mentioned in the provided text?"


def haystack_sentences(texts: Mapping[str, str]) -> list[str]:
    """Sentences of the given prose, in order (chapter headings and very short lines dropped)."""
    out = []
    for text in texts.values():
        for para in text.split("\n\n"):
            para = para.strip()
            if len(para) < 40 or para.lower().startswith(("chapter", "volume", "end of")):
                continue
            out.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'_])", para) if s)
    return out


@dataclass
class NeedleCase:
    """One needle prompt.

    Attributes:
        variant: ``"single"`` or ``"multikey"``; length: the requested context length (tokens).
        input_ids: ``[N]`` int64 prompt (``N ≤ length``); tail: exact rows at its end.
        keys, values: every needle's key and value (insertion order = position order).
        asked: index of the asked needle; spans: ``[(start, end)]`` token rows of each needle (end
            exclusive); depths: each needle's start row divided by the filled rows ``N − tail``.
        filled_rows: ``N − tail``; question_tokens: length of the question segment (``≤ tail``).
    """

    variant: str
    length: int
    input_ids: torch.Tensor
    tail: int
    keys: list[str]
    values: list[str]
    asked: int
    spans: list[tuple[int, int]]
    depths: list[float]
    filled_rows: int
    question_tokens: int

    @property
    def answer(self) -> str:
        return self.values[self.asked]

    @property
    def depth(self) -> float:
        """Depth of the asked needle (fraction of the filled rows)."""
        return self.depths[self.asked]

    def needle_in_filled_rows(self) -> bool:
        """Every needle token is a filled row (``< N − tail``)."""
        return all(0 <= s < e <= self.filled_rows for s, e in self.spans)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_parts(tokenizer, key: str) -> tuple[str, str]:
    """(text before the user content, text after it) for the model's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("--chat needs a tokenizer with a chat template; this model has none (use plain prompts)")
    mark = "\u2063CONTEXT\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                         add_generation_prompt=True)
    before, after = text.split(mark)
    return before, after + CHAT_ANSWER.format(key=key)


def make_case(tokenizer, sentences: Sequence[str], *, length: int, tail: int, variant: str,
              rng: np.random.Generator, depth: float | None = None, chat: bool = False) -> NeedleCase:
    """Build one needle prompt of at most ``length`` tokens (see module docstring).

    Args:
        sentences: haystack prose (:func:`haystack_sentences`); a random run of consecutive sentences is used.
        tail: exact rows; must hold the whole question segment.
        variant: ``"single"`` (needle at ``depth``, a fraction of the filled rows, default random) or
            ``"multikey"`` (four needles at random depths, one asked).
        chat: wrap header, prose and question in the chat template, the answer prefix after it.

    Raises:
        InputError: unknown variant, a tail shorter than the question, a length too short for the
            question and needles, or too little prose.
    """
    if variant not in VARIANTS:
        raise InputError(f"needle variant must be one of {VARIANTS}; got {variant!r}")
    n_needles = 1 if variant == "single" else MULTIKEY_NEEDLES
    pairs = set()
    while len(pairs) < n_needles:
        pairs.add((ADJECTIVES[rng.integers(len(ADJECTIVES))], NOUNS[rng.integers(len(NOUNS))]))
    keys = [f"{a}-{n}" for a, n in sorted(pairs)]
    rng.shuffle(keys)
    values = [str(v) for v in rng.choice(np.arange(1_000_000, 10_000_000), size=n_needles, replace=False)]
    asked = int(rng.integers(n_needles))
    if chat:
        before, after = _chat_parts(tokenizer, keys[asked])
        prefix = _ids(tokenizer, before + HEADER)
        question = _ids(tokenizer, "\n\n" + CHAT_QUESTION.format(key=keys[asked]) + after)
    else:
        prefix = special_prefix(tokenizer) + _ids(tokenizer, HEADER)  # the chat template has its own
        question = _ids(tokenizer, "\n\n" + QUESTION.format(key=keys[asked]))
    needles = [_ids(tokenizer, " " + NEEDLE.format(key=k, value=v)) for k, v in zip(keys, values)]
    if tail < len(question):
        raise InputError(f"tail={tail} is shorter than the question segment ({len(question)} tokens): the "
                         "question must be in the exact tail; raise --tail")
    budget = length - len(prefix) - len(question) - sum(map(len, needles))
    if budget < tail or length <= tail:
        raise InputError(f"length={length} leaves no filled prose for the needles with tail={tail}; use a "
                         "longer context or a shorter tail")
    # consecutive sentences from a random start, until the budget is used
    start = int(rng.integers(len(sentences)))
    hay: list[list[int]] = []
    used = 0
    for i in range(len(sentences)):
        ids = _ids(tokenizer, " " + sentences[(start + i) % len(sentences)])
        if used + len(ids) > budget:
            break
        hay.append(ids)
        used += len(ids)
    n = len(prefix) + used + sum(map(len, needles)) + len(question)
    filled = n - tail
    # boundaries between sentences (row where a needle would start, before earlier needles shift it)
    bounds = np.cumsum([0] + [len(s) for s in hay]) + len(prefix)
    if variant == "single":
        targets = [float(rng.uniform(0.05, 0.95)) if depth is None else float(depth)]
    else:
        targets = sorted(float(x) for x in rng.uniform(0.05, 0.95, size=n_needles))
    if not all(0 <= t <= 1 for t in targets):
        raise InputError(f"needle depth must be a fraction of the filled rows in [0, 1]; got {depth}")
    # choose boundaries in order; every needle must end inside the filled rows
    picks: list[int] = []
    for j, t in enumerate(targets):
        shift = sum(len(needles[i]) for i in range(j))
        room = filled - shift - sum(len(needles[i]) for i in range(j, n_needles))
        ok = [b for b in range(len(bounds)) if bounds[b] <= room and (not picks or b >= picks[-1])]
        if not ok:
            raise InputError(f"length={length} with tail={tail} leaves no room for {n_needles} needles in the "
                             "filled rows; use a longer context")
        picks.append(min(ok, key=lambda b: abs(bounds[b] + shift - t * filled)))
    ids: list[int] = list(prefix)
    spans = []
    for b in range(len(hay) + 1):
        for j, p in enumerate(picks):
            if p == b:
                spans.append((len(ids), len(ids) + len(needles[j])))
                ids.extend(needles[j])
        if b < len(hay):
            ids.extend(hay[b])
    ids.extend(question)
    case = NeedleCase(variant, length, torch.tensor(ids, dtype=torch.long), tail, keys, values, asked, spans,
                      [s / filled for s, _ in spans], filled, len(question))
    if not case.needle_in_filled_rows():  # by construction; kept as a guard
        raise AssertionError(f"needle spans {spans} not inside the filled rows 0..{filled - 1}")
    return case


def case_rng(seed: int, variant: str, length: int, trial: int) -> np.random.Generator:
    """The generator of one trial: independent of which other trials run."""
    return np.random.default_rng([seed, VARIANTS.index(variant), length, trial])


def case_depth(variant: str, trial: int, trials: int) -> float | None:
    """The asked needle's depth in trial ``trial`` of ``trials`` (fraction of the filled rows): single
    needles spread evenly over 0.05-0.95; ``None`` for multikey (random depths from the case's generator)."""
    return (trial + 0.5) / trials * 0.9 + 0.05 if variant == "single" else None


def score_answer(answer: str, value: str) -> float:
    """RULER string match: 100 if ``value`` occurs in ``answer`` (case-insensitive), else 0."""
    return 100.0 if value.lower() in answer.lower() else 0.0


@torch.inference_mode()
def answer_case(model: torch.nn.Module, tokenizer, case: NeedleCase, *, mode: str, maps=None,
                split: int | None = None, max_new_tokens: int = 12, kv_hook=None,
                on_prefill: Callable | None = None, select: Select | None = None) -> str:
    """Prefill ``case`` with ``mode`` (``tail`` exact rows), answer greedily, return the decoded answer.

    ``kv_hook`` and ``select`` are passed to :func:`ridgefill.fill.prefill_instrumented` (splices, key-scale
    correction; row selection, ``None``: off); ``on_prefill(result)`` is called with the
    :class:`ridgefill.fill.PrefillResult` before decoding."""
    device = next(model.parameters()).device
    ids = case.input_ids[None].to(device)
    res = prefill_instrumented(model, ids, maps if needs_maps(mode, select) else None, tail=case.tail, mode=mode,
                               split=None if mode == "exact" else split, kv_hook=kv_hook, select=select)
    if on_prefill is not None:
        on_prefill(res)
    new = generate_after(model, ids, res, max_new_tokens)
    return tokenizer.decode(new[0], skip_special_tokens=True)


def run_needles(model: torch.nn.Module, tokenizer, sentences: Sequence[str], *, lengths: Sequence[int],
                trials: int, variants: Sequence[str] = VARIANTS, modes: Sequence[str] = ("exact", "ridge", "identity", "none"),
                maps_by_split: Mapping[int, object] | None = None, splits: Sequence[int] = (), tail: int = 64,
                seed: int = 0, chat: bool = False, max_new_tokens: int = 12, splices: Sequence[str] = (),
                key_scales: Mapping[int, torch.Tensor] | None = None,
                selects: Sequence[Select] = (), select_modes: Sequence[str] = ("ridge",),
                progress: Callable[[str], None] | None = None) -> dict:
    """Needle retrieval for every variant × length × trial and every mode (fill modes at every split).

    ``splices``: also answer with the ridge fill at every split with these splice components
    (:mod:`ridgefill.evaluate.splice`; systems ``"<S>/ridge+<component>"``, exact K/V from the same
    case's exact prefill, so ``"exact"`` must be among the modes). ``key_scales``: ``{S: [late, kv_heads]}``
    fitted key scales (:func:`ridgefill.evaluate.splice.fit_key_scales`): system ``"<S>/ridge+kscale"``.
    ``selects``: also answer with row selection (:class:`ridgefill.select.Select` or ``Selection``) in each of
    ``select_modes`` at every split: system ``"<S>/<mode>+sel"`` (one select) or ``"<S>/<mode>+sel<i>"``;
    each result also records the chosen rows' count (``selected``) and the share of the asked needle's
    tokens among them (``needle_hit``).

    Returns:
        ``{"trials": [per-trial records], "scores": [summary rows]}``; a summary row is
        ``{"variant", "length", "system", "score", "ci", "trials", "mean_depth"}`` where ``system`` is
        ``"exact"`` or ``"<S>/<mode>"``, ``score`` is in percent and ``ci`` a 95 % Wilson interval.

    Raises:
        InputError: a length beyond the model's context, no trials, an unknown mode, or ridge without maps.
    """
    max_pos = getattr(model.config, "max_position_embeddings", None)
    for n in lengths:
        if max_pos and n + max_new_tokens > max_pos:
            raise InputError(f"needle length {n} + {max_new_tokens} answer tokens exceeds the model's context of "
                             f"{max_pos} tokens; use lengths ≤ {max_pos - max_new_tokens}")
    if trials < 1:
        raise InputError(f"trials={trials} must be ≥ 1")
    maps_by_split = dict(maps_by_split or {})
    systems: list[tuple[str, str, int | None, Select | None]] = []
    for mode in modes:
        if mode == "exact":
            systems.append(("exact", "exact", None, None))
            continue
        if mode not in ("ridge", "centred", "identity", "none"):
            raise InputError(f"unknown mode {mode!r}; use exact, ridge, centred, identity or none")
        for s in splits:
            if needs_maps(mode) and maps_by_split.get(s) is None:
                raise InputError(f"mode {mode!r} at split {s} needs maps")
            systems.append((f"{s}/{mode}", mode, s, None))
    for mode in select_modes if selects else ():
        if mode not in ("ridge", "centred", "identity", "none") or (mode == "none" and any(as_selection(sel).by == "attention" for sel in selects)):
            raise InputError(f"row selection needs a fill mode with filled K/V (ridge, centred, identity; 'none' only "
                             f"with query-agnostic selections); got {mode!r}")
        for s in splits:
            if any(needs_maps(mode, sel) for sel in selects) and maps_by_split.get(s) is None:
                raise InputError(f"mode {mode!r} at split {s} needs maps")
            for i, sel in enumerate(selects):
                systems.append((f"{s}/{mode}+sel" + (str(i) if len(selects) > 1 else ""), mode, s, sel))
    from .splice import COMPONENTS, exact_kv, key_scale_hook, splice_hook

    if splices and "exact" not in modes:
        raise InputError("needle splices take the exact K/V from the exact prefill: include mode 'exact'")
    for comp in splices:
        if comp not in COMPONENTS:
            raise InputError(f"splice component must be one of {COMPONENTS}; got {comp!r}")
    extra = []
    for s in splits:
        if (splices or (key_scales and s in key_scales)) and maps_by_split.get(s) is None:
            raise InputError(f"ridge splices and key scales at split {s} need maps")
        extra += [(f"{s}/ridge+{c}", "ridge", s, None) for c in splices if c != "fill"]
        if key_scales and s in key_scales:
            extra.append((f"{s}/ridge+kscale", "ridge", s, None))
    systems += extra
    L = model.config.num_hidden_layers
    window = getattr(model.config, "sliding_window", None)
    late_types = (getattr(model.config, "layer_types", None) or [])[min(splits, default=L) + 1:]
    if "none" in modes and window and "sliding_attention" in late_types and tail < window:
        raise InputError(f"mode 'none' cannot decode when the exact tail ({tail} rows) is shorter than the "
                         f"sliding window ({window}): late sliding layers would hold too few rows. Use "
                         f"--needle-tail {window} or more, or leave out mode 'none'")
    records = []
    for variant in variants:
        for n in lengths:
            for t in range(trials):
                t0 = time.perf_counter()
                depth = case_depth(variant, t, trials)
                case = make_case(tokenizer, sentences, length=n, tail=tail, variant=variant,
                                 rng=case_rng(seed, variant, n, t), depth=depth, chat=chat)
                rec = {"variant": variant, "length": n, "trial": t, "tokens": int(case.input_ids.numel()),
                       "tail": case.tail, "filled_rows": case.filled_rows, "depth": case.depth,
                       "depths": case.depths, "spans": case.spans, "needle_in_filled_rows": case.needle_in_filled_rows(),
                       "keys": case.keys, "asked": case.asked, "answer": case.answer, "results": {}}
                kept = {}
                for name, mode, s, sel in systems:
                    hook = None
                    if "+" in name and sel is None:
                        comp = name.split("+", 1)[1]
                        hook = (key_scale_hook(key_scales[s], s) if comp == "kscale"
                                else splice_hook({l: kept[l] for l in range(s + 1, L)}, comp))
                    # the exact K/V, taken before decoding (which crops and extends the cache)
                    keep = ((lambda r: kept.update(exact_kv(r.cache, range(min(splits) + 1, L))))
                            if name == "exact" and splices else None)
                    chosen = []
                    if sel is not None:
                        keep = lambda r: chosen.extend(r.selected.tolist())  # noqa: E731
                    ans = answer_case(model, tokenizer, case, mode=mode, maps=maps_by_split.get(s), split=s,
                                      max_new_tokens=max_new_tokens, kv_hook=hook, on_prefill=keep, select=sel)
                    rec["results"][name] = {"output": ans, "score": score_answer(ans, case.answer)}
                    if sel is not None:
                        start, end = case.spans[case.asked]
                        rec["results"][name].update(
                            selected=len(chosen), select=str(sel),
                            needle_hit=len(set(chosen) & set(range(start, end))) / (end - start))
                records.append(rec)
                if progress:
                    progress(f"{variant} {n} trial {t + 1}/{trials}: " + " ".join(
                        f"{k}={int(v['score'])}" for k, v in rec["results"].items())
                        + f" ({time.perf_counter() - t0:.0f} s)")
    return {"trials": records, "scores": summarise_needles(records)}


def summarise_needles(records: Sequence[dict], key: str = "length") -> list[dict]:
    """Mean score (percent) and 95 % Wilson interval per variant × ``key`` × system."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        for system in r["results"]:
            groups.setdefault((r["variant"], r[key], system), []).append(r)
    rows = []
    for (variant, k, system), recs in groups.items():
        hits = sum(r["results"][system]["score"] > 0 for r in recs)
        lo, hi = wilson_interval(hits, len(recs))
        rows.append({"variant": variant, key: k, "system": system, "score": 100.0 * hits / len(recs),
                     "ci": [lo, hi], "trials": len(recs),
                     "mean_depth": float(np.mean([r["depth"] for r in recs]))})
    return rows
