"""A Hugging Face model directory checked as a checkpoint is (pgcli.lm.model_files): headers only, one line naming
the directory and the file."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pgcli.errors import ConfigError
from pgcli.lm.model_files import check_model_dir, check_state_fits, check_tokenizer_files, safetensors_header

OPTION = "model.path=m"
SHAPES = {"w": (4, 2), "b": (4,)}


def _model(directory: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    (directory / "tokenizer.json").write_text("{}")
    save_file(tensors or {"w": torch.zeros(4, 2), "b": torch.zeros(4)}, directory / "model.safetensors")
    return directory


def test_a_whole_model_directory_passes(tmp_path):
    model = _model(tmp_path / "m")
    check_model_dir(model, OPTION, SHAPES)
    assert {name: tuple(v["shape"]) for name, v in safetensors_header(model / "model.safetensors", OPTION).items()} == {
        "w": (4, 2),
        "b": (4,),
    }


@pytest.mark.parametrize("cut", [1, 8, 40])
def test_a_truncated_weights_file_names_its_size(tmp_path, cut: int):
    model = _model(tmp_path / "m")
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size - cut)
    with pytest.raises(ConfigError) as info:
        check_model_dir(model, OPTION, SHAPES)
    assert str(info.value).startswith(f"{OPTION}: {weights} ")
    assert "truncated" in str(info.value) or "not a readable safetensors file" in str(info.value)


def test_weights_of_another_shape_than_config_json_are_named(tmp_path):
    model = _model(tmp_path / "m", {"w": torch.zeros(4, 3), "b": torch.zeros(4)})
    with pytest.raises(ConfigError) as info:
        check_model_dir(model, OPTION, SHAPES)
    assert str(info.value) == (
        f"{OPTION}: {model / 'model.safetensors'} holds w of shape [4, 3] where {model / 'config.json'} gives [4, 2]; "
        "the weights are another model's"
    )


def test_missing_weights_shards_or_tokenizer_are_one_line(tmp_path):
    model = _model(tmp_path / "m")
    (model / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"has no weights \(model.safetensors, model.safetensors.index.json"):
        check_model_dir(model, OPTION)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    with pytest.raises(ConfigError, match=r"model-00001.safetensors is missing \(listed in model.safetensors.index"):
        check_model_dir(model, OPTION)
    (model / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"has no tokenizer file \(tokenizer.json, tokenizer.model"):
        check_tokenizer_files(model, OPTION)
    (model / "vocab.json").write_text("{}")
    check_tokenizer_files(model, OPTION)


def test_a_damaged_pickled_weights_file_is_named(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer.model").write_bytes(b"x")
    with zipfile.ZipFile(model / "pytorch_model.bin", "w") as archive:
        archive.writestr("data.pkl", b"0" * 100)
    check_model_dir(model, OPTION)
    data = (model / "pytorch_model.bin").read_bytes()
    (model / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"pytorch_model.bin is damaged \(.*\); copy or save the model again$"):
        check_model_dir(model, OPTION)


def test_a_runs_weights_that_do_not_fit_the_base_name_both(tmp_path):
    weights, base = tmp_path / "run" / "policy.pt", tmp_path / "base"
    check_state_fits({"w": (4, 2)}, SHAPES, weights, base, OPTION)
    with pytest.raises(ConfigError) as info:
        check_state_fits({"w": (8, 2)}, SHAPES, weights, base, OPTION)
    assert str(info.value) == (
        f"{OPTION}: {weights} holds w of shape [8, 2] and the base model in {base} ({base / 'config.json'}) has "
        "[4, 2]; the base is not the model the run trained (restore it)"
    )
    with pytest.raises(ConfigError, match=r"holds extra.weight, which the base model in .* has not"):
        check_state_fits({"extra.weight": (1,)}, SHAPES, weights, base, OPTION)
