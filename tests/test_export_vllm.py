"""``ridgefill export-vllm``: a model folder vLLM serves with the fill (docs/vllm.md, "Serve"). Checked here: the
folder (config.json names the plugin's class and holds the settings, the maps and the model's other files beside
it, nothing left when a write fails), the refusals (an existing folder, a bad tail or selection, a query-agnostic
selection, an architecture without a RidgeFill class, maps of another model) and the CLI, and the CLI's message when
a command needs a package of the `full` extra (the plugin's environment has ridgefill without it).
tests_vllm/test_server.py serves such a folder with vLLM's OpenAI server, without --hf-overrides."""
import json

import pytest
from conftest import tiny_llama
from ridgefill.calibration import calibrate
from ridgefill.cli import main
from ridgefill.errors import InputError
from ridgefill.export_vllm import MAPS_NAME, VLLM_ARCHITECTURES, export_vllm, vllm_class
from ridgefill.maps import load_maps

TEXT = "".join(chr(97 + (i * 7 + i // 13) % 26) + (" " if i % 5 == 4 else "") for i in range(1500))


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 101 for c in text]}


@pytest.fixture(scope="module")
def model_and_maps(tmp_path_factory):
    """A tiny Llama saved as a Hugging Face folder, and maps fitted on it (S = 1)."""
    folder = tmp_path_factory.mktemp("model") / "tiny"
    model = tiny_llama(seed=3)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    maps = calibrate(model, CharTokenizer(), [TEXT], split=1, tokens=256, chunk=128, progress=False)
    path = folder.parent / "maps.safetensors"
    maps.save(path)
    return folder, path


def test_the_folder_names_the_class_and_holds_the_settings_and_the_maps(model_and_maps, tmp_path):
    folder, maps = model_and_maps
    out = export_vllm(folder, maps, tmp_path / "served", tail=32, select="off")
    config = json.loads((out / "config.json").read_text())
    original = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["RidgeFillLlamaForCausalLM"]
    assert config["ridgefill"] == {"maps": MAPS_NAME, "tail": 32, "select": "off"}
    assert {k: v for k, v in config.items() if k not in ("architectures", "ridgefill")} == {
        k: v for k, v in original.items() if k != "architectures"}
    assert (out / MAPS_NAME).read_bytes() == maps.read_bytes()
    # vLLM loads every *.safetensors file at the folder's top as weights: only the model's are there
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(p.name for p in folder.glob("*.safetensors"))
    for f in folder.iterdir():
        if f.name != "config.json":
            assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]  # no temporary folder left
    defaults = json.loads((export_vllm(folder, maps, tmp_path / "d") / "config.json").read_text())["ridgefill"]
    assert defaults == {"maps": MAPS_NAME, "tail": 256, "select": "auto"}  # the plugin follows the maps' setting


def test_select_auto_follows_the_maps_recorded_setting(model_and_maps, tmp_path):
    """``select="auto"`` (the default) is written as given, for the plugin to resolve against the maps; maps recording a
    query-agnostic setting are refused with it, naming the recorded setting; a recorded one-pass setting is served."""
    folder, maps = model_and_maps
    for recorded, refused in (("one-pass", False), ("prompt", True)):
        tuned = load_maps(maps)
        tuned.meta["select"] = recorded
        path = tmp_path / f"{recorded}.safetensors"
        tuned.save(path)
        assert load_maps(path).select == recorded
        if refused:
            with pytest.raises(InputError, match="'auto'.*recorded setting 'prompt'.*query-agnostic"):
                export_vllm(folder, path, tmp_path / recorded)
            assert not (tmp_path / recorded).exists()
            continue
        out = export_vllm(folder, path, tmp_path / recorded)
        assert json.loads((out / "config.json").read_text())["ridgefill"]["select"] == "auto"


def test_class_names_are_the_plugins():
    assert vllm_class("Qwen3ForCausalLM") == "RidgeFillQwen3ForCausalLM"
    assert "LlamaForCausalLM" in VLLM_ARCHITECTURES
    with pytest.raises(InputError, match="GPT2LMHeadModel.*no RidgeFill class.*served: LlamaForCausalLM"):
        vllm_class("GPT2LMHeadModel")


def test_refusals(model_and_maps, tmp_path):
    folder, maps = model_and_maps
    (tmp_path / "exists").mkdir()
    for kwargs, words in [({"out": tmp_path / "exists"}, "exists"), ({"tail": 0}, "tail"),
                          ({"select": "on+nonsense"}, "select|spec|part"), ({"select": "prompt"}, "query-agnostic"),
                          ({"model_dir": tmp_path}, "no config.json")]:
        args = dict(model_dir=folder, maps_path=maps, out=tmp_path / "new")
        args.update(kwargs)
        with pytest.raises(InputError, match=words):
            export_vllm(args.pop("model_dir"), args.pop("maps_path"), args.pop("out"), **args)
        assert not (tmp_path / "new").exists()
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, hidden_size=32)))
    with pytest.raises(InputError, match="do not fit the model"):
        export_vllm(other, maps, tmp_path / "new")
    (other / "config.json").write_text(json.dumps(dict(config, architectures=["GPT2LMHeadModel"])))
    with pytest.raises(InputError, match="no RidgeFill class"):
        export_vllm(other, maps, tmp_path / "new")
    (other / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"} |
                                                  {"model_type": "gpt2"}))
    with pytest.raises(InputError, match="0 architectures .* model_type 'gpt2'.*served: LlamaForCausalLM"):
        export_vllm(other, maps, tmp_path / "new")


def test_a_config_without_architectures_gets_the_class_of_its_model_type(model_and_maps, tmp_path):
    """A config that names no architecture (a copy saved from a GGUF file, the bundled model's) gets the class serving
    its model_type."""
    folder, maps = model_and_maps
    bare = tmp_path / "bare"
    bare.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    out = export_vllm(bare, maps, tmp_path / "served")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["RidgeFillLlamaForCausalLM"]


def test_cli(model_and_maps, tmp_path, capsys):
    folder, maps = model_and_maps
    out = tmp_path / "served"
    assert main(["export-vllm", "--model", str(folder), "--maps", str(maps), "--out", str(out), "--tail", "16"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["ridgefill"]["tail"] == 16
    assert main(["export-vllm", "--model", str(folder), "--maps", str(maps), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["export-vllm", "--model", str(folder), "--maps", str(tmp_path / "none"), "--out",
                 str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_command_missing_a_full_extra_package_names_the_extra(monkeypatch, capsys):
    """Without the `full` extra (a core install: the maps reader and row selection), a command that needs one of its
    packages stops with one error line naming the extra; other missing modules are not hidden."""
    import ridgefill.cli as cli

    def needs(name):
        def command(a):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return command

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(func=needs("transformers"))
    assert cli.main(["convert"]) == 2
    err = capsys.readouterr().err
    assert "`ridgefill convert` needs transformers" in err and "pip install 'ridgefill[full]'" in err
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(func=needs("nonexistent_module"))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["convert"])
