"""``ridgefill report`` input handling: merging needle reports, xz-compressed inputs."""

import json
import lzma

import pytest

from ridgefill import InputError
from ridgefill.evaluate.report import load_reports, merge_needle_reports


def _needle(path, lengths, hits):
    trials = [{"variant": "single", "length": n, "depth": 0.5,
               "results": {"exact": {"score": 100.0}, "15/ridge": {"score": 100.0 if h else 0.0}}}
              for n in lengths for h in hits]
    return {"kind": "needle", "model": "m", "chat": False, "tail": 64, "lengths": list(lengths), "trials": trials,
            "trials_per_cell": len(hits), "_path": path, "argv": ["eval", "needle"], "wall_seconds": 1.0}


def test_needle_reports_merge_only_over_disjoint_lengths():
    short, long_ = _needle("a.json", [1024], [1, 0]), _needle("b.json", [8192], [1])
    (merged,) = merge_needle_reports([short, long_])
    scores = {(r["length"], r["system"]): r for r in merged["scores"]}
    assert scores[(1024, "15/ridge")]["score"] == 50.0 and scores[(1024, "15/ridge")]["trials"] == 2
    assert scores[(8192, "15/ridge")]["score"] == 100.0 and merged["_path"] == "a.json + b.json"
    # the same length twice means the same seeded prompts: kept apart, not pooled
    again = merge_needle_reports([_needle("a.json", [1024], [1, 0]), _needle("c.json", [1024], [0])])
    assert [r["_path"] for r in again] == ["a.json", "c.json"]


def test_load_reports_reads_xz_and_rejects_foreign_files(tmp_path):
    rep = _needle("x", [1024], [1])
    (tmp_path / "n.json.xz").write_bytes(lzma.compress(json.dumps(rep).encode()))
    (loaded,) = load_reports([tmp_path / "n.json.xz"])
    assert loaded["trials"] == rep["trials"] and loaded["_path"] == "n.json.xz"
    (tmp_path / "bad.json.xz").write_bytes(b"not xz")
    with pytest.raises(InputError, match="not readable JSON"):
        load_reports([tmp_path / "bad.json.xz"])
    (tmp_path / "other.json").write_text('{"kind": "other"}')
    with pytest.raises(InputError, match="not the output of"):
        load_reports([tmp_path / "other.json"])


def test_provenance_commands_can_be_pasted_back():
    """An empty argument (``--modes ''``) and a spec with spaces survive in the report's command line,
    also for merged reports."""
    import shlex

    from ridgefill.evaluate.report import _provenance

    argv = ["eval", "needle", "--modes", "", "--select", "prompt,budget=30"]
    rep = {**_needle("a.json", [1024], [1]), "argv": argv, "num_layers": 30}
    line = _provenance(rep)
    assert "`ridgefill eval needle --modes '' --select prompt,budget=30`" in line
    assert shlex.split(line.split("`")[3])[1:] == argv
    (merged,) = merge_needle_reports([rep, {**_needle("b.json", [8192], [1]), "argv": argv[:2], "num_layers": 30}])
    assert "`ridgefill eval needle --modes '' --select prompt,budget=30 ; ridgefill eval needle`" in _provenance(merged)
