"""RidgeFill classes of the dense families other than Llama (``RidgeFillLlamaForCausalLM``: :mod:`.llama`).

Each is vLLM's own ``...ForCausalLM`` with :class:`~ridgefill_vllm.llama.FillCausalLM` mixed in and a
:class:`~ridgefill_vllm.adapters.Family` saying where the fill finds the layer's parts; the fill itself is
:class:`~ridgefill_vllm.llama.FillModel`. Register names: the class names (``__init__.ARCHITECTURES``).
"""

from __future__ import annotations

from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from .adapters import GEMMA3, MISTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE, QWEN3_NEXT
from .llama import FillCausalLM


class RidgeFillMistralForCausalLM(FillCausalLM, MistralForCausalLM):
    """vLLM's ``MistralForCausalLM`` with the fill."""

    family = MISTRAL


class RidgeFillPhi3ForCausalLM(FillCausalLM, Phi3ForCausalLM):
    """vLLM's ``Phi3ForCausalLM`` (Llama layers, fused QKV in the checkpoint) with the fill."""

    family = PHI3


class RidgeFillQwen2ForCausalLM(FillCausalLM, Qwen2ForCausalLM):
    """vLLM's ``Qwen2ForCausalLM`` (QKV bias) with the fill."""

    family = QWEN2


class RidgeFillQwen3ForCausalLM(FillCausalLM, Qwen3ForCausalLM):
    """vLLM's ``Qwen3ForCausalLM`` (per-head k-norm before RoPE) with the fill."""

    family = QWEN3


class RidgeFillQwen3MoeForCausalLM(FillCausalLM, Qwen3MoeForCausalLM):
    """vLLM's ``Qwen3MoeForCausalLM`` with the fill: filled tokens run no late MLP, so no experts."""

    family = QWEN3_MOE


class RidgeFillGemma3ForCausalLM(FillCausalLM, Gemma3ForCausalLM):
    """vLLM's ``Gemma3ForCausalLM`` (text) with the fill, sliding-window and full layers."""

    family = GEMMA3


class RidgeFillQwen3NextForCausalLM(FillCausalLM, Qwen3NextForCausalLM):
    """vLLM's ``Qwen3NextForCausalLM`` (hybrid: linear-attention and full-attention layers, MoE) with the fill:
    filled tokens advance the late linear-attention layers' states and write the late full-attention layers'
    K/V; they run no late MLP."""

    family = QWEN3_NEXT
