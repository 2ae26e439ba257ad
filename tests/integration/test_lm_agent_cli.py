"""Multi-turn agents (docs/lm.md, "Multi-turn agents"): a real `pgcli sft` on the turns of env=countdown_tool, then
Flow-GRPO and whole-trajectory GRPO from it through the CLI, each a FINISHED MLflow run with the played held-out
evaluation and the per-turn metrics; `pgcli eval` plays the final model again and scores what the run logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Store, run_pgcli

AGENT_SMALL = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.n_eval=32", "env.eval_pass_k=2",
               "env.eval_samples=4", "progress=false"]  # fmt: skip
"""A tiny TinyGPT and a small held-out set of countdown questions."""


@pytest.fixture(scope="module")
def agent_sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Path, str]:
    root = tmp_path_factory.mktemp("agent")
    store, workdir = Store(root / "store"), root / "work"
    workdir.mkdir()
    args = [
        "sft",
        "env=countdown_tool",
        f"tracking.uri={store.uri}",
        "total_steps=1024",
        "eval.every=512",
        "algo.batch_size=64",
        "algo.warmup_steps=128",
        *AGENT_SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("countdown_tool")
    assert run.info.status == "FINISHED"
    # SFT trains on single turns and is scored by playing whole questions
    assert {"eval/accuracy", "eval/turns_mean", "eval/tool_error_rate"} <= set(run.data.metrics)
    return store, workdir, run.info.run_id


@pytest.mark.parametrize("algo", ["flow_grpo", "grpo"])
def test_flow_grpo_and_trajectory_grpo_land_finished_runs_with_the_turn_metrics(agent_sft, algo: str):
    store, workdir, sft_id = agent_sft
    args = [
        "train",
        f"algo={algo}",
        "env=countdown_tool",
        f"init={sft_id}",
        f"tracking.uri={store.uri}",
        "total_steps=48",
        "eval.every=24",
        "algo.group_size=4",
        "algo.n_groups=2",
        "algo.batch_size=8",
        "algo.beta=0.04",
        f"run_name={algo}",
        "progress=false",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{algo} on countdown_tool (seed 0):" in proc.stdout and "sampled turns in" in proc.stdout
    (run,) = [r for r in store.runs("countdown_tool") if r.info.run_name == algo]
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == sft_id
    metrics = run.data.metrics
    assert {
        "eval/accuracy",
        "eval/pass_at_2",
        "eval/turns_mean",
        "eval/tool_error_rate",
        "eval/kl_ref",
        "rollout/turns_mean",
        "rollout/tool_error_rate",
        "rollout/errors_malformed",
        "train/kl_ref",
        "train/clip_fraction",
    } <= set(metrics)
    assert 1.0 <= metrics["eval/turns_mean"] <= 4.0 and 0.0 <= metrics["eval/tool_error_rate"] <= 1.0
    client = store.client()
    # a step is one sampled turn: an update of 8 trajectories takes 8 to 32 of them
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/turns_mean")]
    assert steps[0] >= 8 and steps[-1] >= 48
    samples = json.loads(Path(client.download_artifacts(run.info.run_id, "samples/step_0.json")).read_text())
    assert len(samples) == 4 and {"greedy", "reference", "turns", "tool_errors", "sampled"} <= set(samples[0])
    assert samples[0]["reference"].count("=") >= 1  # "3*5=15; 15+7=22"


def test_eval_plays_the_final_model_and_scores_what_the_run_logged(agent_sft):
    store, workdir, sft_id = agent_sft
    proc = run_pgcli(["eval", sft_id, f"tracking.uri={store.uri}"], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = store.client().get_run(sft_id).data.metrics["eval/accuracy"]
    (line,) = [x for x in proc.stdout.splitlines() if x.strip().startswith("accuracy")]
    assert float(line.split()[1]) == pytest.approx(logged, abs=5e-4)
    assert "turns_mean" in proc.stdout
    # the first transcripts of the samples table: the reference's and the greedy trajectory's turns
    lines = proc.stdout.splitlines()
    start = lines.index("  samples (4 of 4 in the table):")
    assert lines[start + 1].split() == ["prompt", "reference", "greedy", "answer", "correct"]
    assert all(line.count("=") >= 2 for line in lines[start + 2 : start + 6])  # 'a,b>t=' and '3*5=15; ...'


def test_a_resumed_flow_grpo_run_logs_what_a_straight_run_logs(agent_sft):
    """Stopped at its first checkpoint and resumed, a Flow-GRPO run (sampled questions, the tool's answers, the
    per-turn samples and their RNG) logs exactly the history of one straight run."""
    store, workdir, sft_id = agent_sft
    base = [
        "train", "algo=flow_grpo", "env=countdown_tool", f"init={sft_id}", f"tracking.uri={store.uri}",
        "eval.every=0", "checkpoint_every=24", "algo.group_size=4", "algo.n_groups=2", "algo.batch_size=8",
        "algo.beta=0.04", "progress=false",
    ]  # fmt: skip
    for name, steps in (("flow-straight", 48), ("flow-stopped", 24)):
        proc = run_pgcli([*base, f"total_steps={steps}", f"run_name={name}"], cwd=workdir, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.info.run_name: r.info.run_id for r in store.runs("countdown_tool")}
    resume = ["train", f"resume={runs['flow-stopped']}", "total_steps=48", f"tracking.uri={store.uri}"]
    proc = run_pgcli(resume, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = store.client()
    # eval/* is not compared: the first leg's own final evaluation stays in its history
    for key in ("train/loss", "train/kl_ref", "rollout/turns_mean", "rollout/reward_mean"):
        straight = [(m.step, m.value) for m in client.get_metric_history(runs["flow-straight"], key)]
        resumed = [(m.step, m.value) for m in client.get_metric_history(runs["flow-stopped"], key)]
        assert len(straight) >= 1 and resumed == straight, key
