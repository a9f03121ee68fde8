"""Model adapters: one per architecture family. :func:`adapter_for` picks one by ``config.model_type``."""

from __future__ import annotations

import torch

from ..errors import UnsupportedModelError
from .base import DecoderAdapter, Rope, RopeByType, apply_rope
from .families import MistralAdapter, Phi3Adapter, Qwen2Adapter, Qwen3Adapter
from .gemma3 import Gemma3Adapter
from .hybrid import HybridAdapter
from .llama import LlamaAdapter

ADAPTERS: tuple[type[DecoderAdapter], ...] = (LlamaAdapter, Gemma3Adapter, Qwen2Adapter, Qwen3Adapter,
                                              MistralAdapter, Phi3Adapter, HybridAdapter)


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values that have an adapter, sorted."""
    return sorted(t for cls in ADAPTERS for t in cls.model_types)


def adapter_for(model: torch.nn.Module) -> DecoderAdapter:
    """The adapter for ``model``, cached on the model object.

    Raises:
        UnsupportedModelError: no adapter handles ``model.config.model_type``.
    """
    cached = getattr(model, "_ridgefill_adapter", None)
    if cached is not None:
        return cached
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for cls in ADAPTERS:
        if model_type in cls.model_types:
            adapter = cls(model)
            model._ridgefill_adapter = adapter
            return adapter
    supported = supported_model_types()
    raise UnsupportedModelError(
        f"model_type {model_type!r} has no RidgeFill adapter; supported: {supported}. "
        "Add a subclass of ridgefill.adapters.DecoderAdapter for it.")


__all__ = ["DecoderAdapter", "Gemma3Adapter", "HybridAdapter", "LlamaAdapter", "MistralAdapter", "Phi3Adapter", "Qwen2Adapter",
           "Qwen3Adapter", "Rope", "RopeByType", "adapter_for", "apply_rope", "supported_model_types"]
