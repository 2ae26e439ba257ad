"""``model=hf`` through the real CLI (docs/lm.md, "Hugging Face models"): a random Llama written offline
(``tiny_hf_model``) fine-tuned by ``pgcli sft`` with LoRA and in full, each RL algorithm started from it, ``pgcli
eval``, bit-exact resume, and the one-line errors of a bad model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Store, migrated, run_pgcli

HF_SMALL = ["env.n_digits=2", "env.n_eval=16", "env.eval_pass_k=2", "env.eval_samples=4", "progress=false"]
RL_SMALL = ["total_steps=32", "eval.every=0", "algo.group_size=4", "algo.n_groups=4", "algo.batch_size=8"]


def lora_args(command: list[str], model: Path, store: Store) -> list[str]:
    """A LoRA run of ``model`` checkpointed every 16 steps, evaluated at its end only: the module's SFT run, and the
    runs the resume test stops and compares (total_steps and run_name aside)."""
    args = [*command, "env=addition", "model=hf", f"model.path={model}", "model.lora.r=4", "eval.every=0"]
    args += ["checkpoint_every=16", f"tracking.uri={store.uri}", *HF_SMALL]
    return [*args, "algo.batch_size=8", "algo.warmup_steps=8"] if command[0] == "sft" else args


class HFRun(NamedTuple):
    store: Store
    workdir: Path
    run_id: str
    model: Path


@pytest.fixture(scope="module")
def hf_sft(tmp_path_factory: pytest.TempPathFactory, tiny_hf_model: Path, mlflow_schema_db: Path) -> HFRun:
    """One `pgcli sft` of the random Llama with LoRA adapters: the start (init=) of the RL runs below, and the
    straight run the resumed SFT run must match."""
    root = tmp_path_factory.mktemp("hf-cli")
    store, workdir = migrated(root / "store", mlflow_schema_db), root / "work"
    workdir.mkdir()
    args = [*lora_args(["sft"], tiny_hf_model, store), "total_steps=32", "run_name=sft-lora"]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    return HFRun(store, workdir, run.info.run_id, tiny_hf_model)


def _run(hf: HFRun, name: str):
    (run,) = [r for r in hf.store.runs("addition") if r.info.run_name == name]
    return run


def test_sft_with_lora_lands_a_finished_run_with_accuracy_and_merged_weights(hf_sft: HFRun):
    run = _run(hf_sft, "sft-lora")
    assert run.info.status == "FINISHED"
    assert "eval/accuracy" in run.data.metrics and "train/loss" in run.data.metrics
    assert run.data.params["model.path"] == str(hf_sft.model) and run.data.params["model.lora.r"] == "4"
    import torch

    state = torch.load(Path(run.data.tags["output_dir"]) / "model" / "policy.pt", weights_only=True)
    assert state and not any("lora_" in key for key in state)  # what a fresh base model of model.path loads


def test_the_logged_model_completes_prompts_as_the_run_did(hf_sft: HFRun):
    import json

    import mlflow.pyfunc

    client = hf_sft.store.client()
    path = client.download_artifacts(hf_sft.run_id, "samples/step_32.json", str(hf_sft.workdir))
    table = json.loads(Path(path).read_text())
    prompts, greedy = [row["prompt"] for row in table], [row["greedy"] for row in table]
    mlflow.set_tracking_uri(hf_sft.store.uri)
    model = mlflow.pyfunc.load_model(f"runs:/{hf_sft.run_id}/model")
    assert model.predict(prompts) == greedy
    # prompts outside the task are refused as TinyGPT's model refuses them, whatever the tokenizer reads
    with pytest.raises(ValueError, match=r"prompt '12\*34=': character '\*' is not in the vocabulary"):
        model.predict(["12*34="])


def test_a_full_fine_tune_lands_a_finished_run(hf_sft: HFRun):
    args = [
        "sft",
        "env=addition",
        "model=hf",
        f"model.path={hf_sft.model}",
        "model.lora.r=0",
        "total_steps=32",
        "eval.every=0",
        "algo.batch_size=16",
        f"tracking.uri={hf_sft.store.uri}",
        "run_name=sft-full",
        *HF_SMALL,
    ]
    proc = run_pgcli(args, cwd=hf_sft.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = _run(hf_sft, "sft-full")
    assert run.info.status == "FINISHED" and "eval/accuracy" in run.data.metrics


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "ppo_lm"])
def test_each_rl_algorithm_trains_the_hf_model_from_its_sft_run(hf_sft: HFRun, algo: str):
    # model=hf and model.path come from the init run; the KL reference is the SFT model (the adapters off)
    args = [
        "train",
        f"algo={algo}",
        "env=addition",
        f"init={hf_sft.run_id}",
        "algo.beta=0.04",
        f"tracking.uri={hf_sft.store.uri}",
        f"run_name={algo}-hf",
        *RL_SMALL,
        *HF_SMALL,
    ]
    if algo == "ppo_lm":
        args = [a for a in args if not a.startswith("algo.group_size")]
    proc = run_pgcli(args, cwd=hf_sft.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model=hf model.path={hf_sft.model}" in proc.stderr
    run = _run(hf_sft, f"{algo}-hf")
    assert run.info.status == "FINISHED" and run.data.tags["init_run_id"] == hf_sft.run_id
    assert "eval/accuracy" in run.data.metrics


def test_pgcli_eval_repeats_the_runs_last_evaluation(hf_sft: HFRun):
    proc = run_pgcli(["eval", hf_sft.run_id, f"tracking.uri={hf_sft.store.uri}"], cwd=hf_sft.workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (evaluation,) = [r for r in hf_sft.store.runs("addition") if r.data.tags.get("source_run_id") == hf_sft.run_id]
    source = _run(hf_sft, "sft-lora")
    for key in ("eval/accuracy", "eval/pass_at_2", "eval/reward_mean", "eval/completion_len"):
        assert evaluation.data.metrics[key] == source.data.metrics[key], key


@pytest.mark.parametrize("command", [["sft"], ["train", "algo=grpo", "algo.beta=0.04", *RL_SMALL[2:]]])
def test_resume_is_bit_exact_on_the_hf_path(hf_sft: HFRun, command: list[str], migrated_store: Store, tmp_path: Path):
    """A run stopped at its first checkpoint and resumed logs exactly the losses of one straight run (SFT's: the
    module's SFT run, trained with the same arguments)."""
    sft = command == ["sft"]
    store = hf_sft.store if sft else migrated_store
    base = lora_args(command, hf_sft.model, store)
    for name, steps in [("stopped", 16)] if sft else [("straight", 32), ("stopped", 16)]:
        proc = run_pgcli([*base, f"total_steps={steps}", f"run_name={name}"], cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.info.run_name: r.info.run_id for r in store.runs("addition")}
    proc = run_pgcli(
        ["train", f"resume={runs['stopped']}", "total_steps=32", f"tracking.uri={store.uri}"], cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = store.client()
    key = "train/loss"
    straight = [(m.step, m.value) for m in client.get_metric_history(hf_sft.run_id if sft else runs["straight"], key)]
    resumed = [(m.step, m.value) for m in client.get_metric_history(runs["stopped"], key)]
    assert len(straight) >= 2 and resumed == straight


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.path=./no-such-model", "model.path=./no-such-model: no such directory"),
        (
            "model.path=pgcli-test/no-such-model",
            "model.path=pgcli-test/no-such-model: no such directory, and the "
            "hub id is not in the local Hugging Face cache and cannot be fetched",
        ),
        ("model.lora.target_modules=[qkv_nope]", "model.lora.target_modules=['qkv_nope']: "),
    ],
)
def test_a_bad_model_is_one_line_before_anything_is_created(
    tiny_hf_model: Path, tmp_path: Path, override: str, message: str
):
    args = ["sft", "env=addition", "model=hf", f"model.path={tiny_hf_model}", override, "total_steps=16", *HF_SMALL]
    proc = run_pgcli(args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"pgcli: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_export_writes_a_tiny_gpt_run_as_a_gpt2_with_the_same_logits_that_trains_on(lm_sft_run, tmp_path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pgcli.config.saved_agent import agent_config, read_agent_spec
    from pgcli.lm.load import make_text_policy, make_text_task

    store, workdir, run_id = lm_sft_run
    out = tmp_path / "addition-sft"
    proc = run_pgcli(["export", run_id, "--out", str(out), f"tracking.uri={store.uri}"], cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the printed command trains the exported run's task: 2-digit addition, not the 4-digit default
    hint = next(line for line in proc.stdout.splitlines() if line.startswith("train from it: "))
    assert hint.removeprefix("train from it: ").split() == [
        "pgcli", "train", "algo=grpo", "env=addition", "env.n_digits=2", "env.n_eval=32", "env.eval_pass_k=2",
        "env.eval_samples=4", "model=hf", f"model.path={out}",
    ]  # fmt: skip
    run_dir = Path(store.client().get_run(run_id).data.tags["output_dir"])
    cfg = agent_config(read_agent_spec(run_dir / "model"))
    task = make_text_task(cfg.env, cfg.model)
    ours = make_text_policy(task, cfg.model, torch.device("cpu"), run_dir / "model").eval()
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = ["12+34=", "99+1=", "5+67="]
    for prompt in prompts:
        ids = task.vocab.encode_prompt(prompt)
        assert [tokenizer.bos_token_id, *tokenizer.encode(prompt, add_special_tokens=False)] == ids
        x = torch.tensor([ids])
        with torch.no_grad():
            diff = (ours(x, torch.ones_like(x, dtype=torch.bool)) - theirs(input_ids=x).logits).abs().max()
        assert float(diff) <= 1e-5
    # the tokenizer adds <bos> itself: plain transformers answers as the run's greedy evaluation did (docs/lm.md)
    table = json.loads((run_dir / "samples" / "step_1024.json").read_text())
    for row in table:
        encoded = tokenizer(row["prompt"], return_tensors="pt")
        assert encoded["input_ids"][0].tolist() == task.vocab.encode_prompt(row["prompt"])
        answer = theirs.generate(**encoded, max_new_tokens=4, do_sample=False)
        assert tokenizer.decode(answer[0], skip_special_tokens=True) == row["prompt"] + row["greedy"]
    # GRPO on the exported model through model=hf: the export's task settings carried over, as init= carries them
    args = [
        "train",
        "algo=grpo",
        "env=addition",
        "model=hf",
        f"model.path={out}",
        "model.lora.r=0",
        f"tracking.uri={store.uri}",
        "run_name=grpo-exported",
        "env.eval_samples=2",  # typed: the command line wins
        *RL_SMALL,
        "progress=false",
    ]
    proc = run_pgcli(args, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"pgcli: note: model.path={out} sets env.n_digits=2 env.n_eval=32 env.eval_pass_k=2 (the exported run's task "
        "settings; a value on the command line wins)"
    ) in proc.stderr
    (run,) = [r for r in store.runs("addition") if r.info.run_name == "grpo-exported"]
    assert run.info.status == "FINISHED" and "eval/accuracy" in run.data.metrics
    params = run.data.params
    assert (params["env.n_digits"], params["env.n_eval"], params["env.eval_samples"]) == ("2", "32", "2")


def test_export_merges_the_adapters_of_an_hf_run(hf_sft: HFRun, tmp_path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    from pgcli.config.saved_agent import agent_config, read_agent_spec
    from pgcli.lm.load import make_text_policy, make_text_task

    out = tmp_path / "merged"
    proc = run_pgcli(
        ["export", hf_sft.run_id, "--out", str(out), f"tracking.uri={hf_sft.store.uri}"],
        cwd=hf_sft.workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_dir = Path(_run(hf_sft, "sft-lora").data.tags["output_dir"]) / "model"
    cfg = agent_config(read_agent_spec(model_dir))
    task = make_text_task(cfg.env, cfg.model)
    ours = make_text_policy(task, cfg.model, torch.device("cpu"), model_dir).eval()
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.tensor([task.vocab.encode_prompt("12+34=")])
    with torch.no_grad():
        diff = (ours(x, torch.ones_like(x, dtype=torch.bool)) - theirs(input_ids=x).logits).abs().max()
    assert float(diff) <= 1e-5
    again = run_pgcli(
        ["export", hf_sft.run_id, "--out", str(out), f"tracking.uri={hf_sft.store.uri}"],
        cwd=hf_sft.workdir,
        timeout=300,
    )
    assert again.returncode == 2
    assert again.stderr.strip() == f"pgcli: error: --out {out} exists and is not empty; pass another --out"


def test_micro_batches_train_the_hf_model(tiny_hf_model: Path, migrated_store: Store, tmp_path: Path):
    # model.micro_batch=2: each minibatch of 8 completions in forward/backward passes of 2, gradients accumulated
    store = migrated_store
    args = [
        "train",
        "algo=grpo",
        "env=addition",
        "model=hf",
        f"model.path={tiny_hf_model}",
        "model.lora.r=4",
        "model.micro_batch=2",
        "algo.beta=0.04",
        f"tracking.uri={store.uri}",
        *RL_SMALL,
        *HF_SMALL,
    ]
    proc = run_pgcli(args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = store.runs("addition")
    assert run.info.status == "FINISHED" and run.data.params["model.micro_batch"] == "2"
    assert "train/loss" in run.data.metrics and "eval/accuracy" in run.data.metrics
