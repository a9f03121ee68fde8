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

================  =======================  ==================================================  ================
family            vLLM class               what differs from Llama for the filled tokens' K/V  row selection
================  =======================  ==================================================  ================
llama             ``LlamaForCausalLM``     —                                                   served
mistral           ``MistralForCausalLM``   — (Llama 4 query scaling touches queries only)      served, not with
                                                                                               Llama 4 query
                                                                                               scaling
phi3              ``Phi3ForCausalLM``      — (vLLM's Llama layers; fused ``qkv_proj`` in the   served
                                           checkpoint)
qwen2             ``Qwen2ForCausalLM``     Q/K/V bias (the K/V rows of the QKV bias);          served
                                           optional ``qk_norm``
qwen3, qwen3_moe  ``Qwen3ForCausalLM``,    per-head ``k_norm`` (RMSNorm) before RoPE;          served
                  ``Qwen3MoeForCausalLM``  Qwen3-MoE: filled tokens run no late MLP, so they
                                           never reach the experts
gemma3_text       ``Gemma3ForCausalLM``    per-head ``k_norm`` (Gemma RMSNorm, ``1 + w``)      served with
                                           before RoPE; RoPE base per layer type;              vLLM's hybrid
                                           sliding-window layers (each late layer's slots      KV-cache
                                           come from its own KV-cache group)                   manager off
================  =======================  ==================================================  ================

The norms, RoPE tables and embedding scale are the layer's and model's own modules, so Gemma's ``1 + w`` norms,
the embedding scale ``sqrt(d)`` and the query pre-attention scalar (the attention's ``scaling``, which the exact
tokens and row selection's scores use) need no code here.
"""

from __future__ import annotations

from torch import Tensor, nn


class Family:
    """Llama's layer layout (vLLM's ``LlamaDecoderLayer``); subclasses override what differs.

    Attributes:
        name: the family's name in messages.
        architecture: the family's RidgeFill class (its register name).
        model_types: the checkpoints' ``config.model_type`` values the family serves.
        sliding_windows: whether sliding-window layers are served.
    """

    name = "llama"
    architecture = "RidgeFillLlamaForCausalLM"
    model_types: tuple[str, ...] = ("llama",)
    sliding_windows = False

    def attention(self, layer: nn.Module) -> nn.Module:
        """The layer's attention module (``qkv_proj``, ``q_size``, ``kv_size``, ``rotary_emb``, ``attn``)."""
        return layer.self_attn

    def input_norm(self, layer: nn.Module) -> nn.Module:
        """The layer's input norm, called on the layer input ``[tokens, d]``."""
        return layer.input_layernorm

    def qkv(self, attn: nn.Module) -> nn.Module:
        """The fused QKV projection: ``weight`` ``[q_size + 2·kv_size, d]`` (rows Q, K, V), optional ``bias``."""
        return attn.qkv_proj

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
    name, model_types = "mistral", ("mistral",)
    architecture = "RidgeFillMistralForCausalLM"

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
    name, model_types = "phi3", ("phi3",)
    architecture = "RidgeFillPhi3ForCausalLM"

    def check(self, vllm_config) -> list[str]:
        cfg = vllm_config.model_config.hf_config
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in ("longrope", "su"):
            return ["the Phi-3 config uses long-context RoPE (longrope), whose short/long factors vLLM picks by "
                    "max_model_len and transformers by sequence length, so the maps' reference differs: serve a "
                    "Phi-3 checkpoint without rope scaling, or this one without the ridgefill maps"]
        return []


class Qwen2Family(Family):
    name, model_types = "qwen2", ("qwen2",)
    architecture = "RidgeFillQwen2ForCausalLM"

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
    name, model_types = "qwen3", ("qwen3",)
    architecture = "RidgeFillQwen3ForCausalLM"


class Qwen3MoeFamily(Qwen3Family):
    name, model_types = "qwen3_moe", ("qwen3_moe",)
    architecture = "RidgeFillQwen3MoeForCausalLM"


class Gemma3Family(QKNormFamily):
    name, model_types, sliding_windows = "gemma3", ("gemma3_text",), True
    architecture = "RidgeFillGemma3ForCausalLM"

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


LLAMA, MISTRAL, PHI3 = Family(), MistralFamily(), Phi3Family()
QWEN2, QWEN3, QWEN3_MOE, GEMMA3 = Qwen2Family(), Qwen3Family(), Qwen3MoeFamily(), Gemma3Family()
FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE, GEMMA3)
