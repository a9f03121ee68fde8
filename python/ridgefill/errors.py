"""Exceptions raised by RidgeFill: one type per kind of user mistake.

Every message names the offending value, what was expected and what to do.
All types derive from :class:`RidgeFillError`; the ones about bad arguments also
derive from :class:`ValueError` so generic callers can catch them as such.
"""


class RidgeFillError(Exception):
    """Base class of every error RidgeFill raises on purpose."""


class AssetError(RidgeFillError):
    """The bundled model or text cannot be fetched or loaded, or a model spec is not understood."""


class InputError(RidgeFillError, ValueError):
    """An argument is out of range: a split outside the model, a tail not shorter than the prompt,
    an empty calibration text, an unknown mode."""


class UnsupportedModelError(RidgeFillError, ValueError):
    """The model's architecture has no RidgeFill adapter."""


class MapsMismatchError(RidgeFillError, ValueError):
    """A maps file was fitted for another model, another split or another hidden size."""


class MapsFormatError(RidgeFillError, ValueError):
    """A maps file is truncated, corrupted, or holds tensors of the wrong shape or dtype."""


class WriteError(RidgeFillError, OSError):
    """A file could not be written (a full disk, no permission). The message names the file, the
    bytes it needed and the bytes free in its folder; nothing at that path was replaced.

    Attributes:
        path: the file; needed: bytes the write needed (``None`` when unknown); free: bytes free there.
    """

    def __init__(self, message: str, path: str = "", needed: int | None = None, free: int | None = None):
        super().__init__(message)
        self.path, self.needed, self.free = path, needed, free

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NonFiniteError(RidgeFillError, FloatingPointError):
    """NaN or Inf appeared in activations or statistics."""


class SingularGramError(RidgeFillError, ValueError):
    """The regularised Gram matrix ``G + λI`` is not positive definite (e.g. ``λ <= 0`` with a
    singular Gram), so the closed-form ridge solve has no unique solution."""


class OverlapError(RidgeFillError, ValueError):
    """Evaluation text overlaps the text the maps were calibrated on (a shared run of tokens): the
    measurement would score memorised calibration text. Evaluate on other text or refit the maps."""


class UnverifiedFileWarning(UserWarning):
    """A maps or statistics file carries no content hashes (written before RidgeFill stored them), so its
    tensors are used unverified. Rewriting it (``ridgefill calibrate``, or load and save it) adds them."""
