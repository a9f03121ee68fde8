"""RidgeFill: training-free late-layer cache fill for faster prefill.

Public entry points: :func:`prefill` (the fill prefill and its baselines), :func:`calibrate`
(fit the maps), :func:`load_maps` / :class:`RidgeMaps` (the maps file), :func:`solve_ridge` and
:func:`fit_maps` (the closed-form fit).
"""

from .errors import (AssetError, InputError, MapsFormatError, MapsMismatchError, NonFiniteError,
                     OverlapError, RidgeFillError, SingularGramError, UnsupportedModelError)
from .fill import MODES, PrefillResult, exact_positions, generate_after, predict_inputs, prefill
from .maps import RidgeMaps, load_maps
from .ridge import RidgeStats, fit_maps, solve_ridge

__version__ = "0.1.0"

__all__ = ["MODES", "AssetError", "InputError", "MapsFormatError", "MapsMismatchError", "NonFiniteError",
           "OverlapError", "PrefillResult", "RidgeFillError", "RidgeMaps", "RidgeStats", "SingularGramError",
           "UnsupportedModelError", "exact_positions", "fit_maps", "generate_after", "load_maps",
           "predict_inputs", "prefill", "solve_ridge"]
