"""Run one vLLM engine on prompts given as token ids and write what the tests compare (a JSON file).

Run as a script (vLLM spawns its engine process, so each engine gets its own Python process and
this file needs the ``__main__`` guard): ``python run_engine.py SPEC.json OUT.json``. ``SPEC`` holds

- ``model_dir``, ``architecture``, ``ridgefill`` (the plugin settings or ``null``), ``prompts`` (lists of token ids),
  ``gen_tokens``, ``top``, ``engine`` (extra ``vllm.LLM`` arguments);
- optional: ``step_log`` (a file for the plugin's per-step log), ``env`` (environment variables for the engine's
  processes), ``sequential`` (send the prompts one after another instead of in one call), ``then_sequential`` (after
  the call, the same prompts again one after another from an empty prefix cache), ``abort`` (``{"prompt": ids,
  "steps": k}``: a request sent first and aborted after ``k`` engine steps), ``needles`` (more prompts, answered
  greedily after the others, as text), ``try_prompt_logprobs``, ``fill_state``, ``update_block_table`` (vLLM's CPU
  attention builder reuses one KV-cache group's metadata for the next group of the same spec with another block
  table, as FlashAttention's builder does on GPUs; :class:`_update_block_tables`).

``OUT`` gets the KV block size, the KV pool's blocks and the memory vLLM gave it; per prompt the greedy continuation,
the first token's top log-probabilities (and the second's, ``decode``: the first decoding step) and the prompt tokens
found in the prefix cache; with ``then_sequential`` the same for the second pass (``sequential``); the needle answers;
with ``try_prompt_logprobs`` the error a prompt-logprobs request raised (or ``null``); with ``fill_state`` what the
fill allocated for the KV pool (``fill_state_bytes``); with ``update_block_table`` the number of metadata builds that
reused another group's (``block_table_updates``); the plugin's per-request lines of vLLM's log written in this
process (``request_log``: the engine's core runs here in a spec of several runs). A spec ``{"runs": [SPEC, ...]}`` runs several engines one after
another, each with its engine core in this process (vLLM is imported once), and writes ``{"runs": [OUT, ...]}``; an
engine that raised gets ``{"error": TRACEBACK}`` there and the next ones still run.
"""

import gc
import json
import logging
import os
import sys
import traceback


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if "runs" in spec:  # several engines, one after another in this process: {"runs": [SPEC, ...]}
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # each engine's core in this process: vLLM imported once
        _inspect_models_here()
        result = {"runs": []}
        for sub in spec["runs"]:
            saved = {k: os.environ.get(k) for k in sub.get("env", {})}
            try:
                result["runs"].append(run(sub))
            except Exception:  # this engine's tests fail with its error; the next engines still run
                result["runs"].append({"error": traceback.format_exc()[-6000:]})
                gc.collect()
            finally:  # an engine's own environment variables do not reach the next engine
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    else:
        result = run(spec)
    with open(out_path, "w") as f:
        json.dump(result, f)


def _inspect_models_here() -> None:
    """vLLM inspects a model class it meets for the first time (unless ``$VLLM_CACHE_ROOT/modelinfos`` holds the
    result for the class's source file) in a new Python process, which imports vLLM again (about 8 s on 2 cores;
    a family test meets two classes per family), to keep CUDA out of the engine's process. On the CPU, with the
    engines' cores in this process, which imports the classes anyway to serve them, inspect them here."""
    from vllm.model_executor.models import registry

    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda fn: fn()


class _update_block_tables:
    """While active, vLLM's CPU attention metadata builder says it supports ``update_block_table`` and implements it
    as FlashAttention's builder does (a copy of the metadata with another block table and slot mapping), so the model
    runner builds metadata once per builder class and KV-cache spec and copies it to the other KV-cache groups of that
    spec, as on a GPU; ``count`` counts the copies. (The CPU builder's metadata differs between groups of one spec only
    in those two fields.)"""

    def __enter__(self):
        import copy

        from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder as builder

        self.builder, self.count = builder, 0
        self.saved = {k: builder.__dict__.get(k) for k in ("supports_update_block_table", "update_block_table")}

        def update_block_table(_, metadata, blk_table, slot_mapping):
            self.count += 1
            new = copy.copy(metadata)
            new.block_table, new.slot_mapping = blk_table, slot_mapping
            return new

        builder.supports_update_block_table, builder.update_block_table = True, update_block_table
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                delattr(self.builder, k)
            else:
                setattr(self.builder, k, v)


def _output(o) -> dict:
    """What the tests compare of one request's output (module docstring)."""
    c = o.outputs[0]
    ranked = sorted(c.logprobs[0].items(), key=lambda kv: kv[1].rank)
    entry = {"greedy": list(c.token_ids), "top_ids": [k for k, _ in ranked],
             "top_logprobs": [v.logprob for _, v in ranked], "num_cached_tokens": o.num_cached_tokens or 0}
    if len(c.logprobs) > 1:  # the first decoding step (the second generated token)
        ranked = sorted(c.logprobs[1].items(), key=lambda kv: kv[1].rank)
        entry["decode"] = {"top_ids": [k for k, _ in ranked], "top_logprobs": [v.logprob for _, v in ranked]}
    return entry


def _fill_state_bytes(model) -> int:
    return model.model.fill_state_bytes()


def run(spec: dict) -> dict:
    """One engine on ``spec`` (module docstring); returns what :func:`main` writes for it."""
    if spec.get("update_block_table"):
        with _update_block_tables() as updates:
            result = _run(spec)
        return dict(result, block_table_updates=updates.count)
    return _run(spec)


class _RequestLines(logging.Handler):
    """The plugin's per-request lines of vLLM's log (``RidgeFill: request ...``) written in this process."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("RidgeFill: request "):
            self.lines.append(message)


def _run(spec: dict) -> dict:
    lines = _RequestLines()
    plugin_logger = logging.getLogger("vllm.ridgefill_vllm")
    plugin_logger.addHandler(lines)
    try:
        result = _run_engine(spec)
    finally:
        plugin_logger.removeHandler(lines)
    return dict(result, request_log=lines.lines)


def _run_engine(spec: dict) -> dict:
    os.environ.update(spec.get("env", {}))  # e.g. the thread binding of tensor-parallel ranks
    if spec.get("step_log"):  # the plugin appends one line per step with filled tokens (its worker inherits this)
        os.environ["RIDGEFILL_VLLM_STEP_LOG"] = spec["step_log"]
    else:
        os.environ.pop("RIDGEFILL_VLLM_STEP_LOG", None)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    overrides = {"architectures": [spec["architecture"]]}
    if spec.get("ridgefill") is not None:
        overrides["ridgefill"] = spec["ridgefill"]
    engine = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_batched_tokens=1024,
                  enable_chunked_prefill=False, enable_prefix_caching=False, seed=0)
    engine.update(spec.get("engine", {}))
    llm = LLM(spec["model_dir"], hf_overrides=overrides, skip_tokenizer_init=False, **engine)
    try:
        g = spec["gen_tokens"]
        params = SamplingParams(max_tokens=g, min_tokens=g, temperature=0.0, logprobs=spec["top"])
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
        if spec.get("abort"):  # a request aborted after some steps, before the prompts
            core = llm.llm_engine
            core.add_request("aborted", TokensPrompt(prompt_token_ids=spec["abort"]["prompt"]), params)
            for _ in range(spec["abort"]["steps"]):
                core.step()
            core.abort_request(["aborted"])
        if spec.get("sequential"):  # one request after another (prefix caching: a later one may hit earlier blocks)
            outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        cache = llm.llm_engine.vllm_config.cache_config
        result = {"prompts": [_output(o) for o in outs], "block_size": cache.block_size,
                  "num_blocks": cache.num_gpu_blocks, "kv_cache_memory_bytes": cache.kv_cache_memory_bytes}
        if spec.get("then_sequential"):  # the same prompts one after another, from an empty prefix cache
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache")
            result["sequential"] = [_output(llm.generate([p], params, use_tqdm=False)[0]) for p in prompts]
        if spec.get("needles"):  # needle prompts, one generate call after the prompts: greedy answers as text
            answers = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["needles"]],
                                   SamplingParams(max_tokens=g, temperature=0.0), use_tqdm=False)
            result["needles"] = [o.outputs[0].text for o in answers]
        if spec.get("fill_state"):  # what the fill allocated for the KV pool (0 before a fill step)
            result["fill_state_bytes"] = llm.apply_model(_fill_state_bytes)[0]
        if spec.get("try_prompt_logprobs"):
            try:
                llm.generate([TokensPrompt(prompt_token_ids=spec["prompts"][0])],
                             SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
                result["prompt_logprobs_error"] = None
            except Exception as e:  # the plugin's refusal; reported to the test, which checks its text
                result["prompt_logprobs_error"] = f"{type(e).__name__}: {e}"
    finally:
        llm.llm_engine.engine_core.shutdown()  # the next engine of this process starts on a free machine
        del llm
        gc.collect()
    return result


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
