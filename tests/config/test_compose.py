"""Compose every group option with Hydra's compose API; bad overrides give the documented one-line error.

Options are listed from the ``conf/`` directories, so a new algo, env or preset is covered without editing this file.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pytest

from pgcli.cli import main
from pgcli.config import (
    ALGOS,
    TEXT_ENV_CONFIGS,
    EnvConfig,
    FlowGRPOConfig,
    GRPOConfig,
    LMModelConfig,
    SFTConfig,
    TrainConfig,
)
from pgcli.config.compose import CONF_DIR, compose_train_config, job_overrides, text_task_overrides
from pgcli.config.pixels import IMAGE_ENVS
from pgcli.config.text import AGENT_ENV_CONFIGS
from pgcli.errors import ConfigError
from pgcli.training.checks import train_config


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


ALGO_OPTIONS, ENVS, PRESETS = options("algo"), options("env"), options("preset")
TEXT_ENVS = [e for e in ENVS if e in TEXT_ENV_CONFIGS]
# image envs (env=pong, ...) are composed with the algos that take frames in tests/unit/test_pixels.py
GYM_ENVS = [e for e in ENVS if e not in TEXT_ENV_CONFIGS and e not in IMAGE_ENVS]
CONTROL = [a for a in ALGO_OPTIONS if ALGOS[a].trains_on("control")]
TEXT = [a for a in ALGO_OPTIONS if ALGOS[a].trains_on("text", "multi-turn")]
AGENT_ALGOS = (FlowGRPOConfig, GRPOConfig, SFTConfig)
"""What trains on a multi-turn task (docs/lm.md, "Multi-turn agents"); flow_grpo trains on nothing else."""


def trains_on(algo: str, env: str) -> bool:
    multi_turn = TEXT_ENV_CONFIGS[env] in AGENT_ENV_CONFIGS
    schema = ALGOS[algo].schema
    return schema in AGENT_ALGOS if multi_turn else schema is not FlowGRPOConfig


DATASET = [f"env.path={Path(__file__).parent.parent / 'data' / 'sums.jsonl'}", "env.eval_size=4", "env.n_eval=4"]
"""env=dataset's rows: twelve sums with an answer, a completion and a chosen/rejected pair (tests/data/sums.jsonl)."""


@functools.cache
def composed(*overrides: str) -> Any:
    """train_config (compose + the world's checks), memoised: a Hydra compose costs ~0.25 s and the pair matrix is
    reused for presets."""
    return train_config(list(overrides))


def test_conf_lists_the_foundation_options():
    # The listing itself must work, or the parametrisations below would silently test nothing.
    assert {"ppo", "a2c"} <= set(ALGO_OPTIONS)
    assert {"cartpole", "pendulum", "hopper", "halfcheetah", "walker2d"} <= set(ENVS)
    zoo_pairs = {
        f"{a}_{e}" for a in ("ppo", "a2c") for e in ("cartpole", "pendulum", "hopper", "halfcheetah", "walker2d")
    }
    assert zoo_pairs <= set(PRESETS)
    assert set(options("model")) >= {"mlp", "mlp_large"}
    assert set(options("hardware")) >= {"cpu", "cuda", "auto"}
    assert set(options("tracking")) >= {"local", "server", "off"}


@pytest.mark.parametrize(("algo", "env"), list(itertools.product(CONTROL, GYM_ENVS)))
def test_every_algo_env_pair_composes_to_typed_config(algo: str, env: str):
    cfg = composed(f"algo={algo}", f"env={env}")
    assert isinstance(cfg, TrainConfig)
    assert type(cfg.algo) is ALGOS[algo].schema
    assert isinstance(cfg.env, EnvConfig)
    assert cfg.total_steps >= 1 and cfg.env.n_envs >= 1


@pytest.mark.parametrize(("algo", "env"), [p for p in itertools.product(TEXT, TEXT_ENVS) if trains_on(*p)])
def test_every_text_algo_task_pair_composes_with_the_lm_model(algo: str, env: str):
    path = DATASET if env == "dataset" else []
    cfg = composed(f"algo={algo}", f"env={env}", *path)  # model=tiny_gpt is implied by a text env
    assert type(cfg.algo) is ALGOS[algo].schema
    assert type(cfg.env) is TEXT_ENV_CONFIGS[env] and cfg.env.id == env
    assert isinstance(cfg.model, LMModelConfig)


@pytest.mark.parametrize(("algo", "env"), [p for p in itertools.product(TEXT, TEXT_ENVS) if not trains_on(*p)])
def test_a_single_turn_algo_on_a_multi_turn_task_and_back_is_one_line(algo: str, env: str):
    path = DATASET if env == "dataset" else []
    with pytest.raises(ConfigError, match="multi-turn task") as err:
        composed(f"algo={algo}", f"env={env}", *path)
    assert "\n" not in str(err.value)


def test_text_and_control_options_do_not_mix():
    assert {"addition", "sort", "countdown"} <= set(TEXT_ENVS) and "sft" in TEXT and "ppo" in CONTROL
    with pytest.raises(ConfigError, match=r"^algo=ppo does not train on text tasks; env=addition takes algo="):
        train_config(["algo=ppo", "env=addition"])
    with pytest.raises(ConfigError, match=r"^algo=sft trains on text tasks only"):
        train_config(["algo=sft", "env=cartpole"])
    with pytest.raises(ConfigError, match=r"^env=addition is a text task: it needs model=tiny_gpt"):
        train_config(["algo=sft", "env=addition", "model=mlp"])
    with pytest.raises(ConfigError, match=r"^model must be an MLP option .* model=tiny_gpt is for text tasks"):
        train_config(["env=cartpole", "model=tiny_gpt"])
    with pytest.raises(ConfigError, match=r"^init must be null on a gymnasium env"):
        train_config(["env=cartpole", "init=abc"])


def test_a_text_env_implies_the_lm_model_and_grpo():
    cfg = composed("env=sort")
    assert isinstance(cfg.model, LMModelConfig) and cfg.algo.name == "grpo"
    assert composed("env=sort", "algo=sft").algo.name == "sft"
    assert text_task_overrides(["env=addition,sort", "algo=sft"]) == ["model=tiny_gpt"]  # a sweep of text tasks
    assert text_task_overrides(["env=addition,cartpole"]) == [] and text_task_overrides(["seed=1"]) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.max_len=10", r"^model.max_len must be >= 17 \(env=addition: BOS \+ prompt \+ completion \+ EOS\)"),
        ("env.n_digits=1", r"^env.n_eval must be <= half of the 100 distinct addition prompts \(got 256\)"),
        ("env.id=sort", r"^env.id must be 'addition' for env=addition \(got 'sort'\)"),
        ("model.n_heads=3", r"^model.d_model must be divisible by model.n_heads=3"),
        ("model.top_p=0", r"^model.top_p must be in \(0, 1\]"),
        ("'+env.reward={_target_: nowhere.fn}'", r"^env.reward._target_ 'nowhere.fn'"),
        ("+env.reward.weight=2", r"^env.reward must be \{_target_: module.function, ...\}"),
        ("algo.advantage=process", r"^algo.advantage=process needs per-step rewards of a control task"),
    ],
)
def test_bad_text_settings_are_one_line_errors(override: str, message: str):
    algo = "algo=grpo" if override.startswith("algo.") else "algo=sft"
    with pytest.raises(ConfigError, match=message):
        train_config([algo, "env=addition", override.strip("'")])


@pytest.mark.parametrize("group", ["model", "hardware", "tracking"])
def test_every_option_of_the_other_groups_composes(group: str):
    for option in options(group):
        if group == "hardware" and option == "cuda":
            continue  # needs a GPU: see test_cuda_without_gpu_is_a_clear_error
        text = ["env=addition", "algo=sft"] if group == "model" and option == "tiny_gpt" else []
        text = ["env=minatar_breakout"] if group == "model" and option == "cnn" else text
        if group == "model" and option == "hf":  # a model directory is needed: checked in tests/unit/test_lm_hf.py
            continue
        cfg = train_config([f"{group}={option}", *text])
        assert isinstance(cfg, TrainConfig)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_changes_its_pair_and_can_be_removed(preset: str):
    # '<algo>_<env>', where both names may contain '_' (ppo_kl, inverted_pendulum): the split naming an option of each.
    # '<algo>_<env>_<variant>' (ppo_hopper_zoo) is a named alternative, chosen with preset=<name>.
    # An exact '<algo>_<env>' first: flow_grpo_countdown_tool is not a variant of a flow_grpo_countdown pair.
    exact = [(a, e) for a in ALGO_OPTIONS for e in ENVS if preset == f"{a}_{e}"]
    algo, env = (exact or [(a, e) for a in ALGO_OPTIONS for e in ENVS if preset.startswith(f"{a}_{e}_")])[0]
    chosen = [] if preset == f"{algo}_{env}" else [f"preset={preset}"]
    rows = DATASET if env == "dataset" else []
    with_preset = composed(f"algo={algo}", f"env={env}", *chosen, *rows)
    without = composed(f"algo={algo}", f"env={env}", "~preset", *rows)
    assert with_preset != without, f"preset {preset} changes nothing"


def test_ppo_cartpole_preset_applies_and_user_override_wins():
    default = train_config([])
    assert type(default.algo).name == "ppo" and default.env.id == "CartPole-v1"
    assert default.algo.n_steps == 32  # rl-baselines3-zoo's CartPole-v1 PPO (the schema default is 2048)
    assert default.algo.lr_schedule == "linear"

    overridden = train_config(["algo.n_steps=64", "algo.gamma=0.95"])
    assert overridden.algo.n_steps == 64 and overridden.algo.gamma == 0.95
    assert overridden.algo.batch_size == default.algo.batch_size  # the rest of the preset still applies

    plain = train_config(["~preset"])
    assert plain.algo.n_steps == 2048 and plain.algo.lr_schedule == "constant"


def test_preset_follows_the_chosen_pair():
    a2c_pendulum = train_config(["algo=a2c", "env=pendulum"])
    assert a2c_pendulum.algo.use_sde and a2c_pendulum.env.normalize_obs  # a2c_pendulum.yaml
    no_preset_pair = train_config(["algo=a2c", "env=acrobot"])  # no a2c_acrobot.yaml: optional, no error
    assert no_preset_pair.algo.n_steps == 5


def test_ppo_hopper_preset_and_its_named_zoo_variant():
    default = composed("algo=ppo", "env=hopper")  # conf/preset/ppo_hopper.yaml: the PPO paper's settings, 4 envs
    assert (default.env.n_envs, default.algo.n_steps, default.algo.lr_schedule) == (4, 512, "linear")
    assert default.model.pi_hidden_sizes == [64, 64] and default.model.log_std_init == 0.0
    zoo = composed("algo=ppo", "env=hopper", "preset=ppo_hopper_zoo")  # rl-baselines3-zoo's tuned values
    assert (zoo.env.n_envs, zoo.algo.gamma, zoo.model.activation, zoo.model.log_std_init) == (1, 0.999, "relu", -2.0)
    assert zoo.total_steps == default.total_steps == 1_000_000


def test_open_env_kwargs_take_new_keys_with_append():
    cfg = train_config(["env=pendulum", "+env.kwargs.g=9.81"])
    assert cfg.env.kwargs == {"g": 9.81}


# --------------------------------------------------------------------------------------------------------------------
# bad overrides: one line naming the key, the value and the rule
# --------------------------------------------------------------------------------------------------------------------

BAD_OVERRIDES = [
    # (overrides, fragments the one-line message must contain)
    (["algo.clip_rnge=0.1"], ["algo.clip_rnge", "did you mean clip_range"]),
    (["+algo.clip_rnge=0.1"], ["algo.clip_rnge", "did you mean clip_range"]),
    (["totl_steps=10"], ["totl_steps", "did you mean total_steps"]),
    (["env.kwargs.g=1"], ["env.kwargs.g", "+env.kwargs.g"]),
    (["algo.learning_rate=fast"], ["algo.learning_rate", "fast", "Float"]),
    (["algo.n_steps=1.5"], ["algo.n_steps", "1.5", "Integer"]),
    (["algo.learning_rate=0"], ["algo.learning_rate", "> 0", "0.0"]),
    (["algo.learning_rate=-1e-3"], ["algo.learning_rate", "> 0", "-0.001"]),
    (["algo=a2c", "algo.learning_rate=0"], ["algo.learning_rate", "> 0"]),
    (["algo=a2c", "algo.use_rms_prop=false", "algo.rms_prop_tf_like=true"], ["algo.rms_prop_tf_like", "use_rms_prop"]),
    (["algo.gamma=0"], ["algo.gamma", "(0, 1]", "0.0"]),
    (["algo.gamma=1.01"], ["algo.gamma", "(0, 1]", "1.01"]),
    (["algo.clip_range=0"], ["algo.clip_range", "(0, 1)", "0.0"]),
    (["algo.clip_range=1"], ["algo.clip_range", "(0, 1)", "1.0"]),
    (["env.n_envs=0"], ["env.n_envs", ">= 1", "0"]),
    (["total_steps=0"], ["total_steps", ">= 1", "0"]),
    (["checkpoint_keep=-1"], ["checkpoint_keep", ">= 0", "-1", "0 keeps every checkpoint"]),
    (["env.id=CartPole-v9"], ["env.id", "CartPole-v9", "registered gymnasium", "CartPole-v1"]),
    (["algo=nope"], ["algo", "nope", "available", "ppo", "a2c"]),
    (["env=hoper"], ["env", "hoper", "available", "hopper"]),
    (["model.activation=sigmoid"], ["model.activation", "sigmoid", "tanh"]),
    # the preset group is optional: without this check Hydra would drop a misspelt preset silently
    (["algo=ppo", "env=hopper", "preset=ppo_hopper_zo"], ["preset", "ppo_hopper_zo", "did you mean", "ppo_hopper_zoo"]),
]


@pytest.mark.parametrize(("overrides", "fragments"), BAD_OVERRIDES, ids=lambda v: " ".join(v) if v else "")
def test_bad_override_is_one_line_config_error(overrides: list[str], fragments: list[str]):
    with pytest.raises(ConfigError) as info:
        train_config(overrides)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


@pytest.mark.parametrize(("overrides", "fragments"), [BAD_OVERRIDES[0], BAD_OVERRIDES[6]], ids=str)
def test_cli_prints_config_error_on_one_line_with_status_2(overrides, fragments, capsys):
    status = main(["train", *overrides])  # validation stops before Hydra runs: nothing is trained or tracked
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("pgcli: error: ")
    assert all(fragment in err for fragment in fragments)


def test_sweep_is_validated_job_by_job_before_any_runs(capsys):
    status = main(["train", "-m", "algo.gamma=0.9,0.99,1.5", "seed=0,1"])
    assert status == 2
    assert "algo.gamma must be in (0, 1] (got 1.5)" in capsys.readouterr().err


def test_cuda_without_gpu_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: hardware=cuda is valid here")
    for text in ([], ["algo=sft", "env=addition"]):  # a text task too (docs/lm.md)
        with pytest.raises(ConfigError, match=r"hardware=cuda but no CUDA GPU is visible.*use hardware=cpu"):
            train_config(["hardware=cuda", *text])


def test_two_core_options_compose_and_a_bad_vec_env_is_one_line():
    cfg = train_config(["algo=trpo", "env=hopper", "hardware.vec_env=worker", "hardware.eval_process=true"])
    assert (cfg.hardware.vec_env, cfg.hardware.eval_process) == ("worker", True)
    # the preset's two-core default (docs/benchmarks/trpo.md, "Two cores")
    default = train_config(["algo=trpo", "env=hopper"])
    assert (default.hardware.vec_env, default.hardware.eval_process, default.algo.critic_process) == (
        "shm",
        False,
        False,
    )
    other = train_config(["algo=trpo", "env=halfcheetah"])  # elsewhere opt-in
    assert (other.hardware.vec_env, other.hardware.eval_process) == ("sync", False)
    with pytest.raises(
        ConfigError, match=r"hardware\.vec_env must be one of sync, async, worker, shm, envpool \(got 'threads'\)"
    ) as err:
        train_config(["hardware.vec_env=threads"])
    assert "\n" not in str(err.value)


def test_a_sweeps_primary_config_composes_with_each_swept_groups_first_choice():
    from pgcli.config.compose import primary_choices, primary_overrides

    lines = ["env=addition", "algo=grpo,rloo", "algo.beta=0.1", "seed=0,1", "model=choice(tiny_gpt,hf)"]
    first = ["env=addition", "algo=grpo", "algo=grpo,rloo", "algo.beta=0.1", "seed=0,1"]
    assert primary_choices(lines) == [*first, "model=tiny_gpt", "model=choice(tiny_gpt,hf)"]
    assert primary_overrides(lines) == ["env=addition", "algo=grpo", "algo.beta=0.1", "model=tiny_gpt"]
    compose_train_config(primary_overrides(lines))  # train.yaml's default algo (ppo) has no beta
    # each job still gets its own choice: Hydra's sweepers keep the last line per key
    assert [job[1] for job in job_overrides(primary_choices(lines), multirun=True)][::4] == ["algo=grpo", "algo=rloo"]


def test_a_key_a_preset_sets_for_another_algorithm_names_the_preset():
    with pytest.raises(ConfigError) as err:
        compose_train_config(["env=dataset", "preset=grpo_dataset", "algo=rloo"])
    assert str(err.value).startswith(
        "unknown key 'algo.scale_rewards' (RLOOConfig has no field 'scale_rewards'), set by preset/grpo_dataset"
    )


@pytest.mark.parametrize(
    "overrides",
    [[], ["algo=trpo", "env=hopper", "seed=3"], ["algo=grpo", "env=addition", "model=tiny_gpt", "algo.beta=0.1"]],
)
def test_a_job_is_composed_once_and_without_hydras_node_is_what_hydra_composes(
    overrides: list[str], monkeypatch: pytest.MonkeyPatch
):
    # the checks before a run ask for one job's config several times (values, preset, store): Hydra composes it once
    import hydra
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from pgcli.config import compose as module

    calls = []
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(a) or compose(*a, **k))
    module._compose_with_hydra_node.cache_clear()
    with_node = module.hydra_compose(overrides, hydra_node=True)
    without = module.hydra_compose(overrides)
    assert len(calls) == 1
    assert "hydra" in with_node and "hydra" not in without
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="pgcli"):
        fresh = compose("train", overrides=overrides)
    assert OmegaConf.to_yaml(without) == OmegaConf.to_yaml(fresh)
    assert OmegaConf.is_struct(without) == OmegaConf.is_struct(fresh)
    without.seed = 99  # each caller gets its own copy
    assert module.hydra_compose(overrides).seed != 99
