"""RidgeFill as a vLLM plugin (entry point ``ridgefill`` in the ``vllm.general_plugins`` group).

:func:`register` (run by vLLM in each of its processes) registers the model class
``RidgeFillLlamaForCausalLM`` (:mod:`ridgefill_vllm.llama`) and makes the request front end refuse
prompt logprobs for models served with maps (filled prompt tokens have no logits), and makes the prefix
cache's block hashes carry the fill (:mod:`ridgefill_vllm.prefix`). Select the class and the maps through
the model config::

    LLM(model_dir, hf_overrides={"architectures": ["RidgeFillLlamaForCausalLM"],
                                 "ridgefill": {"maps": "maps-S15.safetensors", "tail": 256}},
        enforce_eager=True)

Models of other families are served by vLLM as usual (the plugin has no class for them yet).
"""

from __future__ import annotations

__version__ = "0.1.0"

ARCHITECTURES = {"RidgeFillLlamaForCausalLM": "ridgefill_vllm.llama:RidgeFillLlamaForCausalLM"}


def serves_fill(model_config) -> bool:
    """Whether a vLLM ``ModelConfig`` selects a RidgeFill class with maps."""
    archs = getattr(model_config.hf_config, "architectures", None) or []
    cfg = getattr(model_config.hf_config, "ridgefill", None)
    return any(a in ARCHITECTURES for a in archs) and isinstance(cfg, dict) and cfg.get("maps") is not None


def _refuse_prompt_logprobs() -> None:
    """Wrap vLLM's request validation: a request with ``prompt_logprobs`` to a model served with maps
    is refused with a ``VLLMValidationError`` (HTTP 400 in the OpenAI server) before it is scheduled."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, "_ridgefill", False):
        return

    def _validate_params(self, params, supported_tasks):
        if (isinstance(params, SamplingParams) and params.prompt_logprobs is not None
                and serves_fill(self.model_config)):
            raise VLLMValidationError(
                "prompt_logprobs are not available with RidgeFill: the filled prompt tokens do not run the late "
                "layers, so they have no logits; serve the model without the 'ridgefill' maps for scoring",
                parameter="prompt_logprobs", value=params.prompt_logprobs)
        return original(self, params, supported_tasks)

    _validate_params._ridgefill = True
    InputProcessor._validate_params = _validate_params


def register() -> None:
    """Register the RidgeFill model classes with vLLM (safe to call more than once)."""
    from vllm import ModelRegistry

    from .prefix import install_prefix_cache_hook

    for arch, target in ARCHITECTURES.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, target)
    _refuse_prompt_logprobs()
    install_prefix_cache_hook()
