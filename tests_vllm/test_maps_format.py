"""The example maps files of docs/maps-format.md (``tests/data/maps/``, ``scripts/make_example_maps.py``) read
in the vLLM environment by the plugin's ``load_fill_maps``, with the values ``tests/test_maps_format.py``
asserts for ``ridgefill.maps.load_maps``: one reader serves both environments."""

import importlib.util
from pathlib import Path

import pytest
import torch

from ridgefill_vllm.errors import MapsFormatError
from ridgefill_vllm.maps import load_fill_maps

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "maps"


def _script():
    spec = importlib.util.spec_from_file_location("make_example_maps", ROOT / "scripts" / "make_example_maps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _grid(*shape):
    return torch.meshgrid(*(torch.arange(n, dtype=torch.float64) for n in shape), indexing="ij")


@pytest.mark.parametrize("name, split, shape, lambdas, context", [
    ("inputs.safetensors", 1, (2, 4, 4), [0.5, 2.0], 0),
    ("context.safetensors", 0, (2, 8, 4), [1.0, 0.25], 1),
])
def test_example_maps_read_as_specified(name, split, shape, lambdas, context):
    maps = load_fill_maps(DATA / name)
    n, f, k = shape
    i, r, c = _grid(n, f, k)
    assert maps.split == split and maps.meta["lambdas"] == lambdas and maps.context == context
    assert maps.weights.dtype == torch.float32 and tuple(maps.weights.shape) == shape
    assert torch.equal(maps.weights.double(), (i + 1) / 2 + r / 4 - c / 8)
    i2, c2 = _grid(n, k)
    assert torch.equal(maps.biases.double(), i2 - c2 / 2)
    assert maps.meta["weight_sample"] == [0.5, -0.25, 1.0, 0.0]
    maps.check_shape(num_layers=split + 1 + n, hidden=4)
    maps.check_weight_sample([0.0, 1.0, -0.25, 0.5], torch.float32)


def test_example_kv_maps_are_refused():
    with pytest.raises(MapsFormatError, match="kind 'kv'.*refit without --targets kv"):
        load_fill_maps(DATA / "kv.safetensors")


def test_corrupted_example_files_are_refused(tmp_path):
    cases = _script().corrupted_copies(DATA, tmp_path)
    assert len(cases) == 6
    for path, error in cases:
        if error is None:
            assert load_fill_maps(path).meta["model_name"] == "renamed"  # provenance: not hashed
            continue
        with pytest.raises(MapsFormatError, match=error):
            load_fill_maps(path)
