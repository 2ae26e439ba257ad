"""RL on a learned reward end to end (docs/lm.md, "RL on a learned reward"): real `pgcli train` runs of ppo_lm and
GRPO from the session's SFT run with ``env.reward=rm:<reward-model run>`` land FINISHED with the gold accuracy, the
proxy reward and the KL to the reference at every evaluation; a reward model that cannot be used is one line, exit 2,
before anything is created."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, run_pgcli
from tests.integration.conftest import LM_SMALL, SFTRun

RL_TINY = ["total_steps=32", "eval.every=16", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8",
           "algo.beta=0.04"]  # fmt: skip
EVAL_METRICS = {"eval/accuracy", "eval/proxy_reward_mean", "eval/proxy_reward_sampled_mean", "eval/kl_ref",
                "eval/return_mean"}  # fmt: skip


class RLHFSetup(NamedTuple):
    store: Store
    workdir: Path
    rm_run_id: str
    sft_dir: Path


@pytest.fixture(scope="module")
def rlhf(tmp_path_factory: pytest.TempPathFactory, lm_sft_run: SFTRun) -> RLHFSetup:
    """One tiny `pgcli rm` run in a store of its own, and the session's SFT run (named by its run directory)."""
    root = tmp_path_factory.mktemp("rlhf")
    store, workdir = Store(root / "store"), root / "work"
    workdir.mkdir()
    args = [
        "rm",
        "env=addition",
        f"tracking.uri={store.uri}",
        "total_steps=128",
        "eval.every=128",
        "checkpoint_every=128",
        "algo.batch_size=32",
        *LM_SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rm,) = store.runs("addition")
    sft = lm_sft_run.store.client().get_run(lm_sft_run.run_id)
    return RLHFSetup(store, workdir, rm.info.run_id, Path(sft.data.tags["output_dir"]))


@pytest.mark.parametrize("algo", ["ppo_lm", "grpo"])
def test_rl_on_the_reward_model_logs_gold_proxy_and_kl(rlhf: RLHFSetup, algo: str):
    args = [
        "train",
        f"algo={algo}",
        "env=addition",
        f"init={rlhf.sft_dir}",
        f"env.reward=rm:{rlhf.rm_run_id}",
        f"tracking.uri={rlhf.store.uri}",
        f"run_name=rlhf-{algo}",
        *RL_TINY,
        *LM_SMALL,
    ]
    proc = run_pgcli(args, cwd=rlhf.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in rlhf.store.runs("addition") if r.info.run_name == f"rlhf-{algo}"]
    assert run.info.status == "FINISHED" and run.data.tags["reward_model_run_id"] == rlhf.rm_run_id
    assert set(run.data.metrics) >= EVAL_METRICS | {"rollout/reward_mean", "rollout/accuracy", "train/kl_ref"}
    client = rlhf.store.client()

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    for key in EVAL_METRICS:  # every evaluation: the init model at 0, then every 16 sampled completions
        assert [step for step, _ in history(key)] == [0, 16, 32], key
    assert history("eval/kl_ref")[0][1] == pytest.approx(0.0, abs=1e-5)  # the policy starts as the reference
    assert all(0.0 <= value <= 1.0 for _, value in history("eval/accuracy"))
    # the reward optimised is the reward model's score (real numbers), not the checker's 0/1
    rewards = [value for _, value in history("rollout/reward_mean")]
    assert len(rewards) == 2 and any(value not in (0.0, 0.25, 0.5, 0.75, 1.0) for value in rewards)
    proxy = dict(history("eval/proxy_reward_mean"))
    assert proxy == pytest.approx(dict(history("eval/return_mean")), abs=1e-9)  # no format reward: the same scores
    # the summary names the gold and the proxy, each from the init model's score at step 0
    rows = [re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in proc.stdout.splitlines()]
    summary = {row[0]: row[1] for row in rows if len(row) == 2}
    gold = history("eval/accuracy")
    assert summary["gold (task checker)"] == f"{gold[0][1]:.3f} -> {gold[-1][1]:.3f}", proc.stdout
    assert summary["proxy (reward model)"] == f"{proxy[0]:.3f} -> {proxy[32]:.3f}", proc.stdout
    assert "final eval return" not in proc.stdout
    # learning_curve.png draws them on one panel (train.log names its series), the reward panel is the proxy's
    log = (Path(run.data.tags["output_dir"]) / "train.log").read_text()
    assert "gold: held-out accuracy [0, 1]: eval/accuracy, eval/pass_at_2 with proxy: reward-model score (right " in log
    assert (
        "axis): eval/proxy_reward_mean; proxy reward (reward model) of sampled completions: rollout/reward_mean" in log
    )
    # pgcli eval of the run repeats its last evaluation, the reward model's scores included
    proc = run_pgcli(["eval", run.info.run_id, f"tracking.uri={rlhf.store.uri}"], cwd=rlhf.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (evaluation,) = [r for r in rlhf.store.runs("addition") if r.data.tags.get("source_run_id") == run.info.run_id]
    for key in ("eval/accuracy", "eval/proxy_reward_mean", "eval/return_mean"):
        assert evaluation.data.metrics[key] == pytest.approx(run.data.metrics[key], abs=1e-6), key


def _running_run(store: Store) -> str:
    """A run of the store that has not finished (as a reward model still training would be)."""
    client = store.client()
    experiment = client.get_experiment_by_name("addition")
    return client.create_run(experiment.experiment_id, run_name="rm-still-running").info.run_id


@pytest.mark.parametrize("case", ["missing", "not_rm", "running"])
def test_an_unusable_reward_model_is_one_line_before_anything_is_created(rlhf: RLHFSetup, case: str, workdir: Path):
    ref = {"missing": str(workdir / "no-such-run"), "not_rm": str(rlhf.sft_dir)}.get(case) or _running_run(rlhf.store)
    message = {
        "missing": f"env.reward=rm:{ref}: no such run directory (and not an MLflow run id)",
        "not_rm": f"env.reward=rm:{ref}: {rlhf.sft_dir / 'model'} is the model of an algo=sft run, not a reward "
        "model; train one with pgcli rm env=addition",
        "running": f"env.reward=rm:{ref}: run {ref} is RUNNING, not FINISHED; its final model may be missing",
    }[case]
    before = len(rlhf.store.runs("addition"))
    proc = run_pgcli(
        [
            "train",
            "algo=grpo",
            "env=addition",
            f"env.reward=rm:{ref}",
            f"tracking.uri={rlhf.store.uri}",
            *RL_TINY,
            *LM_SMALL,
        ],
        cwd=workdir,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == f"pgcli: error: {message}\n"
    assert len(rlhf.store.runs("addition")) == before and not (workdir / "outputs").exists()


def _failed_copy(rlhf: RLHFSetup, root: Path) -> tuple[str, Path]:
    """A reward-model run that ended FAILED: the fixture's run directory copied, under a run of its own that the store
    and its run.json both record as FAILED (as a run that crashed after saving its model would be)."""
    import json

    client = rlhf.store.client()
    (rm,) = [r for r in rlhf.store.runs("addition") if r.info.run_id == rlhf.rm_run_id]
    run_dir = root / "failed-rm"
    shutil.copytree(rm.data.tags["output_dir"], run_dir)
    experiment = client.get_experiment_by_name("addition").experiment_id
    tags = {k: v for k, v in rm.data.tags.items() if not k.startswith("mlflow.")} | {"output_dir": str(run_dir)}
    failed = client.create_run(experiment, run_name="rm-failed", tags=tags)
    client.set_terminated(failed.info.run_id, "FAILED")
    info = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**info, "run_id": failed.info.run_id, "status": "FAILED"}))
    return failed.info.run_id, run_dir


@pytest.mark.parametrize("form", ["id", "dir"])
def test_a_failed_reward_model_is_refused_by_directory_as_by_id(rlhf: RLHFSetup, tmp_path: Path, form: str):
    run_id, run_dir = _failed_copy(rlhf, tmp_path)
    ref = run_id if form == "id" else str(run_dir)
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["train", "algo=grpo", "env=addition", f"env.reward=rm:{ref}", f"tracking.uri={rlhf.store.uri}"]
    args += [*RL_TINY, *LM_SMALL]
    proc = run_pgcli(args, cwd=workdir, timeout=120)
    message = f"env.reward=rm:{ref}: run {run_id} is FAILED, not FINISHED; its final model may be missing"
    assert (proc.returncode, proc.stderr) == (2, f"pgcli: error: {message}\n")
    assert not (workdir / "outputs").exists()


def test_resume_finds_the_reward_model_by_the_whole_id_and_directory_it_recorded(rlhf: RLHFSetup, tmp_path: Path):
    prefix = rlhf.rm_run_id[:8]
    args = ["train", "algo=grpo", "env=addition", f"init={rlhf.sft_dir}", f"env.reward=rm:{prefix}"]
    args += [f"tracking.uri={rlhf.store.uri}", "run_name=rlhf-resumed", "total_steps=16", "checkpoint_every=16"]
    args += [*(o for o in RL_TINY if not o.startswith("total_steps")), *LM_SMALL]
    proc = run_pgcli(args, cwd=rlhf.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [r for r in rlhf.store.runs("addition") if r.info.run_name == "rlhf-resumed"]
    run_dir = Path(run.data.tags["output_dir"])
    rm_dir = Path(run.data.tags["reward_model"]).parent
    assert f"env.reward=rm:{rm_dir}" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # whole, not the prefix
    assert run.data.tags["reward_model_run_id"] == rlhf.rm_run_id
    client = rlhf.store.client()
    client.delete_run(rlhf.rm_run_id)  # gone from the store (its prefix names no run), its directory intact
    try:
        proc = run_pgcli(
            ["train", f"resume={run.info.run_id}", "total_steps=32", f"tracking.uri={rlhf.store.uri}"],
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        client.restore_run(rlhf.rm_run_id)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = client.get_run(run.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["reward_model_run_id"] == rlhf.rm_run_id
