"""The plugin behind vLLM's OpenAI-compatible server, driven by the ``openai`` client.

One server process serves the folder ``ridgefill export-vllm`` writes for the bundled SmolLM2-135M-Instruct with the
reference's maps and tail (``ridgefill.export_vllm``: its ``config.json`` names the RidgeFill class and holds the
settings; the server gets no ``--hf-overrides``), float32, chunked prefill and prefix caching on (vLLM's defaults).
Completions and chat, streaming and not, eight concurrent long requests, the refusal of ``prompt_logprobs`` (HTTP
400), the per-request lines in the server's log, and a server started with a maps file that does not exist (through
``--hf-overrides``).
"""

import importlib.util
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

GEN = 12
MODEL = "ridgefill-smollm2"


def _server_module():
    """``scripts/vllm_server.py`` (start and stop vLLM's OpenAI server), imported as a module."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "vllm_server.py"
    spec = importlib.util.spec_from_file_location("vllm_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vllm_server = _server_module()


def _serve(model_dir: str, port: int, log: Path, overrides: dict | None = None, wait: bool = True):
    args = ["--model", model_dir, "--served-model-name", MODEL, "--dtype", "float32", "--enforce-eager",
            "--max-model-len", "1024", "--max-num-batched-tokens", "512", "--seed", "0"]
    if overrides is not None:
        args += ["--hf-overrides", json.dumps(overrides)]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    return vllm_server.start(args, port, log, env, timeout=600, wait=wait)


@pytest.fixture(scope="module")
def exported(reference, work_dir) -> Path:
    """The model folder of ``ridgefill export-vllm`` for the bundled model, the reference's maps and tail (row
    selection: the default, ``auto``, which these maps, recording no setting, resolve to ``on``)."""
    from ridgefill.export_vllm import export_vllm

    out = work_dir / "exported"
    shutil.rmtree(out, ignore_errors=True)
    return export_vllm(reference["model_dir"], reference["maps"], out, tail=reference["tail"])


@pytest.fixture(scope="module")
def server(exported, work_dir):
    port, log = vllm_server.free_port(), work_dir / "server.log"
    proc = _serve(str(exported), port, log)
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600)
    finally:
        vllm_server.stop(proc)


@pytest.fixture(scope="module")
def tokenizer(reference):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference["model_dir"])


def _complete(client, ids, extra_body=None, **extra):
    """Greedy completion of ``GEN`` tokens (EOS ignored, as in the reference's greedy continuation)."""
    return client.completions.create(model=MODEL, prompt=ids, max_tokens=GEN, temperature=0,
                                     extra_body={"ignore_eos": True, **(extra_body or {})}, **extra)


def test_completions_equal_the_reference_streaming_or_not(server, reference, tokenizer):
    """The server (row selection at its default, ``auto``: ``on`` with these maps) completes each prompt greedily with
    the reference's greedy continuation with selection ``on`` (the same text), and the streamed chunks join to the same
    text."""
    for p in reference["prompts"]:
        want = tokenizer.decode(p["select"]["greedy"], skip_special_tokens=True)
        got = _complete(server, p["ids"]).choices[0].text
        assert got == want
        streamed = "".join(c.choices[0].text for c in _complete(server, p["ids"], stream=True))
        assert streamed == want


def test_chat_streaming_equals_not_streaming(server, reference, tokenizer):
    document = tokenizer.decode(reference["prompts"][0]["ids"][1:600])
    messages = [{"role": "user", "content": document + "\n\nWho is this passage about? Answer in one sentence."}]
    one = server.chat.completions.create(model=MODEL, messages=messages, max_tokens=GEN, temperature=0)
    text = one.choices[0].message.content
    assert one.usage.prompt_tokens > reference["tail"] and text.strip()  # long enough that rows are filled
    chunks = server.chat.completions.create(model=MODEL, messages=messages, max_tokens=GEN, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_eight_concurrent_long_requests_equal_the_same_requests_alone(server, reference):
    a, b, c = (p["ids"] for p in reference["prompts"])
    prompts = [a, b, c, a[:650], a[:1] + a[50:700], b[:1] + b[20:520], a[:1] + a[100:640], c + b[1:200]]
    alone = [_complete(server, ids).choices[0].text for ids in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda ids: _complete(server, ids).choices[0].text, prompts))
    assert together == alone


def test_prompt_logprobs_refused_with_http_400(server, reference):
    with pytest.raises(openai.BadRequestError) as err:
        _complete(server, reference["prompts"][2]["ids"], extra_body={"prompt_logprobs": 1})
    assert err.value.status_code == 400
    assert "prompt_logprobs are not available with RidgeFill" in str(err.value)


def test_the_exported_folder_names_the_class_and_the_settings(exported, reference):
    """What the server above read: the folder's config.json names the RidgeFill class and the settings, with the maps
    file in a subfolder beside the model's other files (the weights: hard links where the file system allows, else
    copies)."""
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["RidgeFillLlamaForCausalLM"]
    assert config["ridgefill"] == {"maps": "ridgefill/maps.safetensors", "tail": reference["tail"], "select": "auto"}
    assert (exported / "ridgefill" / "maps.safetensors").read_bytes() == Path(reference["maps"]).read_bytes()
    model = Path(reference["model_dir"])
    assert sorted(f.name for f in exported.iterdir()) == sorted([f.name for f in model.iterdir() if f.is_file()]
                                                               + ["ridgefill"])
    for f in model.iterdir():
        if f.is_file() and f.name != "config.json":
            assert (exported / f.name).stat().st_size == f.stat().st_size, f.name


def test_the_server_log_has_a_line_per_prefilled_request(server, reference, work_dir):
    """vLLM's log (the server's output) names the maps the plugin read and, per request with filled rows, its filled,
    exact and chosen rows and the selection's time."""
    _complete(server, reference["prompts"][2]["ids"])
    out = (work_dir / "server.log").read_text()
    assert "RidgeFill: maps " in out and "ridgefill/maps.safetensors" in out
    n = len(reference["prompts"][2]["ids"])
    assert f"prompt {n} tokens" in out and f"exact rows (tail {reference['tail']}, chosen" in out and "selection " in out


def test_a_missing_maps_file_is_refused_at_start_naming_it(reference, work_dir):
    missing = str(work_dir / "no-such-maps.safetensors")
    log = work_dir / "server-bad-maps.log"
    overrides = {"architectures": ["RidgeFillLlamaForCausalLM"], "ridgefill": {"maps": missing, "tail": reference["tail"]}}
    proc = _serve(reference["model_dir"], vllm_server.free_port(), log, overrides, wait=False)
    try:
        proc.wait(600)
    finally:
        vllm_server.stop(proc)
    out = log.read_text()
    assert proc.returncode != 0
    assert "no-such-maps.safetensors" in out and "does not exist" in out
