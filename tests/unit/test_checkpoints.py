"""pgcli.algo.checkpoint and the monitor's checkpoint cadence: atomic writes, keeping the last K, one-line errors on
damaged files, no unpickling of arbitrary objects, and loading into an env of another size (evaluation)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pgcli.algo.checkpoint import atomic_dir, rng_state, set_rng_state
from pgcli.algo.sb3 import SB3Trainer
from pgcli.algo.trpo import TRPO
from pgcli.config import EnvConfig, ModelConfig, PPOConfig, TRPOConfig
from pgcli.envs.make import make_vec_env
from pgcli.envs.normalize import find_normalizer
from pgcli.errors import PgcliError
from pgcli.tracking.logger import RunLogger
from pgcli.training.checkpoints import (
    best_candidate_dir,
    checkpoint_candidates,
    checkpoint_step,
    complete_checkpoint,
    latest_checkpoint,
    prune_checkpoints,
    staging_dir,
)
from pgcli.training.monitor import Outputs, Schedule, TrainingMonitor

CPU = torch.device("cpu")
MODEL = ModelConfig(pi_hidden_sizes=[8], vf_hidden_sizes=[8])


def trpo(n_envs: int = 2) -> TRPO:
    env = make_vec_env(EnvConfig(id="Pendulum-v1", n_envs=n_envs, normalize_obs=True), seed=0)
    return TRPO(TRPOConfig(n_steps=32, n_critic_updates=1, batch_size=32), env=env, model=MODEL, seed=0, device=CPU)


def monitor(tmp_path: Path, checkpoint_every: int = 0, checkpoint_keep: int = 0) -> TrainingMonitor:
    return TrainingMonitor(
        RunLogger(tmp_path),
        Schedule(10**5, checkpoint_every=checkpoint_every),
        progress=False,
        outputs=Outputs(checkpoints=tmp_path / "checkpoints", keep=checkpoint_keep),
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TRPO checkpoint after one update on Pendulum."""
    trainer = trpo()
    trainer.learn(1, monitor(tmp_path_factory.mktemp("run")))
    return trainer.save(tmp_path_factory.mktemp("ckpt") / "step_64")


def copy_of(saved: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


# -- writing ---------------------------------------------------------------------------------------------------------
def test_a_checkpoint_holds_model_normalizer_and_plain_state(saved: Path):
    assert sorted(p.name for p in saved.iterdir()) == ["model.pt", "normalizer.npz", "state.json"]
    state = json.loads((saved / "state.json").read_text())
    assert state["trainer"] == {"steps": 64}
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert state["env"]["n_envs"] == 2 and len(state["env"]["sub_envs"]) == 2
    assert state["env"]["sub_envs"][0]["sim"]["state"]["dtype"]  # Pendulum's (theta, theta_dot), exact dtype


def test_atomic_dir_never_leaves_a_partial_checkpoint_under_its_name(tmp_path: Path):
    target = tmp_path / "step_100"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "model.pt").write_bytes(b"half a model")
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temporary directory

    with atomic_dir(target) as tmp:
        (tmp / "model.pt").write_bytes(b"v1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "model.pt").write_bytes(b"v2, half")
        raise RuntimeError("crash while replacing")
    assert [p.name for p in tmp_path.iterdir()] == ["step_100"] and (target / "model.pt").read_bytes() == b"v1"

    with atomic_dir(target) as tmp:  # replacing a complete checkpoint swaps it whole
        (tmp / "other").write_bytes(b"v3")
    assert sorted(p.name for p in target.iterdir()) == ["other"]
    assert [p.name for p in tmp_path.iterdir()] == ["step_100"]


def test_prune_keeps_the_newest_by_step_not_by_name_and_removes_crash_leftovers(tmp_path: Path):
    for step in (900, 1000, 10000, 200):
        (tmp_path / f"step_{step}").mkdir()
    (tmp_path / ".step_20000.tmp-0123abcd").mkdir()  # a write interrupted by SIGKILL
    (tmp_path / "notes").mkdir()
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step_1000", "step_10000"]


def test_the_layout_is_named_in_one_place(tmp_path: Path):
    """docs/checkpoints.md's names: step_<n>, its hidden staging sibling, the best agent's candidate."""
    checkpoints = tmp_path / "checkpoints"
    assert staging_dir(checkpoints, 64) == checkpoints / ".step_64.staged"
    assert best_candidate_dir(tmp_path / "best_model", 64) == tmp_path / ".best_model.step_64"
    assert [checkpoint_step(Path(n)) for n in ("step_64", ".step_64.staged", "step_", "model")] == [
        64,
        None,
        None,
        None,
    ]
    staged = staging_dir(checkpoints, 64)
    staged.mkdir(parents=True)
    (staged / "model.pt").write_bytes(b"x")
    final = complete_checkpoint(checkpoints, 64, staged, {"step": 64})
    assert final == checkpoints / "step_64" and not staged.exists()
    assert json.loads((final / "monitor.json").read_text()) == {"step": 64}  # written before the rename
    assert latest_checkpoint(checkpoints) == (64, final)
    assert [(step, path.name) for step, path, _ in checkpoint_candidates(tmp_path)] == [(64, "step_64")]


def test_monitor_keeps_the_last_k_checkpoints_and_not_best_or_final(tmp_path: Path):
    trainer = trpo()
    (tmp_path / "best_model").mkdir()
    mon = monitor(tmp_path, checkpoint_every=64, checkpoint_keep=2)
    trainer.learn(5 * 64, mon)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_256", "step_320"]
    assert mon.last_checkpoint == tmp_path / "checkpoints" / "step_320"
    assert (tmp_path / "best_model").is_dir()

    everything = monitor(tmp_path / "all", checkpoint_every=64, checkpoint_keep=0)
    trpo().learn(3 * 64, everything)
    assert len(list((tmp_path / "all" / "checkpoints").iterdir())) == 3


# -- reading damaged files -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("model.pt", "truncate"),
        ("model.pt", "garbage"),
        ("state.json", "truncate"),
        ("normalizer.npz", "garbage"),
        ("state.json", "delete"),
    ],
)
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(saved: Path, tmp_path: Path, file: str, damage: str):
    ckpt = copy_of(saved, tmp_path)
    path = ckpt / file
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a checkpoint\xff" * 10)
    else:
        path.unlink()
    with pytest.raises(PgcliError) as caught:
        trpo().load(ckpt)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    assert ("missing" if damage == "delete" else "truncated or corrupt") in message


def test_a_checkpoint_of_another_model_size_is_a_one_line_error(saved: Path):
    env = make_vec_env(EnvConfig(id="Pendulum-v1", n_envs=2, normalize_obs=True), seed=0)
    bigger = TRPO(TRPOConfig(n_steps=32), env=env, model=ModelConfig(pi_hidden_sizes=[16]), seed=0, device=CPU)
    with pytest.raises(PgcliError, match=r"model\.pt does not fit this trainer \(policy: "):
        bigger.load(saved)


class Payload:
    """Any class: unpickling it would run code chosen by whoever wrote the file."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_loading_never_unpickles_arbitrary_objects(saved: Path, tmp_path: Path, capsys):
    ckpt = copy_of(saved, tmp_path)
    payload = torch.load(ckpt / "model.pt", weights_only=True)
    payload["policy"] = Payload()
    torch.save(payload, ckpt / "model.pt")
    with pytest.raises(PgcliError, match="truncated or corrupt"):
        trpo().load(ckpt)
    assert "unpickled!" not in capsys.readouterr().out

    ckpt = copy_of(saved, tmp_path / "npz")
    np.savez(ckpt / "normalizer.npz", **{"obs_rms.mean": np.array([Payload()], dtype=object)})  # pickled inside
    with pytest.raises(PgcliError, match=r"normalizer\.npz: truncated or corrupt"):
        trpo().load(ckpt)
    assert "unpickled!" not in capsys.readouterr().out


def test_sb3_checkpoint_damaged_zip_is_a_one_line_error(tmp_path: Path):
    env = make_vec_env(EnvConfig(id="CartPole-v1", n_envs=1), seed=0)
    trainer = SB3Trainer(PPOConfig(n_steps=32, batch_size=32), env=env, model=MODEL, seed=0, device=CPU)
    ckpt = trainer.save(tmp_path / "ckpt")
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.zip", "state.json"]
    (ckpt / "model.zip").write_bytes((ckpt / "model.zip").read_bytes()[:100])
    with pytest.raises(PgcliError, match=r"model\.zip: truncated or corrupt"):
        trainer.load(ckpt)


# -- what load restores ----------------------------------------------------------------------------------------------
def test_loading_into_an_env_of_another_size_keeps_its_episodes_and_freezes_the_statistics(saved: Path):
    evaluation = trpo(n_envs=1)  # e.g. an evaluation env: one sub-env
    before = evaluation.collector.last_obs.copy()
    evaluation.load(saved)
    assert evaluation.steps == 64
    assert not find_normalizer(evaluation.env).training  # statistics loaded, frozen
    np.testing.assert_array_equal(evaluation.collector.last_obs, before)  # its own episodes, untouched


def test_rng_state_round_trips_through_json():
    state = json.loads(json.dumps(rng_state()))
    expected = (np.random.rand(3), torch.rand(3), random.random())
    np.random.rand(5), torch.rand(5)
    set_rng_state(state)
    got = (np.random.rand(3), torch.rand(3), random.random())
    np.testing.assert_array_equal(got[0], expected[0])
    assert torch.equal(got[1], expected[1]) and got[2] == expected[2]


# -- checked before a resume (docs/runs.md, "Resume") ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("file", "damage"),
    [
        ("model.pt", "truncate"),
        ("model.pt", "flip"),
        ("normalizer.npz", "truncate"),
        ("state.json", "truncate"),
        ("state.json", "delete"),
        ("model.pt", "delete"),
    ],
)
def test_verify_checkpoint_names_a_damaged_file_without_loading_it(saved: Path, tmp_path: Path, file: str, damage: str):
    from pgcli.algo.checkpoint import verify_checkpoint

    ckpt = copy_of(saved, tmp_path)
    assert verify_checkpoint(ckpt) == 64  # the trainer's steps, from state.json
    path = ckpt / file
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # one byte of the largest tensor's data: the zip archive is whole, its CRC is not
        import zipfile

        with zipfile.ZipFile(path) as archive:
            member = max(archive.infolist(), key=lambda m: m.file_size)
        at = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra) + member.file_size // 2
        path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :])
    else:
        path.unlink()
    with pytest.raises(PgcliError) as caught:
        verify_checkpoint(ckpt)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message, message
    assert ("missing" if damage == "delete" else "truncated or corrupt") in message


def good_state(step: int = 64) -> dict:
    return {
        "step": step,
        "next_eval": 128,
        "next_checkpoint": None,
        "n_episodes": 3,
        "recent_returns": [1.0, -2.5, 3],
        "recent_lengths": [10, 20, 30],
        "last_eval_step": 64,
        "last_logged_step": 64,
        "best_step": 64,
        "best_returns": [1.0, 2.0],
        "best_lengths": [5, 6],
    }


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"n_episodes": None}, "has 'n_episodes': 'None', which is not an integer"),
        ({"recent_returns": ["x"]}, "has 'recent_returns': \"['x']\", which is not a list of numbers"),
        ({"step": 128}, "is for step 128, not 64"),
        ({"step": True}, "has 'step': 'True', which is not an integer"),
        ({"best_lengths": None}, "has only one of 'best_returns' and 'best_lengths'"),
    ],
)
def test_monitor_state_is_validated_in_one_line_naming_the_file(tmp_path: Path, change: dict, words: str):
    from pgcli.training.monitor_state import read_monitor_state, write_monitor_state

    write_monitor_state(tmp_path, good_state())
    assert read_monitor_state(tmp_path, 64) == good_state()
    write_monitor_state(tmp_path, good_state() | change)
    with pytest.raises(PgcliError) as caught:
        read_monitor_state(tmp_path, 64)
    assert str(caught.value) == f"checkpoint file {tmp_path / 'monitor.json'} {words}"


def test_monitor_state_missing_key_or_not_json_and_no_file(tmp_path: Path):
    from pgcli.training.monitor_state import read_monitor_state

    assert read_monitor_state(tmp_path, 64) is None  # none: the checkpoint was not completed (or is an older one)
    state = good_state()
    del state["recent_lengths"]
    (tmp_path / "monitor.json").write_text(json.dumps(state))
    with pytest.raises(PgcliError, match=r"monitor\.json lacks 'recent_lengths'$"):
        read_monitor_state(tmp_path, 64)
    (tmp_path / "monitor.json").write_text('{"step": 6')
    with pytest.raises(PgcliError, match=r"monitor\.json is not valid JSON \("):
        read_monitor_state(tmp_path, 64)


def test_monitor_state_of_an_older_checkpoint_reads_without_the_keys_added_later(tmp_path: Path):
    from pgcli.training.monitor_state import LATER_FIELDS, read_monitor_state

    state = {k: v for k, v in good_state().items() if k not in LATER_FIELDS}
    (tmp_path / "monitor.json").write_text(json.dumps(state))
    assert read_monitor_state(tmp_path, 64) == state
    (tmp_path / "monitor.json").write_text(json.dumps(state | {"last_logged_step": "x"}))
    with pytest.raises(PgcliError, match="has 'last_logged_step': 'x', which is not an integer or null"):
        read_monitor_state(tmp_path, 64)
