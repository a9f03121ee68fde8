"""Shared fixture of the llama.cpp engine's tests: the folder holding the stock and patched builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engines" / "llamacpp"


@pytest.fixture(scope="module")
def build() -> Path:
    """``$RIDGEFILL_LLAMACPP`` when set, else the folder ``engines/llamacpp/build.sh`` prints (building there
    first when its cache lacks this patch)."""
    given = os.environ.get("RIDGEFILL_LLAMACPP", "").strip()
    if given:
        return Path(given)
    out = subprocess.run(["bash", str(ENGINE / "build.sh")], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=sys.executable))
    return Path(out.stdout.strip().splitlines()[-1])
