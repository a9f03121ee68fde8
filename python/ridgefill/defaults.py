"""The one set of defaults: the Python API and the command line both read them from here.

Each default is the configuration the evaluation measured (docs/method.md, docs/evaluate.md); a change of
one is recorded in CHANGELOG.md with the measurement behind it.
"""

from __future__ import annotations

#: The bundled model (:func:`ridgefill.data.models.load_model`).
MODEL = "smollm2"
#: Exact rows at the end of every prompt (``tail``).
TAIL = 256
#: Row selection (``select``): the default setting, ``"on"`` (:data:`ridgefill.select.DEFAULT_SELECT`).
SELECT = "on"
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


def split_for(num_layers: int) -> int:
    """The default split ``S`` of a model with ``num_layers`` layers: ``num_layers // 2`` (depth 1/2; 15 of
    SmolLM2's 30 layers, 9 of Gemma 3 270M's 18, 16 of Llama-3.1-8B's 32)."""
    return num_layers // 2
