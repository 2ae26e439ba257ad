"""Real `pgcli train` runs on envs chosen by id: a user's own env package with wrappers, an `env.id` override that
drops its group's preset, and bad env input stopped before anything is created (docs/configuration.md, "Bring your
own env" and "Validation")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, Store, run_pgcli

MY_TARGET = "tests.example_envs.my_envs:MyTarget-v0"
FRAME_STACK = "env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, stack_size: 4}]"
TINY = ["total_steps=400", "eval.every=0", "eval.episodes=2", "progress=false"]


def with_example_envs(workdir: Path) -> Path:
    """``workdir`` with a copy of tests/example_envs, so the documented ``tests.example_envs...`` id imports there."""
    shutil.copytree(REPO / "tests" / "example_envs", workdir / "tests" / "example_envs")
    return workdir


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pgcli: env.id=")]


def test_env_id_override_trains_that_env_without_the_groups_preset_and_is_labelled_by_it(store: Store, workdir: Path):
    proc = run_pgcli(["train", "env.id=Acrobot-v1", "algo.n_steps=32", *TINY, f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert notices(proc.stderr) == [
        "pgcli: env.id=Acrobot-v1 replaces env=cartpole's CartPole-v1, so preset ppo_cartpole (tuned for CartPole-v1)"
        " is not applied; env=acrobot has this env's own settings"
    ]
    (run,) = store.runs("acrobot")
    assert store.client().get_experiment_by_name("cartpole") is None
    assert run.info.status == "FINISHED" and run.info.run_name == "ppo-acrobot-s0"
    tags, params = run.data.tags, run.data.params
    assert (tags["env"], tags["env_id"], tags["preset"], params["preset"]) == ("acrobot", "Acrobot-v1", "none", "none")
    # plain PPO defaults, none of ppo_cartpole's values (linear schedules, gae_lambda 0.8, 20 epochs, batch 256)
    assert params["algo.lr_schedule"] == "constant" and params["algo.gae_lambda"] == "0.95"
    assert params["algo.n_epochs"] == "10" and params["algo.batch_size"] == "64"
    assert [d.name[-len("_ppo_acrobot_s0") :] for d in (workdir / "outputs" / "runs").glob("*/*")] == [
        "_ppo_acrobot_s0"
    ]


def test_a_sweep_on_an_env_id_is_one_tree_in_that_envs_experiment(store: Store, workdir: Path):
    args = ["train", "-m", "env.id=Acrobot-v1", "seed=0,1", "algo.n_steps=16", *TINY, f"tracking.uri={store.uri}"]
    proc = run_pgcli(args, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(notices(proc.stderr)) == 1  # once for the sweep, not per job
    runs = store.runs("acrobot")
    parent = next(r for r in runs if r.data.tags.get("pgcli_role") == "sweep")
    children = [r for r in runs if r is not parent]
    assert parent.data.tags["env"] == "acrobot" and len(children) == 2
    assert {(c.info.run_name, c.data.tags["preset"]) for c in children} == {
        ("ppo-acrobot-s0", "none"),
        ("ppo-acrobot-s1", "none"),
    }
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)


def test_the_preset_a_run_was_trained_with_is_recorded(store: Store, workdir: Path):
    proc = run_pgcli(["train", "algo=a2c", *TINY, f"tracking.uri={store.uri}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert notices(proc.stderr) == []
    (run,) = store.runs("cartpole")
    assert run.data.tags["preset"] == run.data.params["preset"] == "a2c_cartpole"
    assert run.data.params["algo.ent_coef"] == "0.0" and run.data.params["algo.n_steps"] == "5"  # a2c_cartpole.yaml


@pytest.mark.parametrize("algo_args", [["algo=ppo"], ["algo=trpo", "+env.kwargs.continuous=true"]], ids=lambda a: a[0])
def test_module_env_with_a_wrapper_list_trains_and_is_labelled_by_its_id(
    algo_args: list[str], store: Store, workdir: Path
):
    algo = algo_args[0].removeprefix("algo=")
    args = ["train", *algo_args, f"env.id={MY_TARGET}", FRAME_STACK, "algo.n_steps=32", *TINY, "seed=3"]
    proc = run_pgcli([*args, f"tracking.uri={store.uri}"], cwd=with_example_envs(workdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(notices(proc.stderr)) == 1 and f"preset {algo}_cartpole" in notices(proc.stderr)[0]
    (run,) = store.runs("MyTarget-v0")
    assert run.info.status == "FINISHED" and run.info.run_name == f"{algo}-MyTarget-v0-s3"
    assert (run.data.tags["env"], run.data.tags["env_id"]) == ("MyTarget-v0", MY_TARGET)
    assert "FrameStackObservation" in run.data.params["env.wrappers"]
    assert "eval/return_mean" in run.data.metrics and run.data.metrics["rollout/ep_len_mean"] <= 50
    assert f"{algo} on MyTarget-v0 (seed 3)" in proc.stdout


BAD_ENV_INPUT = [
    (["env.wrappers=[{_target_: gymnasium.wrappers.FrameStackObservation, stack: 4}]"],
     "env.wrappers[0] gymnasium.wrappers.FrameStackObservation: "),
    (["env.wrappers=[{_target_: gymnasium.wrappers.NoSuchWrapper}]"], "env.wrappers[0] gymnasium.wrappers.NoSuch"),
    (["env.id=my_missing_pkg.envs:MyTarget-v0"], "cannot import module 'my_missing_pkg.envs'"),
    (["algo=trpo", "env.id=tests.example_envs.odd_spaces:MultiBinaryAction-v0"],
     "MultiBinary(3) action space, which algo=trpo cannot take; algo=ppo, a2c, sb3_trpo can"),
    (["-m", "env.id=CartPole-v1,Acrobot-v1"], "would apply to only some"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "fragment"), BAD_ENV_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_env_input_is_one_line_exit_2_and_nothing_is_created(
    args: list[str], fragment: str, store: Store, workdir: Path
):
    proc = run_pgcli(["train", *args, f"tracking.uri={store.uri}"], cwd=with_example_envs(workdir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pgcli: error: "), proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""
    assert not store.root.exists() and not (workdir / "outputs").exists()
