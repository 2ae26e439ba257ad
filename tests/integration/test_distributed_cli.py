"""One text run on two processes through the real CLI (docs/distributed.md): `hardware.processes=2` and `torchrun`
each land exactly one FINISHED MLflow run, written by rank 0 alone, with the number of processes and each rank's seed
as params and one metric point per global update; a rank killed with SIGKILL ends the run in bounded time, FAILED or
KILLED; a batch that does not divide is one line, exit 2. Tiny TinyGPT, gloo on the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Store, cli_env, run_pgcli, start_pgcli, wait_until
from tests.integration.conftest import LM_SMALL

SFT = ["sft", "env=addition", "algo.batch_size=16", "algo.warmup_steps=0", *LM_SMALL]
GRPO = ["train", "algo=grpo", "env=addition", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8", *LM_SMALL]


def one_run(store: Store, experiment: str = "addition"):
    runs = store.runs(experiment)
    assert len(runs) == 1, [r.info.run_id for r in runs]  # rank 0 alone opened a run
    return runs[0]


def assert_two_process_run(store: Store, workdir: Path, metric: str, steps: list[int]) -> None:
    run = one_run(store)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["hardware.processes"] == "2"
    seeds = params["rank_seeds"].split(",")
    assert seeds[0] == params["seed"] == "0" and len(set(seeds)) == 2
    history = store.client().get_metric_history(run.info.run_id, metric)
    assert [m.step for m in history] == steps  # one point per global update, from rank 0 only
    assert len(list((workdir / "outputs" / "runs").glob("*/*"))) == 1  # one run directory


def test_sft_on_two_processes_lands_one_finished_run(migrated_store: Store, workdir: Path):
    args = [*SFT, f"tracking.uri={migrated_store.uri}", "total_steps=64", "eval.every=64", "hardware.processes=2"]
    proc = run_pgcli(args, cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, "train/loss", [16, 32, 48, 64])  # 16 demonstrations a step
    assert proc.stdout.count("MLflow run") == 1  # one summary: rank 0's


def test_grpo_on_two_processes_lands_one_finished_run(migrated_store: Store, workdir: Path):
    args = [*GRPO, f"tracking.uri={migrated_store.uri}", "total_steps=32", "eval.every=32", "hardware.processes=2"]
    proc = run_pgcli(args, cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, "rollout/reward_mean", [16, 32])  # 16 completions an update
    run = one_run(migrated_store)
    assert {"train/policy_loss", "train/grad_norm", "rollout/accuracy", "eval/accuracy"} <= set(run.data.metrics)


@pytest.mark.parametrize(
    ("args", "metric"),
    [
        (["rm", "env=addition", "algo.batch_size=16", *LM_SMALL], "train/pairwise_accuracy"),
        (["train", "algo=ppo_lm", *GRPO[2:]], "train/value_loss"),
    ],
    ids=["rm", "ppo_lm"],
)
def test_the_reward_model_and_ppo_train_on_two_processes(
    args: list[str], metric: str, migrated_store: Store, workdir: Path
):
    run_args = [*args, f"tracking.uri={migrated_store.uri}", "total_steps=32", "eval.every=32", "hardware.processes=2"]
    proc = run_pgcli(run_args, cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, metric, [16, 32])


def test_flow_grpo_on_a_multi_turn_task_trains_on_two_processes(migrated_store: Store, workdir: Path):
    args = [
        "train",
        "algo=flow_grpo",
        "env=countdown_tool",
        "algo.group_size=4",
        "algo.n_groups=4",
        "algo.batch_size=4",  # several minibatches of turns: as many on each process
        *(a for a in LM_SMALL if a != "env.n_digits=2"),
        f"tracking.uri={migrated_store.uri}",
        "total_steps=48",
        "eval.every=48",
        "hardware.processes=2",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = one_run(migrated_store, "countdown_tool")
    assert run.info.status == "FINISHED" and run.data.params["hardware.processes"] == "2"
    steps = [m.step for m in migrated_store.client().get_metric_history(run.info.run_id, "rollout/turns_mean")]
    # a step is a turn of either process: 16 trajectories an update, 1 to 4 turns each
    assert steps and steps[-1] >= 48 and all(16 <= b - a <= 64 for a, b in zip([0, *steps], steps, strict=False))
    assert {"train/policy_loss", "rollout/tool_error_rate", "eval/accuracy"} <= set(run.data.metrics)


def test_torchrun_launches_the_same_run(migrated_store: Store, workdir: Path):
    torchrun = Path(sys.executable).parent / "torchrun"
    args = [*SFT, f"tracking.uri={migrated_store.uri}", "total_steps=32", "eval.every=32"]
    cmd = [str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "pgcli", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=240, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, "train/loss", [16, 32])  # hardware.processes from WORLD_SIZE


def test_a_batch_that_does_not_divide_is_one_line(store: Store, workdir: Path):
    proc = run_pgcli([*SFT, f"tracking.uri={store.uri}", "algo.batch_size=9", "hardware.processes=2"], cwd=workdir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pgcli: error: algo.batch_size must be a multiple of hardware.processes=2 (got 9); each process trains 1/2 "
        "of it, e.g. algo.batch_size=8"
    ]
    assert not (workdir / "outputs").exists()


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of worker ``rank`` among the launcher's children (its RANK in its environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == launcher and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank's process through /proc")
def test_killing_rank_1_ends_the_run_in_bounded_time_not_running(migrated_store: Store, workdir: Path):
    args = [*SFT, f"tracking.uri={migrated_store.uri}", "total_steps=100000", "eval.every=0", "hardware.processes=2"]
    stderr = workdir / "stderr.txt"
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)
    try:
        wait_until(
            lambda: "pgcli: sft on addition" in stderr.read_text(), "training", timeout=180, proc=proc, stderr=stderr
        )
        victim = wait_until(lambda: rank_pid(proc.pid, 1), "rank 1", timeout=30, proc=proc, stderr=stderr)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=90)
        assert time.monotonic() - killed < 90
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0
    run = one_run(migrated_store)
    assert run.info.status in ("FAILED", "KILLED"), stderr.read_text()[-2000:]


def test_kill_9_of_the_whole_job_then_resume_continues_on_two_processes(migrated_store: Store, workdir: Path):
    run_dir, stderr = workdir / "run", workdir / "first.txt"
    args = [*SFT, f"tracking.uri={migrated_store.uri}", "total_steps=4096", "checkpoint_every=64", "eval.every=0"]
    args += ["hardware.processes=2", "tracking.flush_every_s=0.1", f"hydra.run.dir={run_dir}"]
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)
    try:
        found = lambda: list((run_dir / "checkpoints").glob("step_*/monitor.json"))  # noqa: E731
        wait_until(found, "a checkpoint", timeout=180, proc=proc, stderr=stderr, interval=0.05)
        ranks = [rank_pid(proc.pid, 0), rank_pid(proc.pid, 1)]
        for pid in [*ranks, proc.pid]:  # every process of the job at once: nothing can end the run
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = one_run(migrated_store)
    assert killed.info.status == "RUNNING"
    run_id = killed.info.run_id

    second = workdir / "second.txt"
    resume = ["train", f"resume={run_id}", f"tracking.uri={migrated_store.uri}"]
    proc = start_pgcli(resume, cwd=workdir, stderr=second)
    try:  # the run trained on 2 processes resumes on 2: the launcher starts a rank 1
        wait_until(lambda: rank_pid(proc.pid, 1), "rank 1 of the resume", timeout=120, proc=proc, stderr=second)
        assert proc.wait(timeout=300) == 0, second.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    run = one_run(migrated_store)  # the same run, re-opened
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    assert int(run.data.tags["resumed_from_step"]) % 64 == 0
    steps = [m.step for m in migrated_store.client().get_metric_history(run_id, "train/loss")]
    assert sorted(steps) == list(range(16, 4097, 16))  # every global step once: no duplicate, none missing


def test_ctrl_c_stops_both_processes_and_ends_the_run_killed_with_a_checkpoint(migrated_store: Store, workdir: Path):
    run_dir, stderr = workdir / "run", workdir / "stderr.txt"
    args = [*SFT, f"tracking.uri={migrated_store.uri}", "total_steps=100000", "checkpoint_every=100000"]
    args += ["eval.every=0", "hardware.processes=2", f"hydra.run.dir={run_dir}"]
    proc = start_pgcli(args, cwd=workdir, stderr=stderr)
    try:
        wait_until(
            lambda: "pgcli: sft on addition" in stderr.read_text(), "training", timeout=180, proc=proc, stderr=stderr
        )
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the command (the workers run in sessions of their own)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = stderr.read_text()
    assert code == 130, text[-3000:]
    assert "pgcli: error" not in text, text[-3000:]  # no rank failed
    run = one_run(migrated_store)
    assert run.info.status == "KILLED"
    assert list((run_dir / "checkpoints").glob("step_*/monitor.json"))  # a checkpoint to resume from
    assert "continue the run with: pgcli train resume=" in text


def test_sharded_sft_on_two_processes_lands_one_finished_run_that_one_process_evaluates(
    migrated_store: Store, workdir: Path, tiny_hf_model: Path
):
    """``hardware.shard=params`` (FSDP2 over 2 gloo ranks): one FINISHED run whose losses are the unsharded
    2-process run's; its model, gathered on rank 0, loads in one process (``pgcli eval`` repeats the final
    evaluation)."""
    base = ["sft", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "algo.batch_size=8"]
    base += ["algo.warmup_steps=0", "total_steps=16", "eval.every=0", "env.n_eval=8", "env.eval_samples=2"]
    base += [f"tracking.uri={migrated_store.uri}", "hardware.processes=2"]
    proc = run_pgcli([*base, "hardware.shard=params"], cwd=workdir, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, "train/loss", [8, 16])
    sharded = one_run(migrated_store)
    assert sharded.data.params["hardware.shard"] == "params"
    proc = run_pgcli(["eval", sharded.info.run_id, f"tracking.uri={migrated_store.uri}"], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (evaluation,) = [r for r in migrated_store.runs("addition") if r.data.tags.get("source_run_id")]
    for key in ("eval/accuracy", "eval/reward_mean", "eval/completion_len"):
        assert evaluation.data.metrics[key] == sharded.data.metrics[key], key
    proc = run_pgcli(base, cwd=workdir, timeout=400)  # the same run, each process holding the whole model
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whole,) = [r for r in migrated_store.runs("addition") if r.data.params.get("hardware.shard") == "none"]
    for key in ("train/loss", "train/grad_norm"):
        losses = [migrated_store.client().get_metric_history(r.info.run_id, key) for r in (sharded, whole)]
        assert [m.value for m in losses[0]] == pytest.approx([m.value for m in losses[1]], rel=1e-5), key


SHARDS = ("params", "none")


def stopped_and_resumed_losses(
    base: list[str], shard: str, stop: int, end: int, store: Store, workdir: Path
) -> list[tuple[int, float]]:
    """(step, train/loss) of the run ``base`` with ``hardware.shard=<shard>`` trained to ``stop`` steps, then
    resumed to ``end`` (the run named after ``shard``)."""
    proc = run_pgcli([*base, f"hardware.shard={shard}", f"total_steps={stop}", f"run_name={shard}"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in store.runs("addition") if r.info.run_name == shard]
    resume = ["train", f"resume={run.info.run_id}", f"total_steps={end}", f"tracking.uri={store.uri}"]
    proc = run_pgcli(resume, cwd=workdir, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = store.client().get_metric_history(run.info.run_id, "train/loss")
    return sorted((m.step, m.value) for m in history)


def test_a_sharded_run_resumes_as_the_unsharded_one_does(migrated_store: Store, workdir: Path, tiny_hf_model: Path):
    """A sharded run of 16 steps, resumed to 32 on 2 processes (rank 0's checkpoint loaded into every process's
    shards), logs the losses of the unsharded run stopped and resumed alike (the other ranks' generators restart from
    the same seeds in both)."""
    base = ["sft", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "algo.batch_size=8", "eval.every=0"]
    base += ["algo.warmup_steps=8", "checkpoint_every=16", "env.n_eval=8", f"tracking.uri={migrated_store.uri}"]
    base += ["hardware.processes=2"]
    losses = {shard: stopped_and_resumed_losses(base, shard, 16, 32, migrated_store, workdir) for shard in SHARDS}
    assert [s for s, _ in losses["params"]] == [8, 16, 24, 32]  # every global step once
    assert [v for _, v in losses["params"]] == pytest.approx([v for _, v in losses["none"]], rel=1e-5)


def test_sharded_grpo_on_two_processes_lands_one_finished_run_as_the_unsharded_one(
    migrated_store: Store, workdir: Path, tiny_hf_model: Path
):
    """``algo=grpo hardware.shard=params`` (FSDP2 over 2 gloo ranks, the KL reference a sharded copy of the starting
    policy): one FINISHED run whose rewards, losses and gradient norms are the unsharded 2-process run's (each
    process samples the same completions: a rank whose rows have ended waits for the other's without drawing)."""
    base = ["train", "algo=grpo", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "algo.group_size=2"]
    base += ["algo.n_groups=4", "algo.batch_size=8", "algo.beta=0.04", "total_steps=16", "eval.every=0"]
    base += ["env.n_eval=4", "env.eval_samples=2", "model.max_new_tokens=6", f"tracking.uri={migrated_store.uri}"]
    base += ["hardware.processes=2"]
    proc = run_pgcli([*base, "hardware.shard=params"], cwd=workdir, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_two_process_run(migrated_store, workdir, "train/loss", [8, 16])
    sharded = one_run(migrated_store)
    assert sharded.data.params["hardware.shard"] == "params" and "eval/accuracy" in sharded.data.metrics
    proc = run_pgcli(base, cwd=workdir, timeout=400)  # the same run, each process holding the whole model
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whole,) = [r for r in migrated_store.runs("addition") if r.data.params.get("hardware.shard") == "none"]
    for key in ("rollout/reward_mean", "rollout/completion_len", "train/loss", "train/grad_norm", "train/kl_ref"):
        history = [migrated_store.client().get_metric_history(r.info.run_id, key) for r in (sharded, whole)]
        assert [m.value for m in history[0]] == pytest.approx([m.value for m in history[1]], rel=1e-5, abs=1e-8), key


def test_a_sharded_grpo_run_resumes_as_the_unsharded_one_does(
    migrated_store: Store, workdir: Path, tiny_hf_model: Path
):
    """A sharded GRPO run of one update, resumed to two on 2 processes (rank 0's checkpoint of the policy, Adam's
    state and the sharded KL reference loaded into every process's shards), logs the losses of the unsharded run
    stopped and resumed alike."""
    base = ["train", "algo=grpo", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "algo.group_size=2"]
    base += ["algo.n_groups=4", "algo.batch_size=8", "algo.beta=0.04", "eval.every=0", "checkpoint_every=8"]
    base += ["env.n_eval=4", f"tracking.uri={migrated_store.uri}", "hardware.processes=2"]
    losses = {shard: stopped_and_resumed_losses(base, shard, 8, 16, migrated_store, workdir) for shard in SHARDS}
    assert [s for s, _ in losses["params"]] == [8, 16]  # every global update once
    assert [v for _, v in losses["params"]] == pytest.approx([v for _, v in losses["none"]], rel=1e-5, abs=1e-8)
