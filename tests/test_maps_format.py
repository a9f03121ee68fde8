"""The maps file as docs/maps-format.md specifies it, read by ``ridgefill.maps.load_maps`` from the example
files ``tests/data/maps/`` (``scripts/make_example_maps.py``). ``tests_vllm/test_maps_format.py`` reads the
same files with the vLLM plugin's reader and asserts the same values."""

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from ridgefill.errors import MapsFormatError
from ridgefill.maps import load_maps

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "maps"


def _script():
    spec = importlib.util.spec_from_file_location("make_example_maps", ROOT / "scripts" / "make_example_maps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _grid(*shape):
    return torch.meshgrid(*(torch.arange(n, dtype=torch.float64) for n in shape), indexing="ij")


def _spec_sha256(t: torch.Tensor) -> str:
    """A tensor's content hash as the specification words it: SHA-256 of the dtype name, the shape as Python
    prints a tuple, and the bytes in C order."""
    return hashlib.sha256(f"float32{tuple(t.shape)}".encode() + t.contiguous().numpy().tobytes()).hexdigest()


def test_example_files_are_what_the_script_writes(tmp_path):
    _script().write(tmp_path)
    for name in ("inputs.safetensors", "context.safetensors", "kv.safetensors"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("name, split, shape, lambdas, kind, context", [
    ("inputs.safetensors", 1, (2, 4, 4), [0.5, 2.0], "inputs", 0),
    ("context.safetensors", 0, (2, 8, 4), [1.0, 0.25], "inputs", 1),
    ("kv.safetensors", 1, (1, 4, 2), [0.125], "kv", 0),
])
def test_example_maps_read_as_specified(name, split, shape, lambdas, kind, context, version):
    """Format version 2 (the writer's) and version 1 (``tests/data/maps/v1/``, still read) hold the same maps;
    version 2's context example also holds induction scores and a selection setting."""
    maps = load_maps((DATA if version == 2 else DATA / "v1") / name)
    assert maps.meta["format_version"] == version
    n, f, k = shape
    i, r, c = _grid(n, f, k)
    assert maps.split == split and maps.lambdas == lambdas and maps.kind == kind and maps.context == context
    assert maps.weights.dtype == torch.float32 and tuple(maps.weights.shape) == shape
    assert torch.equal(maps.weights.double(), (i + 1) / 2 + r / 4 - c / 8)
    i2, c2 = _grid(n, k)
    assert torch.equal(maps.biases.double(), i2 - c2 / 2)
    assert maps.meta["weight_sample"] == [0.5, -0.25, 1.0, 0.0]
    if name == "context.safetensors":
        assert maps.context_penalty == 0.5
        assert torch.equal(maps.mean_h.double(), torch.arange(4) / 4)
        assert torch.equal(maps.mean_x.double(), i2 + c2 / 8)
        assert torch.equal(maps.cov_h.double(), torch.eye(4, dtype=torch.float64) + 1 / 16)
    else:
        assert maps.mean_h is None and maps.cov_h is None
    if name == "context.safetensors" and version == 2:
        i3, h3 = _grid(3, 2)
        assert torch.equal(maps.induction.double(), i3 / 4 + h3 / 8) and maps.select == "one-pass"
    else:
        assert maps.induction is None and maps.select is None


def test_example_content_hashes_follow_the_specification():
    """The stored hashes are the SHA-256 of (dtype name, shape tuple, C-order bytes) per tensor and of the
    sorted-key JSON of the hashed header fields, each ``null`` when absent."""
    from safetensors import safe_open

    with safe_open(str(DATA / "context.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["ridgefill"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    stored = meta["content_sha256"]
    assert sorted(stored["tensors"]) == ["biases", "cov_h", "induction", "mean_h", "mean_x", "weights"]
    for k, t in tensors.items():
        assert stored["tensors"][k] == _spec_sha256(t), k
    fields = {"format_version": 2, "split": 0, "lambdas": [1.0, 0.25], "kind": "inputs", "context": 1,
              "context_penalty": 0.5, "select": "one-pass"}
    assert stored["fields"] == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    with safe_open(str(DATA / "inputs.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["ridgefill"])
    fields = {"format_version": 2, "split": 1, "lambdas": [0.5, 2.0], "kind": "inputs", "context": 0,
              "context_penalty": None, "select": None}
    assert meta["content_sha256"]["fields"] == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    with safe_open(str(DATA / "v1" / "inputs.safetensors"), framework="pt") as f:  # version 1: no select field
        meta = json.loads(f.metadata()["ridgefill"])
    fields = {"format_version": 1, "split": 1, "lambdas": [0.5, 2.0], "kind": "inputs", "context": 0,
              "context_penalty": None}
    assert meta["content_sha256"]["fields"] == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def test_corrupted_example_files_are_refused(tmp_path):
    cases = _script().corrupted_copies(DATA, tmp_path)
    assert len(cases) == 6
    for path, error in cases:
        if error is None:
            assert load_maps(path).meta["model_name"] == "renamed"  # provenance: not hashed
            continue
        with pytest.raises(MapsFormatError, match=error):
            load_maps(path)
