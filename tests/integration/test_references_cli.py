"""A run's references through the real CLI (docs/runs.md, "Run ids"; docs/lm.md, "Hugging Face models"): a relative
``model.path`` recorded absolute, so ``pgcli eval`` and ``init=`` of the run work from any directory; ``init=`` and
``rm:`` naming a control run refused from its record before anything is downloaded; a damaged or replaced base model
one line naming the directory and the file, exit 2, before a run directory exists; the hub-id error quoting the
library whole; ``pgcli export`` in a folder without a store in its own words."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, cli_env, run_pgcli

HF_TINY = ["env.n_digits=2", "env.n_eval=16", "env.eval_pass_k=2", "env.eval_samples=4", "progress=false"]
RL_TINY = ["total_steps=8", "eval.every=0", "algo.group_size=4", "algo.n_groups=2", "algo.batch_size=8"]


class RelativeRun(NamedTuple):
    store: Store
    workdir: Path
    run_id: str
    base: Path
    """The base model, as the run's working directory holds it (``./tl``)."""


@pytest.fixture(scope="module")
def relative_run(tmp_path_factory: pytest.TempPathFactory, tiny_hf_model: Path) -> RelativeRun:
    """A `pgcli sft` of the random Llama typed as ``model.path=./tl`` (a copy in the run's working directory)."""
    root = tmp_path_factory.mktemp("relative")
    store, workdir = Store(root / "store"), root / "work"
    workdir.mkdir()
    shutil.copytree(tiny_hf_model, workdir / "tl")
    args = [
        "sft",
        "env=addition",
        "model=hf",
        "model.path=./tl",
        "model.lora.r=0",
        f"tracking.uri={store.uri}",
        "total_steps=16",
        "eval.every=16",
        "algo.batch_size=8",
        "algo.warmup_steps=4",
        "checkpoint_every=16",
        *HF_TINY,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    return RelativeRun(store, workdir, run.info.run_id, workdir / "tl")


def test_a_relative_model_path_is_recorded_absolute_and_the_run_works_from_anywhere(
    relative_run: RelativeRun, tmp_path: Path
):
    base = str(relative_run.base.resolve())
    (run,) = relative_run.store.runs("addition")
    assert run.data.params["model.path"] == base
    run_dir = Path(run.data.tags["output_dir"])
    assert "model.path=" + base in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert json.loads((run_dir / "model" / "agent.json").read_text())["config"]["model"]["path"] == base
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    uri = f"tracking.uri={relative_run.store.uri}"
    proc = run_pgcli(["eval", relative_run.run_id, uri, "--no-log"], cwd=elsewhere, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # init= compares the base models it names, not the strings: ./tl from the run's directory is the same model
    proc = run_pgcli(
        [
            "train",
            "algo=grpo",
            "env=addition",
            f"init={relative_run.run_id}",
            "model=hf",
            "model.path=./tl",
            uri,
            *RL_TINY,
            "--cfg",
            "job",
        ],
        cwd=relative_run.workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_base_model_replaced_after_training_is_one_line_before_anything_is_created(
    relative_run: RelativeRun, tmp_path: Path
):
    from pgcli.lm.random_hf import write_random_model

    other = write_random_model(tmp_path / "narrow", hidden=32)  # the base replaced by a model of another shape
    saved = tmp_path / "saved"
    relative_run.base.rename(saved)
    shutil.copytree(other, relative_run.base)
    try:
        weights = Path(relative_run.store.runs("addition")[0].data.tags["output_dir"]) / "model" / "policy.pt"
        base = relative_run.base.resolve()
        line = (
            f"pgcli: error: model.path={base}: {weights} holds model.embed_tokens.weight of shape [128, 64] and the "
            f"base model in {base} ({base / 'config.json'}) has [128, 32]; the base is not the model the run trained "
            "(restore it)\n"
        )
        uri = f"tracking.uri={relative_run.store.uri}"
        proc = run_pgcli(["eval", relative_run.run_id, uri, "--no-log"], cwd=tmp_path, timeout=300)
        assert (proc.returncode, proc.stderr) == (2, line)
        proc = run_pgcli(
            ["train", "algo=grpo", "env=addition", f"init={relative_run.run_id}", uri, *RL_TINY, *HF_TINY],
            cwd=tmp_path,
            timeout=300,
        )
        assert (proc.returncode, proc.stderr) == (2, line)
        assert not (tmp_path / "outputs").exists()
    finally:
        shutil.rmtree(relative_run.base)
        saved.rename(relative_run.base)


def _truncated(model: Path) -> str:
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(size // 2)
    return f"{weights} is truncated ({size // 2:,} bytes, its header describes {size:,}); copy or save the model again"


def _no_tokenizer(model: Path) -> str:
    (model / "tokenizer.json").unlink()
    names = "tokenizer.json, tokenizer.model, vocab.json, vocab.txt"
    return f"{model} has no tokenizer file ({names}); save the model's tokenizer there (tokenizer.save_pretrained)"


def _other_weights(model: Path) -> str:
    from pgcli.lm.random_hf import write_random_model

    narrow = write_random_model(model.parent / "narrow", hidden=32)
    shutil.copyfile(narrow / "model.safetensors", model / "model.safetensors")  # config.json still says hidden 64
    return (
        f"{model / 'model.safetensors'} holds lm_head.weight of shape [128, 32] where {model / 'config.json'} gives "
        "[128, 64]; the weights are another model's"
    )


DAMAGE = {"truncated": _truncated, "no_tokenizer": _no_tokenizer, "other_weights": _other_weights}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_base_model_is_one_line_naming_the_file(tiny_hf_model: Path, tmp_path: Path, damage: str):
    model = tmp_path / "damaged"
    shutil.copytree(tiny_hf_model, model)
    reason = DAMAGE[damage](model)
    args = ["train", "algo=grpo", "env=addition", "model=hf", f"model.path={model}", "tracking=off", *RL_TINY, *HF_TINY]
    proc = run_pgcli(args, cwd=tmp_path, timeout=300)
    assert (proc.returncode, proc.stderr) == (2, f"pgcli: error: model.path={model}: {reason}\n")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("option", ["init", "rm"])
def test_a_control_run_is_refused_from_its_record_before_any_download(
    migrated_store: Store, tmp_path: Path, option: str
):
    client = migrated_store.client()
    experiment = client.create_experiment("cartpole", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, tags={"env_id": "CartPole-v1", "algo": "ppo", "env": "cartpole"})
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.zip").write_bytes(b"PK")
    client.log_artifacts(run.info.run_id, str(model), "model")
    client.set_terminated(run.info.run_id, "FINISHED")
    run_id = run.info.run_id
    typed = f"init={run_id}" if option == "init" else f"env.reward=rm:{run_id}"
    kind = "an SFT run" if option == "init" else "a reward-model run (pgcli rm)"
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["train", "algo=grpo", "env=addition", typed, f"tracking.uri={migrated_store.uri}", *RL_TINY, *HF_TINY]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    message = (
        f"{typed}: run {run_id} trained on env CartPole-v1, not a text task; pass {kind} (its run id or directory)"
    )
    assert (proc.returncode, proc.stderr) == (2, f"pgcli: error: {message}\n")
    assert not (workdir / "outputs").exists()  # nothing downloaded into outputs/init/<run id>, no run directory


def test_a_hub_id_that_cannot_be_fetched_quotes_the_library_whole(tmp_path: Path):
    hub = "pgcli-tests/no-such-model"
    script = (
        "from huggingface_hub import snapshot_download\n"
        f"try: snapshot_download({hub!r}, allow_patterns=['*.json'])\n"
        "except Exception as exc: print(' '.join(str(exc).split()))\n"
    )
    env = cli_env(HF_HUB_OFFLINE="1")
    library = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    reason = library.stdout.strip()
    assert len(reason) > 160  # longer than the cut that used to end it mid-word
    args = ["train", "algo=grpo", "env=addition", "model=hf", f"model.path={hub}", "tracking=off", *RL_TINY]
    proc = run_pgcli(args, cwd=tmp_path, timeout=300, HF_HUB_OFFLINE="1")
    assert proc.returncode == 2
    assert f"cannot be fetched ({reason}); download it where there is a network" in proc.stderr


def test_export_without_a_store_says_there_is_nothing_to_export(workdir: Path):
    proc = run_pgcli(["export", "0123abcd"], cwd=workdir, timeout=120)
    assert proc.returncode == 2
    assert "nothing to export" in proc.stderr and "evaluate" not in proc.stderr
    assert list(workdir.iterdir()) == []


def test_random_hf_help_describes_every_option():
    proc = subprocess.run(
        [sys.executable, "-m", "pgcli.lm.random_hf", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for option, words in {
        "--hidden": "width",
        "--layers": "blocks",
        "--heads": "attention heads",
        "--kv-heads": "key/value heads",
        "--intermediate": "MLP",
        "--seed": "seed of the random",
        "directory": "where to write",
    }.items():
        assert f"{option}" in text and words in text, option
