"""RidgeFill: training-free late-layer KV-cache fill for faster prefill.

The Python API (:mod:`ridgefill.fill`, :mod:`ridgefill.calibration`, :mod:`ridgefill.maps`):

- :func:`prefill` — prefill a prompt with the fill (or a baseline) and return the cache and logits;
- :func:`generate_after` — greedy decoding from that cache (every decoding step runs the full model);
- :func:`calibrate` — fit the maps on calibration text, in one pass and a closed-form ridge solve;
- :func:`load_maps` / :class:`RidgeMaps` — the maps file;
- :func:`load_model` — the bundled model, a Hugging Face directory or a GGUF file;
- :func:`model_folder` — the Hugging Face folder it loads from (a GGUF's float32 copy, made once), for vLLM.

Defaults are those of the command line (:mod:`ridgefill.defaults`). Names are imported on first use, so
``import ridgefill`` and ``ridgefill --help`` stay fast.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "prefill": "fill", "generate_after": "fill", "PrefillResult": "fill", "MODES": "fill", "RowPlan": "fill",
    "exact_positions": "fill", "predict_inputs": "maps", "context_features": "maps",
    "calibrate": "calibration", "RidgeMaps": "maps", "load_maps": "maps",
    "RidgeStats": "ridge", "fit_maps": "ridge", "solve_ridge": "ridge",
    "load_model": "data.models", "load_tokenizer": "data.models", "model_folder": "data.models",
    "AssetError": "errors", "InputError": "errors", "MapsFormatError": "errors", "MapsMismatchError": "errors",
    "NonFiniteError": "errors", "OverlapError": "errors", "RidgeFillError": "errors", "SingularGramError": "errors",
    "UnsupportedModelError": "errors", "UnverifiedFileWarning": "errors", "WriteError": "errors",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ridgefill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
