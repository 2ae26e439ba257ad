"""Fixtures of the integration tests shared across files: one SFT warm start for the language-model runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, migrated, run_pgcli

LM_SMALL = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "env.n_digits=2", "env.n_eval=32",
            "env.eval_pass_k=2", "env.eval_samples=4", "progress=false"]  # fmt: skip
"""A tiny TinyGPT and a small held-out set: every text run of the integration tests uses these overrides."""


class SFTRun(NamedTuple):
    store: Store
    workdir: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        """The SFT run's directory (the tests that start from it train in the same ``workdir``)."""
        (run_dir,) = (
            p.parent
            for p in self.workdir.glob("outputs/runs/*/*/run.json")
            if json.loads(p.read_text()).get("run_id") == self.run_id
        )
        return run_dir


@pytest.fixture(scope="session")
def lm_sft_run(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> SFTRun:
    """One real `pgcli sft` run on addition per session: the warm start (init=) of every RL text run."""
    root = tmp_path_factory.mktemp("lm")
    store, workdir = migrated(root / "store", mlflow_schema_db), root / "work"
    workdir.mkdir()
    args = [
        "sft",
        "env=addition",
        f"tracking.uri={store.uri}",
        "total_steps=1024",
        "eval.every=512",
        "algo.batch_size=32",
        "algo.warmup_steps=256",
        "checkpoint_every=512",
        *LM_SMALL,
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    return SFTRun(store, workdir, run.info.run_id)


RM_EVAL_KEYS = ("eval/pairwise_accuracy", "eval/reward_margin", "eval/loss")
"""What ``pgcli eval`` of a reward model reports (and the run logged)."""


def assert_rm_eval_repeats_the_run(stdout: str, store: Store, experiment: str, run_id: str) -> None:
    """``pgcli eval <reward-model run>`` (its ``stdout``) logged an eval run whose pairwise accuracy, margin and loss
    are the source run's and printed each beside the logged value; it did not score the model as a policy."""
    source = store.client().get_run(run_id).data.metrics
    (evaluation,) = [r for r in store.runs(experiment) if r.data.tags.get("source_run_id") == run_id]
    for key in RM_EVAL_KEYS:
        assert evaluation.data.metrics[key] == pytest.approx(source[key], abs=1e-6), key
        name = key.removeprefix("eval/")
        line = next(line for line in stdout.splitlines() if line.split()[:1] == [name])
        assert line.split()[1:] == [f"{evaluation.data.metrics[key]:.3f}", "(logged", f"{source[key]:.3f})"], line
    assert "eval/accuracy" not in evaluation.data.metrics  # not scored as a policy
    assert "r(chosen)" in stdout and "ranked right" in stdout
