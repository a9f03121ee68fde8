"""Errors the vLLM plugin raises on purpose, each naming the problem and the fix.

They mirror :mod:`ridgefill.errors` (same names and bases) without importing ``ridgefill``, whose
``transformers`` pin differs from vLLM's; every one is a ``ValueError``, which vLLM reports to the user.
"""


class RidgeFillError(Exception):
    """Base class of every error the plugin raises on purpose."""


class InputError(RidgeFillError, ValueError):
    """A setting is missing or out of range (``tail``, the maps path) or the engine is configured in a
    way the fill cannot serve (prefix caching, speculative decoding, ...)."""


class MapsFormatError(RidgeFillError, ValueError):
    """A maps file is truncated, corrupted, or holds tensors of the wrong shape or dtype."""


class MapsMismatchError(RidgeFillError, ValueError):
    """A maps file was fitted for another model (other sizes, other weights)."""


class UnsupportedRequestError(RidgeFillError, ValueError):
    """A request asks for something filled rows cannot give (prompt logprobs)."""
