"""The algorithm catalogue (pgcli.config.algos): one row per ``conf/algo`` option, trainers that import, and an
algorithm added by the steps of docs/architecture.md ("Adding an algorithm") trains."""

from __future__ import annotations

import csv
import inspect
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcli.config import ALGOS, AlgoEntry, register_algo
from pgcli.config.algos import KINDS, algo_entry, algo_names
from pgcli.config.compose import CONF_DIR
from pgcli.errors import ConfigError


def test_every_conf_algo_yaml_has_exactly_one_row_and_every_row_one_yaml():
    options = sorted(p.stem for p in (Path(CONF_DIR) / "algo").glob("*.yaml"))
    assert sorted(ALGOS) == options
    assert len({entry.schema for entry in ALGOS.values()}) == len(ALGOS)  # one schema, one row
    for name, entry in ALGOS.items():
        assert entry.name == name
        head = (Path(CONF_DIR) / "algo" / f"{name}.yaml").read_text()
        assert f"/schema/algo/{name}@_here_" in head, f"conf/algo/{name}.yaml does not extend its schema"


@pytest.mark.parametrize("name", list(ALGOS))
def test_every_trainer_string_imports_a_class(name: str):
    entry = ALGOS[name]
    assert entry.trainers and set(entry.trainers) <= set(KINDS)
    for kind in entry.trainers:
        trainer = entry.trainer(kind)
        assert inspect.isclass(trainer), f"{name}: {entry.trainers[kind]} is not a class"
        assert callable(getattr(trainer, "learn", None)) and callable(getattr(trainer, "save", None))


def test_every_sb3_row_has_its_builder_in_the_adapter():
    from pgcli.algo.sb3 import SB3_ALGOS

    sb3 = {e.schema for e in ALGOS.values() if "pgcli.algo.sb3:SB3Trainer" in e.trainers.values()}
    assert sb3 == set(SB3_ALGOS)


def test_one_activation_table():
    from pgcli.algo.networks import ACTIVATIONS
    from pgcli.config.rules import ACTIVATIONS as NAMES

    assert tuple(ACTIVATIONS) == NAMES


def test_the_kinds_each_algo_trains_on():
    assert algo_names("control") == algo_names("image") == ["ppo", "a2c", "sb3_trpo", "trpo", "vpg", "ppo_kl", "grpo"]
    assert algo_names("multi-turn") == ["grpo", "sft", "flow_grpo"]
    assert "flow_grpo" not in algo_names("text") and "rm" in algo_names("text")
    assert ALGOS["grpo"].trainers["text"] != ALGOS["grpo"].trainers["control"]  # one schema, a trainer per kind


def test_a_bad_row_is_refused_when_it_is_written():
    from pgcli.config import PPOConfig

    with pytest.raises(ValueError, match="unknown kinds"):
        AlgoEntry(PPOConfig, {"video": "m:C"})
    with pytest.raises(ValueError, match="names the observation and action spaces"):
        AlgoEntry(PPOConfig, {"control": "m:C"})  # a gymnasium trainer must say which spaces it takes
    with pytest.raises(ValueError, match="unknown spaces"):
        AlgoEntry(PPOConfig, {"control": "m:C"}, observation_spaces=("Graph",), action_spaces=("Box",))
    with pytest.raises(ValueError, match="already in the catalogue"):
        register_algo(AlgoEntry(PPOConfig, {"text": "m:C"}))
    with pytest.raises(KeyError):
        algo_entry(object())


# --------------------------------------------------------------------------------------------------------------------
# a throwaway algorithm, added by the steps of docs/architecture.md, "Adding an algorithm"
# --------------------------------------------------------------------------------------------------------------------

SCHEMA = '''
from dataclasses import dataclass
from typing import ClassVar

from pgcli.config.rules import require


@dataclass
class CoinConfig:
    """Uniformly random actions; one update per rollout that changes nothing."""

    name: ClassVar[str] = "coin"

    n_steps: int = 16
    """Environment steps per env per rollout."""
    gamma: float = 0.99
    """Discount factor (the reward normalisation's)."""

    def __post_init__(self) -> None:
        require(self.n_steps >= 1, "algo.n_steps", self.n_steps, ">= 1")

    def check_rollout(self, n_envs: int) -> None:
        """No rule involves env.n_envs."""
'''

TRAINER = '''
from pathlib import Path

import numpy as np


class Coin:
    """The trainer contract (pgcli.contracts.Trainer) at its smallest: random actions, one metric per update."""

    def __init__(self, cfg, *, env, model, seed, device):
        self.cfg, self.env, self.steps = cfg, env, 0
        self.rng = np.random.default_rng(seed)

    def learn(self, total_steps, monitor):
        obs, _ = self.env.reset()
        while self.steps < total_steps:
            for _ in range(self.cfg.n_steps):
                obs, _, _, _, info = self.env.step(self.act(obs, deterministic=False))
                self.steps += self.env.num_envs
                monitor.episodes(self.steps, info)
            monitor.log(self.steps, {"train/coin_updates": self.steps / (self.cfg.n_steps * self.env.num_envs)})
            monitor.update(self.steps, self)
        return self.steps

    def act(self, obs, deterministic=True):
        return self.rng.integers(0, self.env.single_action_space.n, size=len(obs))

    def save(self, path):
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "coin.txt").write_text(str(self.steps))
        return path

    def load(self, path):
        self.steps = int((Path(path) / "coin.txt").read_text())

    def close(self):
        pass
'''

YAML = """\
# Coin: random actions (a throwaway algorithm of tests/unit/test_algo_catalogue.py).
defaults:
  - /schema/algo/coin@_here_
  - _self_
n_steps: 16
gamma: 0.99
"""


@pytest.fixture
def coin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The throwaway algorithm ``coin``: its trainer module, its schema, its YAML in (a copy of) ``conf/algo`` and its
    catalogue row; all gone afterwards."""
    import pgcli.config.compose as compose

    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "coin_config.py").write_text(textwrap.dedent(SCHEMA))  # step 2: the schema (pgcli/config/ in-tree)
    (modules / "coin_trainer.py").write_text(textwrap.dedent(TRAINER))  # step 1: the trainer (pgcli/algo/ in-tree)
    monkeypatch.syspath_prepend(str(modules))
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "algo" / "coin.yaml").write_text(YAML)  # step 3: conf/algo/coin.yaml
    monkeypatch.setattr(compose, "CONF_DIR", str(conf))
    from coin_config import CoinConfig  # type: ignore[import-not-found]

    gym = ("control", "image")
    row = AlgoEntry(
        CoinConfig, dict.fromkeys(gym, "coin_trainer:Coin"), observation_spaces=("Box",), action_spaces=("Discrete",)
    )
    register_algo(row)  # step 4: the row (in-tree: one more AlgoEntry in ALGOS)
    try:
        yield
    finally:
        del ALGOS["coin"]


def test_an_algorithm_added_by_the_documented_steps_trains(coin: None, tmp_path: Path):
    from pgcli.training import run_job
    from pgcli.training.checks import train_config

    out = tmp_path / "run"
    overrides = [
        "algo=coin",
        "env=cartpole",
        "~preset",
        "env.n_envs=2",
        "total_steps=96",
        "eval.every=0",
        "eval.episodes=1",
        "checkpoint_every=0",
        "progress=false",
    ]
    summary = run_job(overrides, output_dir=out, tracking=False)
    assert summary.steps == 96  # 3 rollouts of 16 steps x 2 envs
    with (out / "metrics.csv").open() as f:
        logged = [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["key"] == "train/coin_updates"]
    assert logged == [(32, 1.0), (64, 2.0), (96, 3.0)]  # the trainer's metric, at each update's env step
    assert (out / "model" / "coin.txt").read_text() == "96"
    with pytest.raises(
        ConfigError,
        match=r"^env.id 'Pendulum-v1' has a Box\(1\) float32 action space, which "
        r"algo=coin cannot take; algo=ppo, a2c, sb3_trpo, trpo, vpg, ppo_kl, grpo can",
    ):
        train_config(["algo=coin", "env=pendulum", "~preset"])  # the row's spaces are checked
    with pytest.raises(ConfigError, match=r"^algo=coin does not train on text tasks"):
        train_config(["algo=coin", "env=addition", "model=tiny_gpt"])
