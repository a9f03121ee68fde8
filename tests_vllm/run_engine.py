"""Run one vLLM engine on prompts given as token ids and write what the tests compare (a JSON file).

Run as a script (vLLM spawns its engine process, so each engine gets its own Python process and
this file needs the ``__main__`` guard): ``python run_engine.py SPEC.json OUT.json``. ``SPEC`` holds
``model_dir``, ``architecture``, ``ridgefill`` (the plugin settings or ``null``), ``prompts`` (lists of
token ids), ``gen_tokens``, ``top``, ``engine`` (extra ``vllm.LLM`` arguments) and ``step_log``
(a file for the plugin's per-step log, or absent), ``env`` (environment variables for the engine's
processes, or absent), ``sequential`` (send the prompts one after another
instead of in one call) and ``needles`` (more prompts, answered greedily after the others, as text). ``OUT`` gets the KV block size and, per prompt, the greedy continuation, the first
token's top log-probabilities (and the second's, ``decode``: the first decoding step) and the prompt tokens found in the prefix cache, the needle answers, and, with
``try_prompt_logprobs``, the error a prompt-logprobs request raised (or ``null``). A spec ``{"runs": [SPEC, ...]}``
runs several engines one after another, each with its engine core in this process (vLLM is imported once), and
writes ``{"runs": [OUT, ...]}``; an engine that raised gets ``{"error": TRACEBACK}`` there and the next ones still run.
"""

import gc
import json
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


def run(spec: dict) -> dict:
    """One engine on ``spec`` (module docstring); returns what :func:`main` writes for it."""
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
        if spec.get("sequential"):  # one request after another (prefix caching: a later one may hit earlier blocks)
            outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        result = {"prompts": [], "block_size": llm.llm_engine.vllm_config.cache_config.block_size}
        for o in outs:
            c = o.outputs[0]
            first = c.logprobs[0]
            ranked = sorted(first.items(), key=lambda kv: kv[1].rank)
            entry = {"greedy": list(c.token_ids), "top_ids": [k for k, _ in ranked],
                     "top_logprobs": [v.logprob for _, v in ranked], "num_cached_tokens": o.num_cached_tokens or 0}
            if len(c.logprobs) > 1:  # the first decoding step (the second generated token)
                ranked = sorted(c.logprobs[1].items(), key=lambda kv: kv[1].rank)
                entry["decode"] = {"top_ids": [k for k, _ in ranked], "top_logprobs": [v.logprob for _, v in ranked]}
            result["prompts"].append(entry)
        if spec.get("needles"):  # needle prompts, one generate call after the prompts: greedy answers as text
            answers = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["needles"]],
                                   SamplingParams(max_tokens=g, temperature=0.0), use_tqdm=False)
            result["needles"] = [o.outputs[0].text for o in answers]
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
