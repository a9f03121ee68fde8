"""Calibration: one streaming pass over text that accumulates the ridge statistics, then the fit.

For each chunk of ``chunk`` tokens the model runs layers ``0..L-2`` (through its adapter, the same
layer code the fill uses) and the pairs ``(h_S, x_l)`` for every late layer ``l > S`` are added to
float64 sufficient statistics (:class:`ridgefill.ridge.RidgeStats`); activations are dropped after each
chunk, so memory does not grow with the amount of text. Every ``heldout_every``-th chunk goes to
held-out statistics, which choose ``λ`` per layer when ``lam="auto"``. With a ``checkpoint`` file the
statistics are saved every few chunks and an interrupted pass resumes from them
(:mod:`ridgefill.checkpoint`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from . import defaults
from .adapters import adapter_for
from .errors import InputError, WriteError
from .checkpoint import chunks_digest, load_checkpoint, save_checkpoint
from .data.overlap import fingerprint, sample_for
from .data.texts import calibration_texts, text_hash
from .maps import RidgeMaps, calibration_cov, context_features, model_hash, model_provenance, weight_fingerprint
from .validate import check_context, check_int, check_real
from .ridge import RidgeStats, check_context_penalty, fit_maps
from .select import induction_scores


def special_prefix(tokenizer) -> list[int]:
    """The special token ids the tokenizer puts before a text of its own accord: ``[<bos>]`` for
    Gemma 3, none for SmolLM2. Every calibration chunk, evaluation document and needle prompt starts
    with them, as the model's training documents did."""
    probe = "The"
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i: i + len(plain)] == plain:
            return full[:i]
    return []


def calibration_chunks(tokenizer, texts: Sequence[str] | Mapping[str, str], tokens: int | None,
                       chunk: int) -> list[Tensor]:
    """Cut the texts into ``[chunk]`` int64 token chunks, spread evenly over every text.

    Each text is tokenized on its own and cut into whole chunks, each starting with the tokenizer's
    special prefix (:func:`special_prefix`: Gemma's ``<bos>``; none for SmolLM2); chunks are then
    taken round-robin across texts, evenly spaced within each, until ``tokens`` tokens (all whole
    chunks if ``None``). See :func:`calibration_plan` for which text each chunk came from.

    Raises:
        InputError: no text, a text too short for one chunk, ``chunk < 2``, or fewer tokens available
            than requested (nothing is silently truncated: lower ``tokens`` or add text).
    """
    return calibration_plan(tokenizer, texts, tokens, chunk)[0]


def calibration_plan(tokenizer, texts: Sequence[str] | Mapping[str, str], tokens: int | None,
                     chunk: int) -> tuple[list[Tensor], list[dict]]:
    """:func:`calibration_chunks` and a record of each non-empty text: ``{"name", "sha256",
    "characters", "text_tokens", "calibration_tokens"}`` (its key in a mapping, else ``"text <i>"``;
    SHA-256 of its UTF-8 bytes; its token count; the tokens of it in the chunks). Raises as
    :func:`calibration_chunks`."""
    if isinstance(texts, Mapping):
        named = [(str(k), t) for k, t in texts.items()]
    else:
        named = [(f"text {i + 1}", t) for i, t in enumerate(texts)]
    named = [(k, t) for k, t in named if t and t.strip()]
    if not named:
        raise InputError("the calibration text is empty: give at least one non-empty text")
    if chunk < 2:
        raise InputError(f"chunk={chunk} tokens is too short; use at least 2 (1024 is typical)")
    bos = torch.tensor(special_prefix(tokenizer), dtype=torch.long)
    body = chunk - bos.numel()  # text tokens per chunk, after the special prefix
    if body < 1:
        raise InputError(f"chunk={chunk} tokens leaves no room for text after the tokenizer's special prefix")
    per_text, records = [], []
    for name, t in named:
        ids = torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"], dtype=torch.long)
        per_text.append([torch.cat([bos, c]) for c in ids[: ids.numel() // body * body].view(-1, body)])
        records.append({"name": name, "sha256": hashlib.sha256(t.encode("utf-8")).hexdigest(),
                        "characters": len(t), "text_tokens": int(ids.numel())})
    available = sum(len(c) for c in per_text) * chunk
    if available == 0:
        raise InputError(f"the calibration text has fewer than {chunk} tokens, one calibration chunk: give a longer text")
    want = available // chunk if tokens is None else -(-tokens // chunk)
    if tokens is not None and (tokens <= 0 or want * chunk > available):
        raise InputError(f"asked for {tokens} calibration tokens ({want} chunks of {chunk}), but the text "
                         f"has {available} tokens in whole chunks; ask for fewer tokens (`ridgefill calibrate --tokens`, "
                         f"`ridgefill eval --calib-tokens`) or add text")
    # round-robin over texts; within a text pick evenly spaced chunks
    counts = [0] * len(per_text)
    left, i = want, 0
    while left:
        if counts[i] < len(per_text[i]):
            counts[i] += 1
            left -= 1
        i = (i + 1) % len(per_text)
    picked = []
    for chunks, c in zip(per_text, counts):
        idx = torch.linspace(0, len(chunks) - 1, c).round().long().unique() if c else []
        picked.append([chunks[j] for j in idx])
    for rec, p in zip(records, picked):
        rec["calibration_tokens"] = len(p) * body
    out = []
    for j in range(max(counts)):
        out.extend(p[j] for p in picked if j < len(p))
    return out, records


@torch.inference_mode()
def collect_stats(model: torch.nn.Module, chunks: Sequence[Tensor], split: int, *,
                  heldout_every: int = 8, progress: bool = True) -> tuple[RidgeStats, RidgeStats]:
    """Run each chunk through layers ``0..L-2`` and accumulate ``(h_S, x_l)`` statistics.

    Args:
        chunks: ``[chunk]`` int64 token ids each (one forward per chunk, positions from 0).
        split: ``S``, ``0 ≤ S ≤ L-2``.
        heldout_every: chunk ``i`` is held out when ``i % heldout_every == heldout_every - 1``.

    Returns:
        ``(fit, heldout)`` :class:`RidgeStats` over layers ``S+1..L-1``.

    Raises:
        InputError: split out of range or no chunks. NonFiniteError: NaN/Inf activations.
    """
    return collect_stats_many(model, chunks, (split,), heldout_every=heldout_every, progress=progress)[split]


TARGETS: tuple[str, ...] = ("inputs", "kv")


@torch.inference_mode()
def collect_stats_many(model: torch.nn.Module, chunks: Sequence[Tensor], splits: Sequence[int], *,
                       heldout_every: int = 8, progress: bool = True,
                       checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 16,
                       targets: str = "inputs", context: int = 0) -> dict[int, tuple[RidgeStats, RidgeStats]]:
    """:func:`collect_stats` for several splits from one forward pass per chunk (the pass dominates).

    ``targets``: what the maps predict from ``h_S``: ``"inputs"``, each late layer's input ``x_l``
    (``[rows, hidden]``); ``"kv"``, each late layer's pre-RoPE keys and values
    (:meth:`~ridgefill.adapters.LlamaAdapter.kv_targets`, ``[rows, 2·kv_dim]``): K/V maps.
    ``context``: ``0``, the maps read ``h_S(t)``; ``1``, context maps, ``[h_S(t), h_S(t−1)]``
    (:func:`ridgefill.fill.context_features`; each chunk starts at position 0, so its first row's previous
    state is zero, as the prompt's row 0 is in the fill).

    Args:
        checkpoint: a file (:func:`ridgefill.checkpoint.checkpoint_path`) to save the statistics to
            every ``checkpoint_every`` chunks and after the last; when it exists and was written with
            the same settings (model, dtype, splits, held-out period, chunks, targets, context), the pass resumes
            after its last saved chunk, and the result equals an uninterrupted pass bit for bit. It is
            left in place: delete it once the maps are saved. ``None``: no checkpoint. A checkpoint that
            cannot be written (a full disk: :class:`~ridgefill.errors.WriteError`) is reported on stderr
            and the pass goes on, so the finished statistics still reach the maps.

    Returns:
        ``{S: (fit, heldout)}`` for every ``S`` in ``splits``; identical to calling
        :func:`collect_stats` once per split.

    Raises:
        InputError: a split out of range, no splits or no chunks, a bad ``heldout_every`` or
            ``checkpoint_every``, ``context`` not 0 or 1, or a checkpoint written with other settings.
        MapsFormatError: an unreadable checkpoint. NonFiniteError: NaN/Inf activations.
    """
    adapter = adapter_for(model)
    L = adapter.num_layers
    if isinstance(splits, (str, bytes)) or not hasattr(splits, "__iter__"):
        raise InputError(f"splits must be a sequence of integers; got {splits!r}")
    splits = sorted(set(check_int(s, "split S", lo=0, hi=L - 2, hint=f"this model has {L} layers")
                        for s in splits))
    if not splits:
        raise InputError("no split given: pass at least one split S")
    heldout_every = check_int(heldout_every, "heldout_every", lo=1)
    checkpoint_every = check_int(checkpoint_every, "checkpoint_every", lo=1)
    if not chunks:
        raise InputError("no calibration chunks: the calibration text is empty")
    if targets not in TARGETS:
        raise InputError(f"map targets must be one of {TARGETS}; got {targets!r}")
    context = check_context(context)
    k = adapter.hidden_size if targets == "inputs" else 2 * adapter.num_kv_heads * adapter.head_dim
    stats = {s: tuple(RidgeStats(L - s - 1, adapter.hidden_size, outputs=k, targets=targets, context=context)
                      for _ in range(2)) for s in splits}
    first = splits[0]
    device = next(model.parameters()).device
    done = 0
    if checkpoint is not None:
        settings = {"model_hash": model_hash(model), "weight_fingerprint": weight_fingerprint(model),
                    "weights_dtype": str(next(model.parameters()).dtype), "splits": splits,
                    "heldout_every": heldout_every, "chunks": len(chunks), "chunks_sha256": chunks_digest(chunks),
                    "targets": targets, **({"context": context} if context else {})}
        if Path(checkpoint).exists():
            shapes = {s: (L - s - 1, adapter.hidden_size, k, targets, context) for s in splits}
            done, stats = load_checkpoint(checkpoint, settings, shapes)
    label = f"S={first}" if len(splits) == 1 else "S=" + ",".join(map(str, splits))
    bar = tqdm(total=len(chunks), initial=done, desc=f"calibrate {label}", unit="chunk", disable=not progress)
    for i in range(done, len(chunks)):
        ids = chunks[i].to(device)[None]
        positions = torch.arange(ids.shape[1], device=device)
        x = adapter.embed(ids)
        rope = adapter.rope(positions, x)
        xs = []  # outputs of layers first..L-2, i.e. inputs of layers first+1..L-1
        for layer in range(L - 1):
            shape = (1, adapter.num_kv_heads, ids.shape[1], adapter.head_dim)
            x = adapter.layer(layer, x, rope, positions, x.new_empty(shape), x.new_empty(shape))
            if layer >= first:
                xs.append(x[0])
        hs = torch.stack(xs).cpu()  # h_S for S = first.. (= inputs of layers first+1..L-1)
        if targets == "kv":  # the pre-RoPE K/V of layers first+1..L-1, from their inputs
            xs = torch.stack([adapter.kv_targets(first + 1 + j, x[None])[0] for j, x in enumerate(xs)]).cpu()
        else:
            xs = hs
        held = i % heldout_every == heldout_every - 1
        for split, (fit_s, held_s) in stats.items():
            (held_s if held else fit_s).update(context_features(hs[split - first], context), xs[split - first:])
        bar.update()
        if checkpoint is not None and ((i + 1) % checkpoint_every == 0 or i + 1 == len(chunks)):
            try:
                save_checkpoint(checkpoint, settings, i + 1, stats)
            except WriteError as e:  # the statistics in memory are whole: the pass goes on, the maps get written
                print(f"warning: the calibration checkpoint was not written, the pass goes on without it: {e}",
                      file=sys.stderr, flush=True)
    bar.close()
    return stats


#: The default ridge penalty on the previous row's block of context maps, as a multiple of ``λ``
#: (:func:`ridgefill.ridge.fit_maps`, ``context_penalty``): ``1``, one ``λ`` for both blocks. ``4`` (the
#: block's scale halved in the solve) was measured on SmolLM2 at S = 15 and changed nothing that counts:
#: key-token ΔNLL +0.331 against +0.335, the same 8K single-needle trials lost (research/log.md,
#: "Context maps").
CONTEXT_PENALTY = defaults.CONTEXT_PENALTY


def resolve_context_penalty(context: int, penalty: float | None) -> float:
    """The context penalty to fit with: ``penalty`` checked, or the default for ``context``
    (:data:`CONTEXT_PENALTY` for context maps, ``1`` without context).

    Raises:
        InputError: not a number in :data:`ridgefill.ridge.CONTEXT_PENALTY_RANGE`, or a value other than ``1``
            for maps without context.
    """
    if penalty is None:
        return CONTEXT_PENALTY if context else 1.0
    return check_context_penalty(penalty, context)


def calibrate(model: torch.nn.Module, tokenizer, texts: Sequence[str] | Mapping[str, str] | None = None, *,
              split: int | None = None, tokens: int | None = defaults.CALIBRATION_TOKENS, chunk: int = defaults.CHUNK,
              lam: float | str = defaults.LAMBDA, context: int = defaults.CONTEXT,
              context_penalty: float | None = None, heldout_every: int = 8, model_name: str = "",
              progress: bool = True, checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 16,
              targets: str = "inputs") -> RidgeMaps:
    """Fit RidgeFill maps for ``model`` at ``split`` on ``texts`` (paper, "Approach").

    Args:
        texts: calibration texts (keep them disjoint from evaluation text); ``None``, the shipped default set
            (:func:`ridgefill.data.texts.calibration_texts`).
        split: ``S``; ``None``, the default split (:func:`ridgefill.defaults.default_split`: 12 for the
            bundled SmolLM2, else ``L // 2``).
        tokens: calibration token budget (whole chunks, rounded up; default 65,536); ``None`` for all text.
        chunk: tokens per forward pass.
        lam: ``λ`` (number ``≥ 0``) or ``"auto"`` (per layer, by held-out error).
        targets: ``"inputs"`` (the maps predict each late layer's input, the paper's maps) or ``"kv"``
            (K/V maps: each late layer's pre-RoPE keys and values; see :func:`collect_stats_many`).
        context: ``0`` (the maps read the row's own ``h_S``) or ``1`` (context maps: also the previous
            row's, :func:`ridgefill.maps.context_features`; docs/method.md, "Context maps").
        context_penalty: context maps only: the previous row's block is penalised this multiple of ``λ``
            (:func:`ridgefill.ridge.fit_maps`); ``None``, :data:`CONTEXT_PENALTY` for context maps and
            ``1`` (no other value allowed) without context.
        checkpoint, checkpoint_every: save the statistics every ``checkpoint_every`` chunks and resume
            from them after an interruption (:func:`collect_stats_many`); the caller deletes the
            checkpoint once the maps are saved (``ridgefill calibrate`` and ``ridgefill run`` do).

    Returns:
        :class:`RidgeMaps` (float32) with provenance metadata; save with :meth:`RidgeMaps.save`.

    Raises:
        InputError: a bad argument (``split``, ``tokens``, ``chunk``, ``heldout_every`` not integers in
            range, ``lam`` not ``"auto"`` or a finite number ``≥ 0``, ``texts`` not strings), checked
            before the pass; see also :func:`calibration_chunks` and :func:`collect_stats_many`.
        SingularGramError, NonFiniteError, MapsFormatError: see :func:`collect_stats_many` and
            :func:`ridgefill.ridge.fit_maps`.
    """
    split = defaults.default_split(model) if split is None else check_int(split, "split S", lo=0)
    return calibrate_many(model, tokenizer, texts, splits=(split,), tokens=tokens, chunk=chunk, lam=lam,
                          heldout_every=heldout_every, model_name=model_name, progress=progress,
                          checkpoint=checkpoint, checkpoint_every=checkpoint_every, targets=targets,
                          context=context, context_penalty=context_penalty)[split]


def calibrate_many(model: torch.nn.Module, tokenizer, texts: Sequence[str] | Mapping[str, str] | None = None, *,
                   splits: Sequence[int], tokens: int | None = defaults.CALIBRATION_TOKENS,
                   chunk: int = defaults.CHUNK, lam: float | str = defaults.LAMBDA, context: int = defaults.CONTEXT,
                   context_penalty: float | None = None, heldout_every: int = 8, model_name: str = "",
                   progress: bool = True, checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 16,
                   targets: str = "inputs", on_maps: Callable[[int, RidgeMaps], None] | None = None
                   ) -> dict[int, RidgeMaps]:
    """:func:`calibrate` at several splits from one pass over the text (:func:`collect_stats_many`).

    ``on_maps``: called with ``(S, maps)`` as soon as each split's maps are fitted, shallowest first (save
    them there, so an interruption during a later split's solve keeps the finished ones).

    Returns:
        ``{S: RidgeMaps}``, each identical to ``calibrate(..., split=S)`` with the same arguments.
    """
    if texts is None:
        texts = calibration_texts(defaults.CALIBRATION_SET)
    if isinstance(texts, (str, bytes)):
        raise InputError("texts must be a list of strings or a {name: text} mapping, not one string "
                         "(it would be read character by character): pass [text]")
    text_list = list(texts.values()) if isinstance(texts, Mapping) else list(texts)
    bad = [type(t).__name__ for t in text_list if not isinstance(t, str)]
    if bad:
        raise InputError(f"every calibration text must be a str; got {bad[:5]}")
    if tokens is not None:
        tokens = check_int(tokens, "tokens", lo=1, hint="or None for all of the text")
    chunk = check_int(chunk, "chunk", lo=2, hint="1024 is typical")
    heldout_every = check_int(heldout_every, "heldout_every", lo=1)
    context = check_context(context)
    context_penalty = resolve_context_penalty(context, context_penalty)
    if not isinstance(model_name, str):
        raise InputError(f"model_name must be a str; got {type(model_name).__name__}")
    if isinstance(lam, (list, tuple)):
        for v in lam:
            check_real(v, "every λ in the list", lo=0.0)
    elif lam != "auto":
        check_real(lam, "λ", lo=0.0, hint="or 'auto' (per layer, by held-out error)")
    chunks, sources = calibration_plan(tokenizer, texts, tokens, chunk)
    prefix = len(special_prefix(tokenizer))
    runs = [c[prefix:] for c in chunks]  # the calibration tokens, for the evaluation commands' overlap check
    fp = fingerprint(runs, sample=sample_for(sum(r.numel() for r in runs))).to_meta()
    if lam == "auto" and len(chunks) < 2:
        raise InputError("λ='auto' needs at least 2 chunks (one held out); calibrate on more tokens or give λ")
    # hold out every heldout_every-th chunk (at least one when there are two or more chunks)
    every = min(heldout_every, len(chunks)) if len(chunks) >= 2 else len(chunks) + 1
    collected = collect_stats_many(model, chunks, splits, heldout_every=every, progress=progress,
                                   checkpoint=checkpoint, checkpoint_every=checkpoint_every, targets=targets,
                                   context=context)
    out = {}
    provenance = model_provenance(model)
    induction = induction_scores(adapter_for(model))  # the heads row selection scores with, stored in the maps
    for split, (fit, held) in collected.items():
        result = fit_maps(fit, lam, held if held.count else None, context_penalty=context_penalty, progress=progress)
        meta = {"model_name": model_name, **provenance, "calibration_tokens": fit.count + held.count,
                "heldout_tokens": held.count, "chunk": chunk, "text_sha256": text_hash(text_list),
                "lambda_spec": str(lam), "heldout_rel_error": result.heldout_rel_error,
                "heldout_rel_error_identity": result.heldout_rel_error_identity, "solve_method": result.solve_methods,
                "kind": targets, "context": context,
                **({"context_penalty": context_penalty} if context else {}), "calibration_texts": sources, "calibration_fingerprint": fp}
        inputs = targets == "inputs"
        mean_h, mean_x = result.stats.means() if inputs else (None, None)
        out[split] = RidgeMaps(split, result.weights.float(), result.biases.float(), result.lambdas, meta,
                               result.stats, mean_h=None if mean_h is None else mean_h[:fit.hidden].float(),
                               mean_x=None if mean_x is None else mean_x.float(),
                               cov_h=calibration_cov(result.stats).float() if inputs else None,
                               induction=induction)
        if on_maps is not None:
            on_maps(split, out[split])
    return out
