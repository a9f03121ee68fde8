"""The seed's table: loss and needle retrieval by split depth, and the maps it needs (``ridgefill eval depth``).

Depths are fractions of the layer count; ``S = round(depth · L)`` (half up), so on a 30-layer model
1/4, 3/8, 1/2, 5/8 give ``S`` = 8, 11, 15, 19 (the paper's 32-layer Llama: 8, 12, 16, 20). Layers
``0..S`` run exactly, layers ``S+1..L-1`` are filled.

Maps for several splits are fitted from one pass over the calibration text
(:func:`ridgefill.calibration.calibrate_many`) and cached as ``<out>/maps-S<S>.safetensors``, the same
files ``ridgefill run`` reuses.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Sequence

import torch

from ..errors import InputError, MapsFormatError, MapsMismatchError
from ..maps import RidgeMaps, attach_stats, load_maps

#: The seed's depths (fractions of the layer count).
SEED_DEPTHS: tuple[str, ...] = ("1/4", "3/8", "1/2", "5/8")


def parse_depth(text: str) -> Fraction:
    """``"3/8"`` or ``"0.375"`` -> ``Fraction(3, 8)``. Raises :class:`InputError` unless ``0 < depth < 1``."""
    try:
        value = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise InputError(f"depth {text!r} is not a fraction such as 3/8 or 0.375") from None
    if not 0 < value < 1:
        raise InputError(f"depth {text!r} must lie strictly between 0 and 1 (a fraction of the layers)")
    return value


def split_for_depth(depth: Fraction | str, num_layers: int) -> int:
    """``S = round(depth · L)`` (half up), checked to leave at least one late layer.

    Raises:
        InputError: the split falls outside ``0..L-2``.
    """
    depth = parse_depth(depth) if not isinstance(depth, Fraction) else depth
    split = int(depth * num_layers + Fraction(1, 2))
    if not 0 <= split <= num_layers - 2:
        raise InputError(f"depth {depth} of a {num_layers}-layer model gives split S={split}, outside 0..{num_layers - 2}")
    return split


def maps_path(out: str | Path, split: int) -> Path:
    """Where the maps for ``split`` are cached: ``<out>/maps-S<split>.safetensors``."""
    return Path(out) / f"maps-S{split}.safetensors"


def maps_for_splits(model: torch.nn.Module, tokenizer, model_name: str, splits: Sequence[int], *,
                    out: str | Path = "ridgefill-out", calib_tokens: int = 65536, chunk: int = 1024,
                    lam: float | str = "auto", progress: bool = True, calib_set: str | None = None,
                    context: int = 1) -> dict[int, RidgeMaps]:
    """Maps for every split: load ``<out>/maps-S<S>.safetensors`` (with its statistics file, when there is
    one) when it fits the model and was fitted on the shipped calibration set ``calib_set``
    (:func:`ridgefill.evaluate.main_job.calibration_mismatch`; ``None``: the default set,
    :data:`ridgefill.data.texts.DEFAULT_CALIBRATION_SET`) with the same λ spec, chunk, ``context``
    (:func:`ridgefill.fill.context_features`) and (at least about) ``calib_tokens`` tokens; fit the missing splits together in one pass over that set's texts
    (:func:`ridgefill.data.texts.calibration_texts`) and save them there.

    Returns:
        ``{S: RidgeMaps}``.

    Raises:
        InputError: an unknown ``calib_set``.
    """
    from ..data.texts import DEFAULT_CALIBRATION_SET, calibration_texts
    from ..calibration import calibrate_many, resolve_context_penalty
    from .main_job import calibration_mismatch

    calib_set = calib_set or DEFAULT_CALIBRATION_SET
    calib = calibration_texts(calib_set)  # an unknown set fails here, before any file is read

    result: dict[int, RidgeMaps] = {}
    missing = []
    wanted = (context, resolve_context_penalty(context, None))  # what default-path maps must have been fitted with
    for split in sorted(set(splits)):
        path = maps_path(out, split)
        if path.exists():
            try:
                maps = load_maps(path)
                maps.check_model(model, split)
                other_text = calibration_mismatch(maps.meta, calib_set)
                if (maps.meta.get("calibration_tokens", 0) >= calib_tokens * (1 - 1 / 8)
                        and maps.meta.get("lambda_spec") == str(lam) and maps.meta.get("chunk") == chunk
                        and (maps.context, maps.context_penalty) == wanted and other_text is None):
                    attach_stats(maps, path)  # the statistics (re-solves with another λ) and the means
                    result[split] = maps
                    continue
                if other_text is not None or (maps.context, maps.context_penalty) != wanted:
                    why = other_text or (f"they read context {maps.context} (penalty {maps.context_penalty:g}), this "
                                         f"run asks for context {wanted[0]} (penalty {wanted[1]:g})")
                    print(f"existing maps at {path} not usable ({why}); calibrating anew")
            except (MapsFormatError, MapsMismatchError) as e:
                print(f"existing maps at {path} not usable ({e}); calibrating anew")
        missing.append(split)
    if missing:
        fitted = calibrate_many(model, tokenizer, calib, splits=missing,
                                tokens=calib_tokens, chunk=chunk, lam=lam, model_name=model_name,
                                progress=progress, context=context,
                                on_maps=lambda split, maps: maps.save(maps_path(out, split)))  # saved as fitted
        result.update(fitted)
    return result


def run_depth(model: torch.nn.Module, tokenizer, maps_by_split: dict[int, RidgeMaps], *, docs, sets,
              sentences, tail: int, window: int, tau: float, needle_length: int, needle_trials: int,
              needle_tail: int, modes: Sequence[str] = ("ridge", "identity", "none"), seed: int = 0,
              chat: bool = False, resamples: int = 10000, progress=None, selects: Sequence = (),
              select_modes: Sequence[str] = ("ridge",)) -> dict:
    """The seed's table: key-token (and all/novel) ΔNLL vs exact per split and mode, and filled-region
    single-needle retrieval per split and mode at one context length; ``selects`` (each a
    :class:`ridgefill.select.Select`) add the systems ``"<S>/<mode>+sel"`` for every mode in ``select_modes``.

    Returns:
        ``{"loss": {...}, "needles": {...}}`` (see :func:`ridgefill.evaluate.loss.summarise` and
        :func:`ridgefill.evaluate.needles.run_needles`).
    """
    from dataclasses import asdict

    from ..calibration import special_prefix
    from .loss import fill_variants, key_token_stats, score_documents, summarise
    from .needles import run_needles

    splits = sorted(maps_by_split)
    records = score_documents(model, docs, sets, tail=tail, window=window,
                              variants=fill_variants(model, maps_by_split, modes, tail=tail, selects=selects,
                                                     select_modes=select_modes),
                              prefix_tokens=len(special_prefix(tokenizer)), progress=progress)
    loss = {"summary": summarise(records, tau=tau, resamples=resamples, seed=seed),
            "key_tokens": key_token_stats(records, tau), "documents": [asdict(r) for r in records]}
    needles = None
    if needle_trials:
        needles = run_needles(model, tokenizer, sentences, lengths=[needle_length], trials=needle_trials,
                              variants=["single"], modes=["exact", *modes], maps_by_split=maps_by_split,
                              splits=splits, tail=needle_tail, seed=seed, chat=chat, progress=progress,
                              selects=selects, select_modes=select_modes)
    return {"loss": loss, "needles": needles}
