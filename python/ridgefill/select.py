"""Query-aware choice of extra exact rows (``prefill(..., select=Select(...))``).

At split depth 1/2 the fill loses what must be retrieved from the filled region (docs/evaluate.md): the
late layers' keys of the filled rows are predicted, and a needle's predicted keys no longer draw the
question's attention. A few exact rows are enough if they are the right ones. :func:`ridgefill.fill.prefill`
runs a first pass (the plain fill), scores every filled row by the attention the last exact rows pay it
in the late layers (optionally relative to the attention the exact rows before them pay it;
:class:`AttentionScores`), makes the best rows exact (:func:`choose_rows`, a budget
with widening around each row) and reruns only the late layers of the exact rows (``--select
attention``, ``Select()``). A lexical part (``by="ngram"``) chooses, before the late layers, the rows
that end a sequence of tokens the question repeats; a query-agnostic part (``by="leverage"``) chooses
rows from the prompt alone. The default (:data:`DEFAULT_SELECT`, ``--select on``) is a lexical part
with up to 2 % of the prompt, then two attention parts (:data:`KEY_TOKEN_PARTS`, one for needles, one for the
tail's key tokens) up to 5 % in all, scored one pass (``by="predicted"``: the tail's predicted late-layer queries
over every row's predicted keys, before the late layers run; :data:`ONE_PASS_SELECT`); ``--select two-pass``
scores them in a first pass of the late layers (:data:`TWO_PASS_SELECT`).

Given the chosen rows, the result is the one-pass fill with those rows as ``exact_rows`` (tests and
crossval check it); the choice itself depends on the whole prompt, so which rows are exact is not
causal (``KvaLean.Causality`` states causality for a given exact set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .errors import InputError


#: The query-agnostic part's preset (``"prompt"`` in a spec; research/log.md, "Row selection").
PROMPT_PRESET = {"by": "leverage", "before": 14, "after": 2, "contrast": 0}

#: The lexical part's preset (``"ngram"`` in a spec): rows that end 2- to 5-token sequences the tail's
#: last 64 rows also hold, scoring at least 3 (:attr:`Select.min_score`), each widened to 4 rows before and
#: 16 after (research/log.md, "Row selection").
NGRAM_PRESET = {"by": "ngram", "before": 4, "after": 16, "queries": 64, "contrast": 0, "min_score": 3.0}

#: The sequence lengths the lexical part matches (:func:`ngram_scores`).
NGRAM_SIZES = (2, 3, 4, 5)

#: The presets a spec part may start with, by name.
PRESETS = {"prompt": PROMPT_PRESET, "ngram": NGRAM_PRESET}


def _spec_text(v) -> str:
    """A spec value, exact and never with a '+' (the parts' separator): whole floats as ints."""
    if isinstance(v, float):  # numpy floats too: print as a Python float
        v = float(v)
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


@dataclass(frozen=True)
class Select:
    """Query-aware choice of extra exact rows: a two-pass fill (issue "filled-region retrieval").

    Pass 1 is the plain fill. While the exact rows run the late layers, the softmax attention of the
    last ``queries`` exact rows over every key is recorded in each late layer, divided (per head) by the
    mean attention of the ``reference`` exact rows before them plus ``floor / N``; a filled row's score
    is that ratio summed over query rows and reduced over heads and late layers (``heads``; without a
    reference, the default, the attention itself). With ``reference=63`` the last row is compared with
    the 63 rows before it: a needle is the row the question attends to and the rest of the tail does
    not (research/log.md, "Row selection"). The best-scoring filled rows become exact, each widened to ``before`` rows before and
    ``after`` rows after it, until ``budget`` extra rows are used. Pass 2 reruns only what changed: the
    late layers for the old and the new exact rows (their lower layers, ``h_S`` and the other filled
    rows' K/V are kept). ``rounds > 1`` repeats scoring and choosing, each round with a ``budget /
    rounds`` share.

    Attributes:
        budget: extra exact rows: a fraction of the prompt when ``< 1`` (e.g. ``0.025``), else a row
            count. The chosen rows never exceed it.
        before, after: rows added before and after each best-scoring row (a needle's digits follow
            the words the question matches, hence the asymmetric default).
        queries: how many of the last exact rows score the filled rows (a lexical part: how many of the
            tail's last rows hold the question).
        heads: how heads and layers are reduced: ``"sum"`` (sum over heads and layers), ``"max"``
            (max over heads, sum over layers) or ``"induction"``: only the ``top_heads`` late-layer heads
            with the highest induction score (:func:`induction_scores`, the copy heads that retrieval
            needs), max over them and over layers.
        top_heads: how many heads ``heads="induction"`` keeps.
        rounds: scoring-and-choosing rounds.
        sink: the first ``sink`` rows (the attention sink) are chosen first, without widening, and
            count toward the budget; they take most of every head's attention, so scoring them would
            spend the budget on them and their neighbours.
        reference: exact rows, just before the query rows, whose attention is the reference a score is
            compared with (``0``: off). With ``reference = r`` a row's score in each head is the query
            rows' attention to it over the mean attention the ``r`` reference rows pay it plus
            ``floor / N`` (before heads and layers are reduced): rows that every exact row attends to (a
            name the prose keeps returning to, a predicted key that draws attention from all queries)
            rank below the rows the query singles out (research/log.md, "Row selection"). The reference
            rows are scored too (``queries + reference`` rows per pass, :meth:`Selection.queries`).
        floor: the share of uniform attention added to the reference mean (``reference > 0`` only).
            When the exact rows are fewer than ``queries + reference``, the rows before the query rows
            are the reference (none: no reference). With a reference the scores are ratios (about 1 for
            uniform attention), so the ``0.01 / N`` floor of ``contrast`` is then negligible; the
            measurements used it as it is.
        contrast: half-width in rows of the local window a score is compared with (``0``: off). With
            ``contrast = w`` a row is ranked by its score divided by the mean score of the candidate
            rows within ``w`` rows of it (plus a floor of 1 % of uniform attention, ``0.01 / N``):
            attention decays with distance, so raw scores favour rows near the question, and a needle
            far from it ranks below nearby ordinary text (docs/evaluate.md, "Row selection").
        by: ``"attention"`` (the two passes above: query-aware) or ``"leverage"`` (query-agnostic, one
            pass): rows are scored before the late layers run, from the prompt alone, by the leverage of
            their split state ``h_S`` under the calibration covariance (:func:`leverage_scores`): the
            rows the maps extrapolate on. For a shared document prefix whose question is not yet known.
            Needs maps with a calibration covariance (``RidgeMaps.cov_h``); ``queries``, ``heads``,
            ``top_heads`` and ``rounds`` are not used. ``Select.parse("prompt")``
            (``by="leverage", before=14, after=2, contrast=0``) is the choice measured on SmolLM2: a row
            of high leverage is the end of an unusual span, such as a needle's last digits, so the window
            reaches back over the value and its key (research/log.md, "Row selection"). It finds rows that
            are rare *for the calibration text*: with maps calibrated on novels it finds needles in a
            novel haystack; with maps calibrated on the default mix (which holds code, full of numbers
            and identifiers) it found none of 16 needle values within 35 rows at 1K and 2K tokens, and
            on Gemma 3 with novels maps it answered 4 of 8 at 8K where the attention rule answers 8
            (research/log.md, "Row selection").
            Or ``"ngram"`` (lexical, query-aware, one pass): a filled row scores by the 2- to 5-token
            sequences it ends that also end at one of the last ``queries`` rows of the tail (the
            question; never ``exact_rows`` outside the tail), each weighed by one over its count outside
            them (:func:`ngram_scores`); rows chosen before the late layers, no model run needed. Only
            rows with a match scoring at least ``min_score`` anchor a window: with none the part's budget
            is left unspent (under a
            :class:`Selection` ``total``, the attention parts may then use it up to their own budgets, as
            in :data:`DEFAULT_SELECT`). ``Select.parse("ngram")``
            (``by="ngram", before=4, after=16, queries=64, contrast=0, min_score=3``) finds the needle whose key the
            question quotes, which the attention over predicted keys misses on multikey cases
            (research/log.md, "Row selection"); it relies on the question repeating the
            prompt's words.
            Or ``"predicted"`` (query-aware, one pass): scored as ``"attention"`` is, but before the late layers
            run, by the attention of the last exact rows' *predicted* late-layer queries (their layer inputs
            through the maps, then the layer's norm, query projection and RoPE) over every row's predicted
            keys (:meth:`ridgefill.fill._LateLayers.up_front_scores`); ``rounds`` is not used. The late layers
            then run once, with the chosen rows exact: the mode for engines that cannot rerun rows
            (recurrent layers, a llama.cpp graph). Needs input maps.
        min_score: a lexical part's threshold: only rows whose :func:`ngram_scores` score (not its
            contrast) is at least this and above 0 anchor a window. ``3`` (the preset) asks a row to end
            shared sequences weighing 3 (e.g. the 2-, 3- and 4-token ones, each found once outside
            the question, and no 5-token one): a quoted needle key does, and the part leaves ordinary prose's common phrases
            to the parts after it (research/log.md, "Row selection"). ``0`` takes any match. Only for
            ``by="ngram"``.
    """

    budget: float = 0.05
    before: int = 2
    after: int = 16
    queries: int = 1
    heads: Literal["sum", "max", "induction"] = "induction"
    rounds: int = 1
    sink: int = 1
    top_heads: int = 8
    contrast: int = 128
    by: Literal["attention", "leverage", "ngram", "predicted"] = "attention"
    reference: int = 0
    floor: float = 1.0
    min_score: float = 0.0

    def __post_init__(self):
        if not (self.budget > 0 and self.budget < float("inf")):
            raise InputError(f"select budget must be > 0 (a fraction of the prompt < 1, or rows); got {self.budget}")
        if self.budget >= 1 and self.budget != int(self.budget):
            raise InputError(f"select budget ≥ 1 is a row count and must be whole; got {self.budget}")
        if isinstance(self.floor, bool) or not (isinstance(self.floor, (int, float)) and 1e-6 <= self.floor < float("inf")):
            raise InputError(f"select floor must be a number ≥ 1e-6 (a share of uniform attention; smaller ones "
                             f"vanish in float32 and a row no one attends to scores 0/0); got {self.floor!r}")
        if isinstance(self.min_score, bool) or not (isinstance(self.min_score, (int, float)) and 0 <= self.min_score < float("inf")):
            raise InputError(f"select min_score must be a finite number ≥ 0 (a lexical part's threshold on its n-gram "
                             f"scores, e.g. 'ngram,min_score=3'; 0 takes any match); got {self.min_score!r}")
        if self.min_score > 0 and self.by != "ngram":
            raise InputError(f"select min_score={self.min_score} is a lexical part's threshold (by=ngram); "
                             f"leave it out of a by={self.by} part")
        for name in ("before", "after", "sink", "top_heads", "contrast", "reference"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"select {name} must be an int ≥ 0; got {getattr(self, name)!r}")
        if not isinstance(self.queries, int) or self.queries < 1:
            raise InputError(f"select queries must be an int ≥ 1; got {self.queries!r}")
        if self.heads not in ("sum", "max", "induction"):
            raise InputError(f"select heads must be 'sum', 'max' or 'induction'; got {self.heads!r}")
        if self.by not in ("attention", "leverage", "ngram", "predicted"):
            raise InputError(f"select by must be 'attention', 'leverage', 'ngram' or 'predicted'; got {self.by!r}")
        if self.top_heads < 1:
            raise InputError(f"select top_heads must be ≥ 1; got {self.top_heads}")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise InputError(f"select rounds must be an int ≥ 1; got {self.rounds!r}")

    def budget_rows(self, num_rows: int) -> int:
        """The budget in rows for a prompt of ``num_rows`` rows."""
        return int(self.budget * num_rows) if self.budget < 1 else int(self.budget)

    def __str__(self) -> str:
        """The ``--select`` spec of this part (:meth:`parse` reads it back): the ``key=value`` pairs that
        differ from the :class:`Select` defaults (``"attention"`` when none do), e.g.
        ``"budget=0.025,after=12"``; a query-agnostic or lexical part as its preset (``"prompt"``,
        ``"ngram"``) and the pairs that differ from it, e.g. ``"prompt,budget=35"``."""
        preset = next((name for name, kw in PRESETS.items() if kw["by"] == self.by), None)
        base = Select(**PRESETS[preset]) if preset else Select()
        pairs = [f"{f}={_spec_text(getattr(self, f))}" for f in self.__dataclass_fields__
                 if getattr(self, f) != getattr(base, f)]
        return ",".join(([preset] if preset else []) + pairs) or "attention"

    @classmethod
    def parse(cls, spec: str) -> "Select | Selection | None":
        """``"off"`` → ``None``; ``"on"`` or ``"default"`` → :data:`DEFAULT_SELECT`; ``"two-pass"`` /
        ``"one-pass"`` → :data:`TWO_PASS_SELECT` / :data:`ONE_PASS_SELECT`; ``"attention"`` →
        ``Select()`` (the attention rule alone); else ``key=value`` pairs separated by commas, e.g.
        ``"budget=0.025,before=2,after=12,queries=1,heads=sum,rounds=1,contrast=0"`` (missing keys: the
        :class:`Select` defaults);
        ``"prompt"`` for the query-agnostic preset (``by=leverage,before=14,after=2,contrast=0``),
        ``"ngram"`` for the lexical one (``by=ngram,before=4,after=16,queries=64,contrast=0,min_score=3``). Pairs
        may follow a preset after a comma (``"prompt,budget=35"``). Parts joined by ``+`` make a
        :class:`Selection` (each part its own budget and scoring), e.g.
        ``"budget=0.02,reference=63+budget=0.03,queries=256,before=0,after=3,contrast=0"``, and a last
        part ``total=F`` caps them together, e.g. ``"prompt,budget=35+attention+total=0.05"``.

        Raises:
            InputError: an unknown key or a value of the wrong type; ``"off"`` as one of several parts;
            a ``total`` that is not the last part, not a number, not > 0 or not whole when ≥ 1.
        """
        spec = spec.strip()
        if spec in ("off", "none", ""):
            return None
        if spec in ("on", "default"):
            return DEFAULT_SELECT
        if spec in NAMED:
            return NAMED[spec]()
        if spec == "attention":
            return Select()
        if spec.startswith("total"):
            raise InputError(f"select {spec!r}: 'total=F' caps the parts before it; join it last, e.g. "
                             "'prompt,budget=35+attention+total=0.05'")
        if "+" in spec:
            parts = [part.strip() for part in spec.split("+")]
            if not all(parts):
                raise InputError(f"select {spec!r} has an empty part: join non-empty parts with '+', e.g. "
                                 "'budget=0.02,reference=63+budget=0.03,queries=256,before=0,after=3,contrast=0'")
            total = None
            if parts[-1].startswith("total"):
                key, eq, value = parts.pop().partition("=")
                if key.strip() != "total" or not eq:
                    raise InputError(f"select {spec!r}: the last part must be 'total=F' (a fraction of the prompt "
                                     "< 1, or a row count), e.g. 'prompt,budget=35+attention+total=0.05'")
                try:
                    total = float(value)
                except ValueError:
                    raise InputError(f"select total={value.strip()!r}: not a number") from None
            if any(p.startswith("total") for p in parts):
                raise InputError(f"select {spec!r}: 'total=F' must be the last part, e.g. 'prompt,budget=35+attention+total=0.05'")
            return Selection(tuple(cls._parse_part(part) for part in parts), total)
        return cls._parse_part(spec)

    @classmethod
    def _parse_part(cls, spec: str) -> "Select":
        spec = spec.strip()
        if spec in ("off", "none"):
            raise InputError(f"select part {spec!r}: 'off' cannot be joined with other parts; leave the part out")
        kwargs: dict = {}
        preset = spec.split(",")[0].strip()
        if preset in ("on", "default"):
            raise InputError(f"select part {spec!r}: 'on' is the default selection, itself {len(DEFAULT_SELECT.parts)} "
                             f"parts ({DEFAULT_SELECT}); join its parts, or 'attention' for the attention rule alone")
        if preset in PRESETS or preset == "attention":
            kwargs = dict(PRESETS.get(preset, {}))
            spec = spec.partition(",")[2]
        for part in filter(None, spec.split(",")):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in cls.__dataclass_fields__:
                raise InputError(f"select option {part!r} is not key=value with a key among "
                                 f"{sorted(cls.__dataclass_fields__)}; e.g. 'budget=0.025,after=12'")
            try:
                kwargs[key] = value.strip() if key in ("heads", "by") else (float(value) if key in ("budget", "floor", "min_score") else int(value))
            except ValueError:
                raise InputError(f"select option {key}={value!r}: not a number (write e.g. 100 or 1e2; a '+' "
                                 "joins parts)") from None
        if preset == "ngram" and kwargs.get("by") != "ngram" and "min_score" not in spec:
            kwargs.pop("min_score")  # the preset's threshold goes with its by=ngram
        return cls(**kwargs)


@dataclass(frozen=True)
class Selection:
    """Several :class:`Select` parts in one prefill: each part scores the filled rows its own way and
    chooses rows within its own budget (a later part skips rows an earlier one chose). The parts chosen
    up front (``by="leverage"`` or ``"ngram"``) choose first, before the late layers, in their order; then the attention
    parts, in their order, all scored in the same pass (one recording per part) and sharing the rerun,
    so the cost is that of one selection with ``max(rounds) + 1`` passes and the parts' query rows and
    chosen rows together.

    A needle needs a few wide windows found by the last row's attention; the key tokens of a tail
    (names, terms it refers back to) need many narrow windows found by every tail row's attention
    (docs/evaluate.md, "Row selection"); a :class:`Selection` holds both. A lexical part with an
    attention part finds the needle whose key the question quotes, and under a ``total`` the attention
    part takes what the lexical part leaves (:data:`DEFAULT_SELECT` has the key-token rule's two attention parts
    after the lexical one).

    Attributes:
        parts: the :class:`Select` parts, in the order they choose within each kind (up front: leverage
            and n-gram; then attention).
        total: ``None`` (the budget is the sum of the parts'), or a cap on all parts together: a fraction
            of the prompt when ``< 1``, else a row count (spec: a last part ``total=F``). Each part
            chooses within its own budget and within what the parts that chose before it left of the
            total: the parts chosen up front first, then attention parts, each in list order, round by round; an
            attention part keeps the share of its later rounds from the attention parts listed after it. With
            ``"prompt,budget=35+attention+total=0.05"`` the leverage part takes 35 rows and the
            attention part the rest of 5 % of the prompt (below 700 rows 5 % is under 35 rows, and the
            leverage part takes it all).

    Raises:
        InputError: no parts, a part that is not a :class:`Select`, or a total that is not > 0 (or not
        whole when ≥ 1).
    """

    parts: tuple[Select, ...]
    total: float | None = None

    def __post_init__(self):
        if not isinstance(self.parts, tuple) or not self.parts or not all(isinstance(p, Select) for p in self.parts):
            raise InputError(f"a Selection needs a non-empty tuple of Select parts; got {self.parts!r}")
        t = self.total
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")
                              or (t >= 1 and t != int(t))):
            raise InputError(f"select total must be a fraction of the prompt in (0, 1) or a whole row count ≥ 1; got {t!r}")

    def budget_rows(self, num_rows: int) -> int:
        """The total budget in rows for a prompt of ``num_rows`` rows: the sum of the parts', capped by
        :attr:`total` when it is set."""
        rows = sum(p.budget_rows(num_rows) for p in self.parts)
        return rows if self.total is None else min(rows, Select(budget=self.total).budget_rows(num_rows))

    @property
    def rounds(self) -> int:
        """Attention rounds (the most of any attention part; ``0``: every part is chosen up front)."""
        return max((p.rounds for p in self.parts if p.by == "attention"), default=0)

    @property
    def by(self) -> str:
        """``"attention"`` if any part scores by attention (then the fill runs two passes), else the first
        part's (``"leverage"``, ``"ngram"`` or ``"predicted"``: every row is chosen before the late layers)."""
        return "attention" if self.rounds else self.parts[0].by

    @property
    def passes(self) -> int:
        """Passes of the late layers: ``1`` when every part is chosen up front, else ``rounds + 1``."""
        return self.rounds + 1

    @property
    def queries(self) -> int:
        """Rows scored per round (query and reference rows), over the attention parts (they may
        overlap; counted apart)."""
        return self.scored_rows()

    def scored_rows(self, exact_rows: int | None = None) -> int:
        """Rows scored per round over the attention parts (the one-pass parts when there are no attention
        parts), each part at most ``exact_rows`` (the exact rows there are: a part gets the last
        ``queries + reference`` of them)."""
        cap = float("inf") if exact_rows is None else exact_rows
        by = "attention" if self.rounds else "predicted"
        return sum(min(p.queries + p.reference, cap) for p in self.parts if p.by == by)

    def cost_args(self, exact_rows: int) -> dict:
        """The :func:`ridgefill.costs.fill_cost` arguments that describe this selection's passes and scoring
        (``rounds``, ``queries``, ``predicted``), with ``exact_rows`` exact rows before the choice."""
        predicted = not self.rounds and any(p.by == "predicted" for p in self.parts)
        return {"rounds": self.rounds, "queries": self.scored_rows(exact_rows), "predicted": predicted}

    def __str__(self) -> str:
        """The ``--select`` spec: the parts' specs joined by ``+``, then ``+total=F`` when a total is set
        (:meth:`Select.parse` reads it back)."""
        total = [] if self.total is None else [f"total={_spec_text(self.total)}"]
        return "+".join([str(p) for p in self.parts] + total)


def uses_leverage(select: "Select | Selection | None") -> bool:
    """Whether a selection has a query-agnostic part (``by="leverage"``): it needs maps with the
    calibration covariance in every fill mode, also ``"identity"`` and ``"none"``."""
    return select is not None and any(p.by == "leverage" for p in as_selection(select).parts)


def check_leverage_stats(select: "Select | Selection | None", maps) -> None:
    """Raise :class:`~ridgefill.errors.InputError` when ``select`` has a query-agnostic part and ``maps``
    lack the calibration mean and covariance of ``h_S`` (``RidgeMaps.mean_h``, ``cov_h``) that score it.

    Input maps from this version's ``ridgefill calibrate`` store both; K/V maps (``--targets kv``) and
    maps files without their ``.stats.safetensors`` from before they were stored do not.
    """
    if uses_leverage(select) and (maps is None or maps.mean_h is None or maps.cov_h is None):
        kv = maps is not None and getattr(maps, "kind", "inputs") != "inputs"
        raise InputError(f"select {select} has a query-agnostic part (by='leverage'), "
                         "which needs maps with the calibration mean and covariance of h_S (RidgeMaps.mean_h, "
                         "cov_h); " + ("K/V maps do not store them: " if kv else "these maps have none: ")
                         + "pass input maps fitted by this version of `ridgefill calibrate` (or with their "
                         "statistics file beside them), or an attention-only selection ('--select attention', "
                         "Select())")


def needs_maps(mode: str, select: "Select | Selection | None" = None) -> bool:
    """Whether a prefill in fill ``mode`` with ``select`` needs a maps file: modes ``"ridge"`` and
    ``"centred"`` fill from it, and a query-agnostic part scores with its calibration covariance in any
    mode (:func:`uses_leverage`)."""
    return mode in ("ridge", "centred") or uses_leverage(select)


def as_selection(select: "Select | Selection") -> Selection:
    """A :class:`Select` as a one-part :class:`Selection`; a :class:`Selection` unchanged."""
    return select if isinstance(select, Selection) else Selection((select,))


def runs_on_recurrent(select: "Select | Selection | None") -> bool:
    """Whether a model with recurrent-state layers can run ``select``: a recurrent layer's state advances once
    over the rows in order, so every exact row must be known before the late layers run (one pass, or no
    selection). ``prefill``, :func:`resolve_auto` and ``ridgefill tune`` decide by it."""
    return select is None or as_selection(select).passes == 1


#: The attention parts of the default (the "key-token rule", research/log.md, "Row selection"): 2 % of the
#: prompt in wide windows where the last row's attention exceeds the 63 rows' before it (a needle), then 3 % in
#: narrow windows (0 before, 3 after) where every one of the last 256 exact rows attends (the names and
#: terms the tail refers back to).
KEY_TOKEN_PARTS = (Select(budget=0.02, reference=63), Select(budget=0.03, queries=256, before=0, after=3, contrast=0))

#: The two-pass selection (``--select two-pass``), ``"ngram,budget=0.02+budget=0.02,reference=63+budget=0.03,
#: before=0,after=3,queries=256,contrast=0+total=0.05"``: the lexical part with up to 2 % of the prompt (a
#: window around each row that ends a quoted sequence scoring ``min_score = 3``, such as a needle's key),
#: then :data:`KEY_TOKEN_PARTS` for the rest of 5 %, scored in a first pass of the late layers. On SmolLM2 at
#: S = 15 with the default mix maps: 16, 16, 16, 14 single needles at 1K-8K (exact 16, 16, 16, 13), 14, 10,
#: 11, 7 multikey (exact 11, 8, 11, 4), key-token ΔNLL +0.456 (plain ridge +1.617) with the plain maps
#: (docs/evaluate.md has the figures of the context maps, the default). A question that does not quote the
#: prompt leaves the lexical part no anchor, and its budget goes to the attention parts.
TWO_PASS_SELECT = Selection((Select(**NGRAM_PRESET, budget=0.02), *KEY_TOKEN_PARTS), total=0.05)

#: The one-pass selection (``--select one-pass``): :data:`TWO_PASS_SELECT` with its attention parts scored
#: before the late layers, from the tail's predicted queries over every row's predicted keys
#: (``by="predicted"``); the late layers run once (docs/evaluate.md, "One pass or two").
ONE_PASS_SELECT = Selection((Select(**NGRAM_PRESET, budget=0.02),
                             *(Select(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "by": "predicted"})
                               for p in KEY_TOKEN_PARTS)), total=0.05)

#: The selection ``--select on`` names everywhere (``ridgefill run``'s and ``prefill``'s default through
#: ``auto`` when the maps record none; ``ridgefill bench``, ``generate``, ``eval``): :data:`ONE_PASS_SELECT`
#: (docs/evaluate.md, "One pass or two", has the comparison that decides it). K/V maps cannot predict the
#: queries it scores with: ``auto`` takes :data:`TWO_PASS_SELECT` with them (:func:`resolve_auto`).
DEFAULT_SELECT = ONE_PASS_SELECT


def _host(x, dtype) -> np.ndarray:
    """A host NumPy array of ``dtype`` from a NumPy array, a list or a tensor (a device tensor is read to the
    host: one synchronisation; a host tensor is viewed)."""
    if isinstance(x, Tensor):
        x = x.detach()
        x = x.numpy() if x.device.type == "cpu" else x.cpu().numpy()
    return np.asarray(x, dtype=dtype)


def choose_rows(scores, candidates, select: Select, budget: int) -> np.ndarray:
    """The extra exact rows: best-scoring candidates, each widened, until ``budget`` rows. Runs on the host.

    Args:
        scores: ``[N]`` float (NumPy or a host tensor), one score per position (only ``candidates`` are read).
        candidates: ``[N]`` bool, the positions that may be chosen (the filled rows).
        budget: the most rows to return.

    Returns:
        Sorted ``int64`` NumPy positions ``[k]``, ``k ≤ budget``, all among ``candidates``: first the
        candidates among the ``select.sink`` first rows, then windows around the best-scoring other
        candidates (by :func:`local_contrast` when ``select.contrast > 0``; ties by position). A window
        that would overflow the budget is cut to fit it. A lexical part (``select.by == "ngram"``) anchors
        windows only at candidates whose own score (before any contrast) is above 0 and at least
        ``select.min_score``: with no such row left it leaves the rest of its budget unspent.
    """
    scores = _host(scores, np.float32)
    candidates = _host(candidates, bool).copy()  # the sink rows are taken out below
    n = scores.shape[0]
    chosen = np.zeros(n, dtype=bool)
    sink = np.arange(min(select.sink, n))
    sink = sink[candidates[sink]][:max(budget, 0)]
    chosen[sink] = True
    candidates[: select.sink] = False
    anchors = candidates  # the rows a window may be centred on
    if select.by == "ngram":  # a lexical match, above the threshold, on the score itself (not its contrast)
        anchors = candidates & (scores > 0) & (scores >= select.min_score)
    if select.contrast > 0:
        scores = local_contrast(scores, candidates, select.contrast)
    ranked = np.where(anchors, scores, np.float32(-np.inf))
    order = np.argsort(-ranked, kind="stable")[: int(anchors.sum())]  # anchors, best first, ties by position
    used = sink.size
    for r in order:
        if used >= budget:
            break
        if chosen[r]:
            continue
        lo, hi = max(0, r - select.before), min(n, r + select.after + 1)
        window = lo + np.flatnonzero(candidates[lo:hi] & ~chosen[lo:hi])
        window = window[: budget - used]
        chosen[window] = True
        used += window.size
    return np.flatnonzero(chosen).astype(np.int64)


def local_contrast(scores, candidates, width: int) -> np.ndarray:
    """``scores / (m + 0.01 / N)``: each score over the mean ``m`` of the candidates' scores within
    ``width`` rows of it (itself included), ``[N]`` float32 NumPy; non-candidates are left out of every
    mean. Runs on the host.

    The floor ``0.01 / N`` (1 % of uniform attention over ``N`` rows) keeps rows that no query attends
    to from ranking high on noise.
    """
    scores = _host(scores, np.float32).astype(np.float64)  # float64 sums: window means of small probabilities
    candidates = _host(candidates, bool)
    n = scores.shape[0]
    s = np.where(candidates, scores, 0.0)
    total = np.concatenate([[0.0], np.cumsum(s)])
    count = np.concatenate([[0.0], np.cumsum(candidates, dtype=np.float64)])
    idx = np.arange(n)
    lo, hi = np.clip(idx - width, 0, None), np.clip(idx + width + 1, None, n)
    mean = (total[hi] - total[lo]) / np.clip(count[hi] - count[lo], 1, None)
    return (scores / (mean + 0.01 / n)).astype(np.float32)


def ngram_scores(input_ids, queries, sizes: tuple[int, ...] = NGRAM_SIZES) -> np.ndarray:
    """Lexical row scores: for each row outside ``queries``, the sum over the ``k``-token sequences (``k`` in
    ``sizes``) that end at it and also end at a query row of ``1 / (the number of rows outside the
    queries that end it)``, averaged over the batch (so :attr:`Select.min_score` means the same for a
    batch as for one prompt). Runs on the host, from the token ids (no model).

    Args:
        input_ids: ``[batch, N]`` int64 token ids (NumPy or a host tensor).
        queries: ``[q]`` int64 positions of the query rows (in ``prefill``, the tail's last
            ``Select.queries`` rows); a sequence ending at a query row may start before it.

    Returns:
        ``[N]`` float32 NumPy; ``0`` at the query rows and where a row ends no shared sequence. Rare and
        long shared sequences weigh more: a needle's key, quoted by the question, ends sequences of every
        length up to 5 found once in the prompt, and outscores the phrase every needle shares and a common
        phrase of the question (research/log.md, "Row selection"). How often the question repeats a
        sequence does not count.
    """
    input_ids, queries = _host(input_ids, np.int64), _host(queries, np.int64)
    n = input_ids.shape[1]
    outside = np.ones(n, dtype=bool)
    outside[queries] = False
    scores = np.zeros(n, dtype=np.float64)
    vocab = int(input_ids.max()) + 1
    for ids in input_ids:
        gram = ids  # gram[j]: an id of the k-token sequence ending at row j + k - 1 (equal iff the sequences are)
        for k in range(1, min(max(sizes), n) + 1):
            if k > 1:  # a k-token sequence is the (k-1)-token one before its last row, then that row's token
                _, gram = np.unique(gram[:-1] * vocab + ids[k - 1:], return_inverse=True)
            if k not in sizes:
                continue
            ends = outside[k - 1:]
            count = np.bincount(gram[ends], minlength=int(gram.max()) + 1)
            wanted = np.zeros(count.shape[0], dtype=bool)
            wanted[gram[queries[queries >= k - 1] - (k - 1)]] = True
            hit = wanted[gram] & ends
            scores[k - 1:] += np.where(hit, 1.0 / np.clip(count[gram], 1, None), 0.0)
    return (scores / input_ids.shape[0]).astype(np.float32)


def leverage_scores(h: Tensor, mean_h: Tensor, cov_h: Tensor) -> Tensor:
    """Query-agnostic row scores: ``(h − h̄)ᵀ (C + ε I)⁻¹ (h − h̄)`` per row, summed over the batch.

    Args:
        h: split states ``h_S`` ``[batch, N, d]``; mean_h: ``h̄`` ``[d]``; cov_h: ``C`` ``[d, d]``, the
            calibration mean and covariance of ``h_S`` (``RidgeMaps.mean_h``, ``RidgeMaps.cov_h``).

    Returns:
        ``[N]`` float32 on the device of ``h``. ``ε`` is ``10⁻³`` of the mean variance (``tr C / d``). A row
        far from the calibration distribution in the directions it rarely varies along is one the maps
        extrapolate on; on SmolLM2 at S = 15 a needle's tokens rank among the top 3 of ~2,000 rows
        (docs/evaluate.md).
    """
    c = cov_h.to(device=h.device, dtype=torch.float64)
    eye = torch.eye(c.shape[0], dtype=c.dtype, device=c.device)
    d = h.double() - mean_h.to(device=h.device, dtype=torch.float64)  # [b, N, d]
    # solve_ex: no singularity check to read back (C + εI is positive definite)
    solved = torch.linalg.solve_ex(c + 1e-3 * c.diagonal().mean() * eye, d.transpose(-1, -2))[0]  # [b, d, N]
    return (d.transpose(-1, -2) * solved).sum(dim=(0, 1)).float()


#: Random token sequence of the induction score: its length and seed (:func:`induction_scores`).
INDUCTION_PROBE = (256, 0)


@torch.inference_mode()
def induction_scores(adapter, length: int = INDUCTION_PROBE[0], seed: int = INDUCTION_PROBE[1]) -> Tensor:
    """Per layer and head: the induction (copy) score, ``[layers, heads]`` float32 on the host.

    A random sequence of ``length`` token ids (seeded; ids from the upper seven eighths of the
    vocabulary, away from special tokens) is repeated once and run through the exact model; a head's
    score is the mean attention each token of the second copy pays to the token that followed its first
    occurrence (the pattern of induction heads, Olsson et al. 2022, which copying a needle's value
    needs). No text and no labels: it depends on the weights only. ``ridgefill calibrate`` stores it in
    the maps file (``RidgeMaps.induction``), so a prefill reads it from there; for maps without it, it
    is computed once per adapter and cached there.
    """
    cached = getattr(adapter, "_induction_scores", None)
    if cached is not None and cached[0] == (length, seed):
        return cached[1]
    vocab = adapter.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(vocab // 8, vocab, (length,), generator=g)
    device = next(adapter.model.parameters()).device
    ids = torch.cat([base, base])[None].to(device)
    n = ids.shape[1]
    pos = torch.arange(n, device=device)
    x = adapter.embed(ids)
    rope = adapter.rope(pos, x)
    second = torch.arange(length, n - 1, device=device)  # query rows of the second copy (but the last)
    target = second - length + 1  # the row after each one's first occurrence
    out = []
    for layer in range(adapter.num_layers):
        shape = (1, adapter.num_kv_heads, n, adapter.head_dim)
        keys = x.new_empty(shape)
        x_in = x
        x = adapter.layer(layer, x, rope, pos, keys, x.new_empty(shape))
        if adapter.is_recurrent(layer):
            out.append(torch.zeros(adapter.num_heads, device=device))
            continue
        p = attention_probs(adapter, layer, x_in[:, second], rope.rows(second), second, keys, None)[0]  # [H, q, N]
        out.append(p[:, torch.arange(second.numel(), device=device), target].mean(-1).float())
    scores = torch.stack(out).cpu()  # one read
    adapter._induction_scores = ((length, seed), scores)
    return scores


def attention_probs(adapter, layer: int, x: Tensor, rope, positions: Tensor, keys: Tensor,
                    visible: Tensor | None) -> Tensor:
    """Softmax attention ``[batch, heads, q, N]`` (float32) of rows with layer input ``x`` ``[batch, q, d]``
    at ``positions`` ``[q]`` over the ``N`` keys ``[batch, kv_heads, N, head_dim]`` each can see. Holds the
    whole ``heads × q × N`` tensor: for short probes (:func:`induction_scores`) and tests;
    :class:`AttentionScores` scores in chunks of keys."""
    q = adapter.queries(layer, x, rope)  # [b, H, q, hd]
    b, kvh, n, hd = keys.shape
    k = keys[:, :, None].expand(b, kvh, adapter.num_heads // kvh, n, hd).reshape(b, -1, n, hd).to(q.dtype)
    logits = (q @ k.transpose(-1, -2)).float() * adapter.scaling
    mask = adapter.visible_keys(layer, positions, keys.shape[2], visible)
    if mask is None:
        mask = torch.arange(keys.shape[2], device=q.device)[None, :] <= positions[:, None]
    return logits.masked_fill(~mask, float("-inf")).softmax(-1)


def kept_heads(select: Select, induction: Tensor, num_layers: int, num_heads: int) -> list[list[int]]:
    """The heads an attention part scores, per layer (host lists of head indices): every head for
    ``heads="sum"`` or ``"max"``; for ``"induction"`` the ``select.top_heads`` heads with the highest
    ``induction`` score (``[layers, heads]``, :func:`induction_scores`), ties by position."""
    if select.heads != "induction":
        return [list(range(num_heads))] * num_layers
    flat = _host(induction, np.float32).reshape(-1)
    top = np.argsort(-flat, kind="stable")[: select.top_heads]
    out: list[list[int]] = [[] for _ in range(num_layers)]
    for i in sorted(top.tolist()):
        out[i // num_heads].append(i % num_heads)
    return out


class AttentionScores:
    """Scores every position by the attention of the last ``select.queries`` exact (or predicted) rows in
    the kept heads (:func:`kept_heads`), relative to the ``select.reference`` rows before them when that
    is set, reduced over heads and layers as ``select.heads`` says. The scores stay on the device
    (``scores``, ``[N]`` float32) until the planner reads them.

    The softmax is taken over the keys each query row can see, in chunks of keys (two sweeps: the
    log-sum-exp, then the probabilities and their reduction), and only for the kept heads, so the extra
    memory is ``O(kept heads · query rows · chunk)``, never ``heads · query rows · N``.

    Args:
        adapter: the model's adapter (or an object with its ``queries``, ``visible_keys``, ``num_heads``,
            ``num_kv_heads``, ``num_layers`` and ``scaling``).
        num_rows: ``N``.
        select: the part (``by="attention"`` or ``"predicted"``).
        induction: ``[layers, heads]`` induction scores (:func:`induction_scores`; ``RidgeMaps.induction``),
            read for ``heads="induction"``; ``None`` computes them from ``adapter``.
    """

    #: Upper bound, in bytes, of one chunk's float32 logits (``batch · kept heads · query rows · keys``).
    chunk_bytes: int = 16 * 2 ** 20

    def __init__(self, adapter, num_rows: int, select: Select, induction: Tensor | None = None):
        self.adapter, self.select, self.num_rows = adapter, select, num_rows
        device = next(adapter.model.parameters()).device
        self.scores = torch.zeros(num_rows, dtype=torch.float32, device=device)
        self.rows = select.queries + select.reference  # the exact rows :meth:`add` is given (at most)
        if select.heads == "induction" and induction is None:
            induction = induction_scores(adapter)
        self.heads = kept_heads(select, induction, adapter.num_layers, adapter.num_heads)
        self._index = {}  # layer -> (query heads, their KV heads) as device index tensors

    def layers(self) -> list[int]:
        """The layers with a kept head (the others are not scored)."""
        return [layer for layer, heads in enumerate(self.heads) if heads]

    def add(self, layer: int, x: Tensor, rope, positions: Tensor, keys: Tensor, visible: Tensor | None,
            host: np.ndarray | None = None) -> None:
        """``x`` ``[batch, q, d]``: the input of ``layer`` of the last ``q ≤ self.rows`` exact rows at
        ``positions`` ``[q]`` (reference rows first, then the ``select.queries`` query rows; ``host``: the
        same positions as a host array, read from ``positions`` when not given); ``keys`` ``[batch,
        kv_heads, N, head_dim]`` the layer's cache after those rows wrote theirs."""
        heads = self.heads[layer]
        if not heads:
            return
        ad = self.adapter
        if layer not in self._index:
            group = ad.num_heads // ad.num_kv_heads
            self._index[layer] = (torch.tensor(heads, device=x.device),
                                  torch.tensor([h // group for h in heads], device=x.device))
        q_heads, kv_heads = self._index[layer]
        host = positions.cpu().numpy() if host is None else host
        q = ad.queries(layer, x, rope).index_select(1, q_heads)  # [b, Hk, q, hd]
        b, hk, nq, _ = q.shape
        lo, hi = ad.key_range(layer, host, keys.shape[2])
        step = max(1, self.chunk_bytes // (4 * b * hk * nq))
        chunks = [(c0, min(hi, c0 + step)) for c0 in range(lo, hi, step)]

        def logits(c0: int, c1: int) -> Tensor:
            k = keys[:, :, c0:c1].index_select(1, kv_heads).to(q.dtype)  # [b, Hk, C, hd]
            out = (q @ k.transpose(-1, -2)).float().mul_(ad.scaling)
            mask = ad.visible_keys(layer, positions, c1 - c0, visible, first_key=c0)
            if mask is None:  # every row and key in order: plain causal
                mask = torch.arange(c0, c1, device=q.device)[None, :] <= positions[:, None]
            return out.masked_fill_(~mask, float("-inf"))

        lse = q.new_full((b, hk, nq, 1), float("-inf"), dtype=torch.float32)
        for c0, c1 in chunks:
            lse = torch.logaddexp(lse, logits(c0, c1).logsumexp(-1, keepdim=True))
        k = min(self.select.queries, nq)
        floor = self.select.floor / keys.shape[2]
        for c0, c1 in chunks:
            p = logits(c0, c1).sub_(lse).exp_()  # [b, Hk, q, C]
            if nq > k:  # reference rows: each head's query attention over their mean (+ floor / N)
                p = p[:, :, -k:] / (p[:, :, :-k].mean(2, keepdim=True) + floor)
            p = p.sum(dim=(0, 2))  # [Hk, C]
            part = self.scores[c0:c1]
            if self.select.heads == "sum":
                part += p.sum(0)
            elif self.select.heads == "max":
                part += p.amax(0)
            else:
                torch.maximum(part, p.amax(0), out=part)


class Planner:
    """The row selection of one prompt: which rows each part of a :class:`Selection` makes exact, decided on
    the host from scores read once per round.

    Each part chooses within its own budget and within what the parts that chose before it left of the
    selection's total (:attr:`Selection.total`): the parts chosen up front (``by="leverage"``, ``"ngram"``,
    ``"predicted"``) first, in their order (:meth:`up_front`, before the late layers); then the attention
    parts, in their order, round by round (:meth:`after_pass`, from the scores their :meth:`scorers`
    recorded in the pass before), an attention part keeping the share of its later rounds from those listed
    after it.

    Args:
        selection: the parts and total.
        num_rows: ``N``, the prompt length.
    """

    def __init__(self, selection: Selection, num_rows: int):
        self.selection = selection
        self.parts, self.num_rows = selection.parts, num_rows
        self.rounds = selection.rounds
        self.total = selection.budget_rows(num_rows)
        self.taken = [np.zeros(0, dtype=np.int64) for _ in self.parts]

    @property
    def chosen(self) -> np.ndarray:
        """Sorted ``int64`` ``[k]`` (host): every row chosen so far, over all parts."""
        return np.sort(np.concatenate(self.taken))

    def _choose(self, part: int, scores: np.ndarray, budget: int, exact: np.ndarray, r: int = -1) -> np.ndarray:
        """Part ``part`` chooses up to ``budget`` rows in all among the rows not in ``exact`` (``r``: the
        attention round, ``-1`` up front); returns the new exact set (sorted host ``int64``)."""
        n = self.num_rows
        filled = np.ones(n, dtype=bool)
        filled[exact] = False
        kept = sum(max(0, self.parts[j].budget_rows(n) - self.taken[j].size) for j in range(part)
                   if self.parts[j].by == "attention" and r + 1 < self.parts[j].rounds) if r >= 0 else 0
        left = self.total - sum(t.size for t in self.taken) - kept
        new = choose_rows(scores, filled, self.parts[part], max(0, min(budget - self.taken[part].size, left)))
        self.taken[part] = np.concatenate([self.taken[part], new])
        return np.union1d(exact, new)

    def ngram_queries(self, part: Select, tail: int) -> np.ndarray:
        """The query rows of a lexical part: the tail's last ``part.queries`` rows (never rows outside the tail)."""
        n = self.num_rows
        return np.arange(max(n - tail, n - part.queries), n)

    def up_front(self, input_ids: np.ndarray, tail: int, exact: np.ndarray,
                 device_scores: dict[int, np.ndarray]) -> np.ndarray:
        """The parts chosen before the late layers, in order: a lexical part scores the host token ids
        ``input_ids`` ``[batch, N]`` against the tail's last ``queries`` rows; a query-agnostic or predicted
        part reads its scores from ``device_scores`` (``{part index: [N] host scores}``, read from the device
        once). Returns the new exact set (sorted host ``int64``)."""
        n = self.num_rows
        lexical: dict[int, np.ndarray] = {}  # a lexical part's scores per question length, once each
        for i, part in enumerate(self.parts):
            if part.by == "attention":
                continue
            if part.by == "ngram":
                if part.queries not in lexical:
                    lexical[part.queries] = ngram_scores(input_ids, self.ngram_queries(part, tail))
                scores = lexical[part.queries]
            else:
                scores = device_scores[i]
            exact = self._choose(i, scores, part.budget_rows(n), exact)
        return exact

    def device_parts(self) -> list[int]:
        """Indices of the up-front parts scored on the device (``by="leverage"`` or ``"predicted"``)."""
        return [i for i, p in enumerate(self.parts) if p.by in ("leverage", "predicted")]

    def scorers(self, adapter, r: int, induction: Tensor | None = None) -> dict[int, AttentionScores]:
        """``{part index: AttentionScores}`` for the attention parts that still choose in round ``r``."""
        return {i: AttentionScores(adapter, self.num_rows, p, induction) for i, p in enumerate(self.parts)
                if p.by == "attention" and r < p.rounds}

    def after_pass(self, r: int, scores: dict[int, np.ndarray], exact: np.ndarray) -> np.ndarray:
        """Round ``r``: each attention part chooses its share (``budget·(r+1)/rounds`` in all) from its host
        scores (``{part index: [N]}``, read once after the pass). Returns the new exact set."""
        for i, s in scores.items():
            part = self.parts[i]
            if r < part.rounds:
                exact = self._choose(i, s, part.budget_rows(self.num_rows) * (r + 1) // part.rounds, exact, r)
        return exact


def read_scores(scores: dict[int, Tensor]) -> dict[int, np.ndarray]:
    """Device score vectors ``{key: [N]}`` read to the host in one transfer."""
    if not scores:
        return {}
    keys = list(scores)
    host = torch.stack([scores[k].float() for k in keys]).cpu().numpy()
    return dict(zip(keys, host))


#: The named settings of ``--select`` on the product commands (``run``, ``generate``, ``bench``, ``tune``), each
#: but ``auto`` optionally followed by ``,budget=F`` (:func:`parse_setting`); ``ridgefill eval`` takes the full
#: spec language of :meth:`Select.parse`.
SETTINGS = ("auto", "on", "two-pass", "one-pass", "prompt", "off")

#: The named selections a spec may name whole (:meth:`Select.parse`; they are what ``ridgefill tune`` records
#: in a maps file).
NAMED = {"two-pass": lambda: TWO_PASS_SELECT, "one-pass": lambda: ONE_PASS_SELECT}


def setting_name(select: "Select | Selection | None") -> str:
    """A resolved selection as a user names it: ``"off"`` for none, a named setting (:data:`NAMED`) where it is
    one, else its spec (:meth:`Select.parse` reads it back)."""
    if select is None:
        return "off"
    return next((name for name, make in NAMED.items() if make() == select), str(select))


def _scaled(selection: Selection, budget: float, value: str) -> Selection:
    """``selection`` with its parts scaled so that they choose at most ``budget`` of the prompt together."""
    if not 0 < budget < 1:
        raise InputError(f"--select {value!r}: the budget of a query-aware setting is a share of the prompt in "
                         "(0, 1), e.g. 0.1")
    scale = budget / selection.total
    return Selection(tuple(Select(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "budget": p.budget * scale})
                           for p in selection.parts), total=budget)


def parse_setting(value: str) -> "Select | Selection | str | None":
    """A named selection setting, ``NAME`` or ``NAME,budget=F``:

    - ``auto`` (the default): the setting recorded in the maps (``ridgefill tune`` writes it,
      :attr:`ridgefill.maps.RidgeMaps.select`), else ``on`` (``two-pass`` with K/V maps); returned as the string
      ``"auto"``, which :func:`ridgefill.prefill` resolves against its maps.
    - ``on`` (:data:`DEFAULT_SELECT`, the same as ``one-pass``): query-aware, its attention parts scored before
      the late layers from predicted queries; the question must be in the tail. With ``budget=F`` (a share
      of the prompt, ``0 < F < 1``) its parts are scaled so that they choose at most ``F`` of the prompt
      together (``0.05`` unscaled).
    - ``one-pass`` (:data:`ONE_PASS_SELECT`), ``two-pass`` (:data:`TWO_PASS_SELECT`): the query-aware selection
      with its attention parts scored before the late layers (one pass), or after a first pass of them;
      ``budget=F`` as for ``on``.
    - ``prompt``: query-agnostic, one pass: rows the maps extrapolate on, by the leverage of ``h_S`` under
      the calibration covariance (for a document whose question comes later); ``budget=F`` a share of
      the prompt or a row count (default ``0.05``). Finds rare spans only relative to the calibration text.
    - ``off``: the plain fill.

    Raises:
        InputError: another name, another key than ``budget``, or a budget out of range.
    """
    name, _, rest = value.strip().partition(",")
    name = name.strip()
    if name not in SETTINGS:
        raise InputError(f"--select {value!r}: use one of {', '.join(SETTINGS)}, optionally with ',budget=F' "
                         "(e.g. 'on,budget=0.1'); `ridgefill eval` takes the full spec language")
    budget = None
    if rest.strip():
        key, eq, text = rest.partition("=")
        if key.strip() != "budget" or not eq:
            raise InputError(f"--select {value!r}: only ',budget=F' may follow the name, e.g. '{name},budget=0.1'")
        try:
            budget = float(text)
        except ValueError:
            raise InputError(f"--select {value!r}: budget {text.strip()!r} is not a number") from None
    if name in ("off", "auto"):
        if budget is not None:
            raise InputError(f"--select {value!r}: '{name}' takes no budget"
                             + (" (it follows the maps' setting)" if name == "auto" else ": it chooses no rows"))
        return None if name == "off" else "auto"
    if name == "prompt":
        return Select(**PROMPT_PRESET) if budget is None else Select(**PROMPT_PRESET, budget=budget)
    selection = DEFAULT_SELECT if name == "on" else NAMED[name]()
    return selection if budget is None else _scaled(selection, budget, value)


def as_select(value: "str | Select | Selection | None") -> "Select | Selection | None":
    """``select`` as given to :func:`ridgefill.prefill`: a spec string (:meth:`Select.parse`, e.g. ``"on"``,
    ``"off"``, ``"prompt"``), a :class:`Select`, a :class:`Selection`, or ``None`` (off).

    Raises:
        InputError: another type, or a bad spec string.
    """
    if value is None or isinstance(value, (Select, Selection)):
        return value
    if isinstance(value, str):
        return Select.parse(value)
    raise InputError(f"select must be a spec string such as 'on' or 'off', a ridgefill.select.Select, a Selection or "
                     f"None; got {type(value).__name__}")


def resolve_auto(select: "str | Select | Selection | None", recorded: str | None,
                 recurrent: bool = False, inputs: bool = True) -> "Select | Selection | None":
    """``select`` as :func:`ridgefill.prefill` and the vLLM plugin read it: ``"auto"`` is ``recorded`` (the setting a
    maps file records, :attr:`ridgefill.maps.RidgeMaps.select`, written by ``ridgefill tune``), else ``"on"``
    (:data:`DEFAULT_SELECT`, one pass), or ``"two-pass"`` where the fill reads K/V maps (``inputs`` false: they
    predict no queries to score with); on a model with recurrent-state layers (``recurrent``) a recorded setting
    only if it runs one pass, else ``"one-pass"``; anything else as :func:`as_select`.

    Raises:
        InputError: as :func:`as_select` (a bad spec, given or recorded).
    """
    if isinstance(select, str) and select.strip() == "auto":
        if recorded is not None:
            chosen = as_select(recorded)
            if not recurrent or runs_on_recurrent(chosen):
                return chosen
        return as_select("one-pass" if recurrent else "on" if inputs else "two-pass")
    return as_select(select)
