"""Runs that share the cores give up their second process (pgcli.hardware.placement.one_process): the same config
otherwise."""

from __future__ import annotations

import dataclasses

from pgcli.config.compose import compose_train_config
from pgcli.hardware.placement import one_process, parallel_launcher, uses_second_core


def test_the_two_core_preset_goes_to_one_process_and_nothing_else_changes():
    cfg = compose_train_config(["algo=trpo", "env=hopper", "algo.critic_process=true", "hardware.eval_process=true"])
    assert (cfg.hardware.vec_env, cfg.hardware.eval_process, cfg.algo.critic_process) == ("shm", True, True)
    assert uses_second_core(cfg)
    single = one_process(cfg)
    assert (single.hardware.vec_env, single.hardware.eval_process, single.algo.critic_process) == ("sync", False, False)
    assert not uses_second_core(single)
    assert dataclasses.replace(single, hardware=cfg.hardware, algo=cfg.algo) == cfg


def test_one_process_keeps_a_one_process_vector_env_and_algos_without_a_critic_process():
    cfg = compose_train_config(["algo=ppo", "env=cartpole", "hardware.vec_env=async", "hardware.eval_process=true"])
    assert uses_second_core(cfg)
    single = one_process(cfg)
    assert single.hardware.vec_env == "async" and not single.hardware.eval_process and single.algo == cfg.algo
    assert not uses_second_core(compose_train_config(["algo=trpo", "env=cartpole"]))


def test_only_hydras_basic_launcher_runs_jobs_one_after_another():
    assert not parallel_launcher("hydra._internal.core_plugins.basic_launcher.BasicLauncher")
    assert parallel_launcher("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher")
    assert parallel_launcher("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher")
