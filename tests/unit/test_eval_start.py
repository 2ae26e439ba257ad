"""What lets `pgcli eval` and the LoRA target check answer before the heavy imports (issue 34, item 10): the default
tracking settings without composing, a run found in a SQLite store without MLflow (and found as MLflow finds it), a
LoRA target checked against the weights' headers, and a rows file typed relative recorded whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcli.commands.eval import tracking_config
from pgcli.config import HFModelConfig, LoRAConfig, TrackingConfig
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.lm.model_files import check_lora_targets
from pgcli.tracking.store import RunStore, _record
from pgcli.training.references import pin_references


def test_the_default_tracking_settings_are_the_composed_ones():
    assert tracking_config([]) == compose_train_config([]).tracking == TrackingConfig()
    assert tracking_config(["tracking=off"]).backend == "off"
    with pytest.raises(ConfigError):
        tracking_config(["tracking.flush_every_s=-1"])


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    """A SQLite store of four runs: two active, one deleted, one in a deleted experiment."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    kept, gone = client.create_experiment("kept"), client.create_experiment("gone")
    for name, experiment in (("a", kept), ("b", kept), ("deleted", kept), ("elsewhere", gone)):
        run = client.create_run(experiment, run_name=name, tags={"k": name})
        client.log_param(run.info.run_id, "p", name)
        client.log_metric(run.info.run_id, "m", 1.5, step=3)
        client.set_terminated(run.info.run_id)
    client.delete_run(next(r for r in _all(client, kept) if r.info.run_name == "deleted").info.run_id)
    client.delete_experiment(gone)
    return RunStore(uri)


def _all(client, experiment_id: str) -> list:
    from mlflow.entities import ViewType

    return client.search_runs([experiment_id], run_view_type=ViewType.ALL)


def test_a_run_is_found_without_mlflow_as_mlflow_finds_it(store: RunStore):
    from mlflow.entities import ViewType

    client = store.client
    everything = client.search_runs(
        [e.experiment_id for e in client.search_experiments(ViewType.ALL)], "", run_view_type=ViewType.ALL
    )
    assert store.reader is not None and len(everything) == 4
    for run in everything:
        assert store.find(run.info.run_id) == _record(client.get_run(run.info.run_id)), run.info.run_name
    assert store.find("0" * 32) is None
    active = sorted(r.run_id for r in store.search(store.experiment_ids()))
    assert len(active) == 2
    for run_id in active:
        assert [r.run_id for r in store.runs_with_id_prefix(run_id[:8])] == [run_id]
    for bad in ("", "XYZ"):
        with pytest.raises(ValueError):
            store.runs_with_id_prefix(bad)
    hidden = [r.info.run_id for r in everything if r.info.run_id not in active]
    assert all(store.runs_with_id_prefix(run_id[:8]) == [] for run_id in hidden)  # as pgcli runs leaves them out


def _lora(path: Path, targets: list[str]) -> HFModelConfig:
    return HFModelConfig(path=str(path), lora=LoRAConfig(r=4, alpha=8.0, target_modules=targets))


def test_a_lora_target_no_module_has_is_refused_from_the_headers(tiny_hf_model: Path):
    with pytest.raises(ConfigError) as err:
        check_lora_targets(_lora(tiny_hf_model, ["qkv_nope", "attn_nope"]), tiny_hf_model)
    assert str(err.value) == (
        "model.lora.target_modules=['qkv_nope', 'attn_nope']: no module of the base model is named qkv_nope or "
        f"attn_nope (module names of {tiny_hf_model}: down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, "
        "q_proj, up_proj, v_proj)"
    )


@pytest.mark.parametrize(
    "targets",
    [
        ["q_proj", "qkv_nope"],  # one target matches: peft adapts it
        ["self_attn"],  # a parent module: peft names its type
        ["layers.0.self_attn.q_proj"],  # a dotted name: left to peft
        ["lm_head"],  # may be tied to the embedding, without a tensor of its own
        ["all-linear"],
    ],
)
def test_what_peft_may_accept_is_left_to_it(tiny_hf_model: Path, targets: list[str]):
    check_lora_targets(_lora(tiny_hf_model, targets), tiny_hf_model)


def test_a_rows_file_typed_relative_is_recorded_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "pairs.jsonl").write_text("{}\n")
    (tmp_path / "held").mkdir()
    monkeypatch.chdir(tmp_path)
    tracking = TrackingConfig(backend="off")
    lines = ["env=dataset", "env.path=pairs.jsonl", "env.eval_path=./held", "seed=1"]
    assert pin_references(lines, tracking) == [
        "env=dataset",
        f"env.path={tmp_path / 'pairs.jsonl'}",
        f"env.eval_path={tmp_path / 'held'}",
        "seed=1",
    ]
    assert pin_references(["env.path=trl-lib/ultrafeedback"], tracking) == ["env.path=trl-lib/ultrafeedback"]
