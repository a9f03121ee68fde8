"""The one set of defaults: the Python API and the command line both read them from here.

Each default is the configuration the evaluation measured (docs/method.md, docs/evaluate.md); a change of
one is recorded in CHANGELOG.md with the measurement behind it.
"""

from __future__ import annotations

#: The bundled model (:func:`ridgefill.data.models.load_model`).
MODEL = "smollm2"
#: Exact rows at the end of every prompt (``tail``).
TAIL = 256
#: Row selection (``select``): ``"auto"``, the setting the maps record (``ridgefill tune`` writes it), else ``"on"``
#: (:data:`ridgefill.select.DEFAULT_SELECT`, the one-pass selection; two-pass with K/V maps).
SELECT = "auto"
#: What the maps read: ``1``, context maps ``[h_S(t), h_S(t−1)]``; ``0``, the row's own ``h_S(t)``.
CONTEXT = 1
#: Context maps: the ridge penalty on the previous row's block, as a multiple of ``λ`` (1: one ``λ``).
CONTEXT_PENALTY = 1.0
#: Ridge ``λ``: ``"auto"`` picks one per late layer by held-out error (:func:`ridgefill.ridge.fit_maps`).
LAMBDA = "auto"
#: Calibration tokens (whole chunks) and tokens per calibration forward pass.
CALIBRATION_TOKENS = 65536
CHUNK = 1024
#: The shipped calibration set (:func:`ridgefill.data.texts.calibration_texts`).
CALIBRATION_SET = "mix"
#: Greedy tokens ``ridgefill generate`` writes.
MAX_NEW_TOKENS = 64


#: The split of each bundled model (the key :func:`ridgefill.data.models.load_model` records as
#: ``config.ridgefill_bundled``) where ``ridgefill tune`` measured a shallower one than depth 1/2 that keeps
#: quality: SmolLM2, S = 12 of 30 (chosen by ``tune`` under its default budget, key-token ΔNLL +0.325;
#: 16-trial filled-region needles at 8,000 tokens as exact's; docs/tune.md). Gemma 3 270M keeps depth 1/2:
#: its long-context needles (8K-16K) were measured at S = 9 only.
TUNED_SPLITS = {"smollm2": 12}


def split_for(num_layers: int, bundled: str | None = None) -> int:
    """The default split ``S`` of a model with ``num_layers`` layers: :data:`TUNED_SPLITS` for a bundled model
    that has one (12 of SmolLM2's 30 layers), else ``num_layers // 2`` (depth 1/2: 9 of Gemma 3 270M's 18,
    16 of Llama-3.1-8B's 32). ``ridgefill tune`` chooses one for any model (docs/tune.md)."""
    if bundled in TUNED_SPLITS:
        return TUNED_SPLITS[bundled]
    return num_layers // 2


def default_split(model) -> int:
    """:func:`split_for` of a loaded model (a ``transformers`` causal LM; a bundled model is recognised by the
    ``config.ridgefill_bundled`` key :func:`ridgefill.data.models.load_model` sets)."""
    config = model.config
    return split_for(config.num_hidden_layers, getattr(config, "ridgefill_bundled", None))
