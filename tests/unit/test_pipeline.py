"""``pgcli train`` and :func:`pgcli.training.job.run_job` prepare a job with the same passes
(:mod:`pgcli.training.pipeline`): the same overrides added, the same notes, the same errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pgcli.agent import write_text_agent_files
from pgcli.commands.train import checked_args
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.lm.load import make_text_policy
from pgcli.lm.model import save_policy
from pgcli.lm.tasks import make_task
from pgcli.training import job as job_module
from pgcli.training.pipeline import CHECKS, REWRITES, Preflight, prepare_job


@pytest.fixture
def sft_run(tmp_path: Path) -> Path:
    """A run directory as `pgcli sft` leaves it (4-digit addition on d_model=32, d_ff=64)."""
    cfg = compose_train_config(["algo=sft", "env=addition", "model.d_model=32", "model.d_ff=64"])
    run_dir = tmp_path / "sft"
    save_policy(make_text_policy(make_task(cfg.env), cfg.model, torch.device("cpu")), run_dir / "model")
    write_text_agent_files(run_dir / "model", cfg, algo_name="sft", env_name="addition")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "a" * 32}))
    return run_dir


def both_ways(typed: list[str], tmp_path: Path, monkeypatch, capsys) -> tuple[tuple[list[str], str], ...]:
    """(the overrides a job gets, its stderr) from ``pgcli train``'s checks and from ``run_job`` (not trained)."""
    monkeypatch.chdir(tmp_path)
    cli = checked_args(typed)
    cli_err = capsys.readouterr().err
    trained = []
    monkeypatch.setattr(job_module, "train", lambda cfg, ctx: trained.append(ctx))
    job_module.run_job(typed, output_dir=tmp_path / "job")
    (ctx,) = trained
    return (cli, cli_err), (ctx.overrides, capsys.readouterr().err)


def test_an_init_run_carries_over_the_same_settings_both_ways(sft_run, tmp_path, monkeypatch, capsys):
    typed = ["algo=grpo", "env=addition", f"init={sft_run}", "env.n_digits=3", "tracking=off"]
    (cli, cli_err), (job, job_err) = both_ways(typed, tmp_path, monkeypatch, capsys)
    assert cli == job == [*typed, "model.d_model=32", "model.d_ff=64", "model=tiny_gpt"]
    note = f"pgcli: note: init={sft_run} sets model.d_model=32 model.d_ff=64 (the init run's model and task settings"
    assert job_err.startswith(note) and cli_err.startswith(note)
    assert cli_err.splitlines()[1:] == [
        "pgcli: note: preset grpo_addition applied (conf/preset/grpo_addition.yaml; ~preset trains without it)"
    ]
    assert job_err.count("\n") == 1  # a script's run records its preset; pgcli train says it


def test_a_stale_preset_is_dropped_the_same_both_ways(tmp_path, monkeypatch, capsys):
    typed = ["algo=ppo", "env=cartpole", "env.id=Acrobot-v1", "tracking=off"]
    (cli, cli_err), (job, job_err) = both_ways(typed, tmp_path, monkeypatch, capsys)
    assert cli == job == [*typed, "~preset"]
    notice = "pgcli: env.id=Acrobot-v1 replaces env=cartpole's CartPole-v1, so preset ppo_cartpole (tuned for "
    assert cli_err == job_err == notice + "CartPole-v1) is not applied; env=acrobot has this env's own settings\n"


def test_an_old_key_is_renamed_in_place_the_same_both_ways(tmp_path, monkeypatch, capsys):
    from pgcli.config import renames

    typed = ["algo=trpo", "env=cartpole", "algo.cg_iters=5", "tracking=off"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(renames, "_NOTED", set())
    cli = checked_args(["-m", *typed])
    cli_err = capsys.readouterr().err
    monkeypatch.setattr(renames, "_NOTED", set())
    trained = []
    monkeypatch.setattr(job_module, "train", lambda cfg, ctx: trained.append(cfg))
    job_module.run_job(typed, output_dir=tmp_path / "job")
    renamed = ["algo=trpo", "env=cartpole", "algo.cg_max_steps=5", "tracking=off"]
    assert cli == ["-m", *renamed] and trained[0].algo.cg_max_steps == 5
    note = "pgcli: note: algo.cg_iters is now algo.cg_max_steps (SB3's vocabulary); the old name still works"
    assert cli_err.splitlines()[0] == note and capsys.readouterr().err.splitlines() == [note]


def test_a_bad_value_stops_both_ways_with_the_same_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for prepare in (checked_args, lambda typed: job_module.run_job(typed, output_dir=tmp_path / "job")):
        with pytest.raises(ConfigError, match=r"^env.n_envs must be >= 1 \(got 0\)$"):
            prepare(["env.n_envs=0", "tracking=off"])


def test_the_passes_run_in_order_and_only_the_rewrites_for_hydras_pages(monkeypatch):
    assert [p.__name__ for p in (*REWRITES, *CHECKS)] == [
        "carry_init",
        "carry_export",
        "imply_groups",
        "rename_old_keys",
        "drop_stale_preset",
        "check_jobs",
        "check_sweep",
        "check_store",
        "check_init_source",
        "pin",
        "announce",
    ]
    job = prepare_job(["env=addition", "env.n_envs=0"], mode=Preflight(checks=False))  # --info: Hydra judges it
    assert job.overrides == ["env=addition", "env.n_envs=0", "model=tiny_gpt", "algo=grpo"] and job.cfg is None


def as_rank_0(monkeypatch, launcher: str | None, rank: int = 0) -> None:
    """This process as rank 0 (or ``rank``) of 2 of torch.distributed's launcher; ``launcher``: the pid pgcli's own
    launcher set in ``PGCLI_LAUNCHED`` (None: ``torchrun``, which sets none)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    if launcher is None:
        monkeypatch.delenv("PGCLI_LAUNCHED", raising=False)
    else:
        monkeypatch.setenv("PGCLI_LAUNCHED", launcher)


@pytest.mark.parametrize(
    ("launcher", "checks"),
    [(str(os.getppid()), False), (None, True), ("1" if os.getppid() != 1 else "2", True)],
    ids=["launched-by-pgcli", "torchrun", "inherited-PGCLI_LAUNCHED"],
)
def test_a_worker_of_pgclis_launcher_leaves_the_checks_to_it_and_a_torchrun_rank_checks(
    launcher, checks, sft_run, tmp_path, monkeypatch, capsys
):
    from pgcli.training import checks as checks_module
    from pgcli.training import preflight

    monkeypatch.chdir(tmp_path)
    typed = ["algo=grpo", "env=addition", f"init={sft_run}", "hardware.processes=2", "tracking=off"]
    one_process = checked_args(typed)  # the launcher's passes: what the run trains with
    capsys.readouterr()
    ran = []
    for module, name in ((checks_module, "train_config"), (preflight, "check_train_environment")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **kw: ran.append(name) or real(*a, **kw))
    as_rank_0(monkeypatch, launcher)
    assert checked_args(typed) == one_process  # init's settings carried over, groups implied, references pinned
    err = capsys.readouterr().err
    if checks:  # torchrun: nothing checked this command line before its ranks started; rank 0 says the notes
        assert ran == ["train_config", "check_train_environment"]
        assert "pgcli: note: preset grpo_addition applied" in err
        assert f"pgcli: note: init={sft_run} sets model.d_model=32" in err
    else:  # the launcher said them all, the init carry-over too
        assert ran == [] and err == ""


@pytest.mark.parametrize("launcher", [str(os.getppid()), None], ids=["launched-by-pgcli", "torchrun"])
def test_a_rank_other_than_0_completes_the_overrides_and_says_nothing(launcher, sft_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    typed = ["algo=grpo", "env=addition", f"init={sft_run}", "hardware.processes=2", "tracking=off"]
    one_process = checked_args(typed)
    assert f"init={sft_run} sets" in capsys.readouterr().err
    as_rank_0(monkeypatch, launcher, rank=1)
    assert checked_args(typed) == one_process
    assert capsys.readouterr().err == ""  # rank 0 says the notes once for the run
