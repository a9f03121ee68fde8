"""What the fill reads of one family's vLLM decoder layer: the per-family interface of the plugin.

The fill (:class:`ridgefill_vllm.llama.FillModel`) runs vLLM's own decoder layers; for the filled tokens of a
late layer it needs the layer's input norm, the K/V rows of its fused QKV projection (weight and bias), the
per-head key norm if any, RoPE and the attention module whose cache write it calls. A :class:`Family` says
where those are, as the reference's adapters do for ``transformers`` models (``ridgefill.adapters``;
docs/families.md). Every family here keeps vLLM's residual convention (a layer is called as
``layer(positions, hidden, residual)`` and its input is ``hidden + residual``), so ``h_S`` and the exact tokens'
late layers need nothing per family. Row selection scores filled rows by the attention of the late layers'
queries, which :meth:`Family.queries` gives as the layer computes them (Qwen3's and Gemma 3's ``q_norm``, Qwen2's
Q bias through the QKV bias; the scale, Gemma 3's ``query_pre_attn_scalar ** -0.5`` included, is the attention
module's ``scaling``); what a family's selection cannot serve, :meth:`Family.check_selection` refuses.

qwen3_next        ``Qwen3NextForCausalLM`` hybrid: linear-attention (Gated DeltaNet) layers,     refused
                                           whose filled tokens advance the layer's conv and
                                           recurrent states; full-attention layers with an
                                           output gate (the fused QKV weight's rows are Q and
                                           gate, K, V), ``1 + w`` norms, ``k_norm``, partial
                                           RoPE; layers called with keywords
================  =======================  ==================================================  =========
The norms, RoPE tables and embedding scale are the layer's and model's own modules, so Gemma's ``1 + w`` norms,
the embedding scale ``sqrt(d)`` and the query pre-attention scalar (the attention's ``scaling``, which the exact
tokens and row selection's scores use) need no code here.
"""

from __future__ import annotations

from ridgefill.export_vllm import VLLM_ARCHITECTURES, vllm_class
from torch import Tensor, nn


def _served(architecture: str) -> tuple[str, tuple[str, ...]]:
    """``(register name, model types)`` of the RidgeFill class serving vLLM's ``architecture``
    (``ridgefill.export_vllm.VLLM_ARCHITECTURES``)."""
    return vllm_class(architecture), VLLM_ARCHITECTURES[architecture]


class Family:
    """Llama's layer layout (vLLM's ``LlamaDecoderLayer``); subclasses override what differs.

    Attributes:
        name: the family's name in messages.
        architecture: the family's RidgeFill class (its register name).
        model_types: the checkpoints' ``config.model_type`` values the family serves.
        sliding_windows: whether sliding-window layers are served.
        recurrent: whether the model has linear-attention (recurrent-state) layers (hybrid families).
    """

    name = "llama"
    architecture, model_types = _served("LlamaForCausalLM")
    sliding_windows = False
    recurrent = False

    def attention(self, layer: nn.Module) -> nn.Module:
        """The layer's attention module (``qkv_proj``, ``q_size``, ``kv_size``, ``rotary_emb``, ``attn``)."""
        return layer.self_attn

    def input_norm(self, layer: nn.Module) -> nn.Module:
        """The layer's input norm, called on the layer input ``[tokens, d]``."""
        return layer.input_layernorm

    def qkv(self, attn: nn.Module) -> nn.Module:
        """The fused QKV projection: ``weight`` ``[q_size + 2·kv_size, d]`` (rows Q, K, V), optional ``bias``."""
        return attn.qkv_proj

    def q_rows(self, attn: nn.Module) -> int:
        """The rows of the fused QKV weight before the K rows (this rank's query rows): ``q_size``."""
        return attn.q_size

    def is_recurrent(self, layer: nn.Module) -> bool:
        """Whether ``layer`` is a linear-attention (recurrent-state) layer: never in a dense family."""
        return False

    def call(self, layer: nn.Module, positions: Tensor, hidden: Tensor, residual: Tensor | None):
        """Run vLLM's decoder ``layer``; returns ``(hidden, residual)`` (the next layer's input is their sum)."""
        return layer(positions, hidden, residual)

    def keys(self, attn: nn.Module, k: Tensor) -> Tensor:
        """Keys ``[tokens, kv_size]`` after the K projection, before RoPE: unchanged (no key norm)."""
        return k

    def queries(self, attn: nn.Module, q: Tensor) -> Tensor:
        """Queries ``[tokens, q_size]`` after the Q projection (with its bias), before RoPE: unchanged."""
        return q

    def rope(self, attn: nn.Module):
        """The layer's RoPE module, called as ``rope(positions, keys, None)``."""
        return attn.rotary_emb

    def check(self, vllm_config) -> list[str]:
        """What of this model the fill cannot serve (empty: all of it), each naming what to change."""
        return []

    def check_selection(self, vllm_config) -> list[str]:
        """What of this model row selection cannot serve (empty: all of it), each naming what to change."""
        return []


class QKNormFamily(Family):
    """Per-head key RMSNorm before RoPE (``attn.k_norm`` over ``[tokens, kv_heads, head_dim]``)."""

    def keys(self, attn: nn.Module, k: Tensor) -> Tensor:
        """``k_norm`` per head of the keys ``[tokens, kv_size]`` (as vLLM's Qwen3 and Gemma 3 attention)."""
        return attn.k_norm(k.view(k.shape[0], -1, attn.head_dim)).view(k.shape)

    def queries(self, attn: nn.Module, q: Tensor) -> Tensor:
        """``q_norm`` per head of the queries ``[tokens, q_size]`` (as vLLM's Qwen3 and Gemma 3 attention)."""
        return attn.q_norm(q.view(q.shape[0], -1, attn.head_dim)).view(q.shape)


class MistralFamily(Family):
    name = "mistral"
    architecture, model_types = _served("MistralForCausalLM")

    def check_selection(self, vllm_config) -> list[str]:
        if getattr(vllm_config.model_config.hf_config, "llama_4_scaling", None) is not None:
            return ["the Mistral config sets llama_4_scaling (a position-dependent query scale), which row "
                    "selection's attention scores do not apply: set 'select': 'off' in the ridgefill config"]
        return []

    def check(self, vllm_config) -> list[str]:
        if getattr(vllm_config.model_config.hf_config, "ada_rms_norm_t_cond", False):
            return ["the Mistral config sets ada_rms_norm_t_cond (a time-conditioned MLP scale), which the fill "
                    "does not serve: serve this model without the ridgefill maps"]
        return []


class Phi3Family(Family):
    name = "phi3"
    architecture, model_types = _served("Phi3ForCausalLM")

    def check(self, vllm_config) -> list[str]:
        cfg = vllm_config.model_config.hf_config
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
            return ["the Phi-3 config uses long-context RoPE (longrope), whose short/long factors vLLM picks by "
                    "max_model_len and transformers by sequence length, so the maps' reference differs: serve a "
                    "Phi-3 checkpoint without rope scaling, or this one without the ridgefill maps"]
        return []


class Qwen2Family(Family):
    name = "qwen2"
    architecture, model_types = _served("Qwen2ForCausalLM")

    def keys(self, attn: nn.Module, k: Tensor) -> Tensor:
        """``k_norm`` per head where the config sets ``qk_norm`` (vLLM's ``Qwen2Attention``), else unchanged."""
        return QKNormFamily.keys(self, attn, k) if getattr(attn, "qk_norm", False) else k

    def queries(self, attn: nn.Module, q: Tensor) -> Tensor:
        """``q_norm`` per head where the config sets ``qk_norm``, else unchanged (the Q bias is the QKV bias's)."""
        return QKNormFamily.queries(self, attn, q) if getattr(attn, "qk_norm", False) else q

    def check(self, vllm_config) -> list[str]:
        cfg = vllm_config.model_config.hf_config
        out = []
        if getattr(cfg, "dual_chunk_attention_config", None):
            out.append("dual-chunk attention (dual_chunk_attention_config) is set, whose RoPE and attention the "
                       "fill does not serve: remove it from the config or serve without the ridgefill maps")
        if not getattr(cfg, "is_causal", True):
            out.append("the config sets is_causal=False (an encoder): the fill needs causal attention")
        return out


class Qwen3Family(QKNormFamily, Qwen2Family):
    name = "qwen3"
    architecture, model_types = _served("Qwen3ForCausalLM")


class Qwen3MoeFamily(Qwen3Family):
    name = "qwen3_moe"
    architecture, model_types = _served("Qwen3MoeForCausalLM")


class Gemma3Family(QKNormFamily):
    name, sliding_windows = "gemma3", True
    architecture, model_types = _served("Gemma3ForCausalLM")

    def check_selection(self, vllm_config) -> list[str]:
        if not getattr(vllm_config.scheduler_config, "disable_hybrid_kv_cache_manager", False):
            return ["row selection with sliding-window layers needs their K/V of the whole prompt, in the block table "
                    "of the full-attention layers (a chosen row of an earlier chunk attends to the rows in its "
                    "window), but vLLM's hybrid KV-cache manager frees the sliding-window blocks the scheduled "
                    "tokens have passed and gives those layers their own block table: pass "
                    "disable_hybrid_kv_cache_manager=True (`--disable-hybrid-kv-cache-manager`), or set 'select': "
                    "'off' in the ridgefill config"]
        return []

    def check(self, vllm_config) -> list[str]:
        out = []
        if vllm_config.cache_config.enable_prefix_caching:
            out.append("prefix caching is on, which the fill does not serve with sliding-window layers yet: pass "
                       "enable_prefix_caching=False (`--no-enable-prefix-caching`)")
        if getattr(vllm_config.model_config.hf_config, "use_bidirectional_attention", False):
            out.append("the config sets use_bidirectional_attention=True: the fill needs causal attention")
        return out


class Qwen3NextFamily(QKNormFamily):
    """vLLM's ``Qwen3NextForCausalLM``: full-attention layers (``self_attn``, output gate) and linear-attention
    layers (``linear_attn``, Gated DeltaNet), decoder layers called as ``layer(positions=, hidden_states=,
    residual=)``."""

    name, recurrent = "qwen3_next", True
    architecture, model_types = _served("Qwen3NextForCausalLM")

    def check_selection(self, vllm_config) -> list[str]:
        return ["row selection is not served for hybrid models (qwen3_next) yet: the chosen rows would rerun the "
                "linear-attention layers' recurrence from the split state; set 'select': 'off' in the ridgefill config"]

    def q_rows(self, attn: nn.Module) -> int:
        """Query and output-gate rows (``2·q_size`` with the output gate, vLLM's ``attn_output_gate``)."""
        return attn.q_size * (2 if getattr(attn, "attn_output_gate", False) else 1)

    def is_recurrent(self, layer: nn.Module) -> bool:
        """Whether ``layer`` is a linear-attention layer (it has ``linear_attn``, no ``self_attn``)."""
        return hasattr(layer, "linear_attn")

    def call(self, layer: nn.Module, positions: Tensor, hidden: Tensor, residual: Tensor | None):
        """Run vLLM's ``Qwen3NextDecoderLayer`` (keyword arguments); returns ``(hidden, residual)``."""
        return layer(positions=positions, hidden_states=hidden, residual=residual)

    def check(self, vllm_config) -> list[str]:
        out = []
        if vllm_config.cache_config.enable_prefix_caching:
            out.append("prefix caching is on, which the fill does not serve for hybrid models yet (vLLM caches their "
                       "recurrent states at block boundaries, mamba_cache_mode 'align'): pass "
                       "enable_prefix_caching=False (`--no-enable-prefix-caching`)")
        tp = getattr(vllm_config.parallel_config, "tensor_parallel_size", 1)
        if tp > 1:
            out.append(f"tensor parallelism ({tp} ranks) is not tested with the fill for hybrid models yet (each "
                       "rank would hold part of the linear-attention layers' heads and states): serve with "
                       "tensor_parallel_size=1 (`--tensor-parallel-size 1`), or serve vLLM's own "
                       "Qwen3NextForCausalLM without the ridgefill maps")
        if getattr(vllm_config.parallel_config, "use_sequence_parallel_moe", False):
            out.append("sequence-parallel MoE is on (the layers then split their rows across ranks): turn "
                       "use_sequence_parallel_moe off")
        if getattr(vllm_config.model_config.hf_config, "layer_scale", False):
            out.append("the config sets layer_scale, which the fill does not serve: serve without the ridgefill maps")
        return out


LLAMA, MISTRAL, PHI3 = Family(), MistralFamily(), Phi3Family()
QWEN2, QWEN3, QWEN3_MOE, GEMMA3 = Qwen2Family(), Qwen3Family(), Qwen3MoeFamily(), Gemma3Family()
QWEN3_NEXT = Qwen3NextFamily()
FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE, GEMMA3, QWEN3_NEXT)
