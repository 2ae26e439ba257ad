"""Where ``hardware=auto`` puts a run (pgcli.hardware.placement; docs/configuration.md, "hardware"): the device a run's
trainer gets from the composition root, for each kind of run, with and without a visible GPU."""

from __future__ import annotations

import pytest
import torch

from pgcli.training.build import prepare_process
from pgcli.training.checks import train_config


@pytest.mark.parametrize(
    ("overrides", "on_gpu"),
    [
        (["env=minatar_breakout"], "cuda"),  # model=cnn on MinAtar frames (implied by the image env)
        (["env=pong", "algo=a2c"], "cuda"),  # the Nature CNN on Atari frames, SB3's A2C
        (["env=minatar_breakout", "algo=trpo"], "cuda"),  # pgcli's own trainer on frames
        (["env=addition", "algo=sft"], "cuda"),  # a text run
        (["env=cartpole"], "cpu"),  # MLPs on a vector observation stay on the CPU
    ],
)
def test_hardware_auto_puts_cnn_and_text_runs_on_a_visible_gpu(
    overrides: list[str], on_gpu: str, monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip("ale_py", reason="pgcli[pixels] is not installed")
    cfg = train_config(["hardware=auto", *overrides])
    threads = torch.get_num_threads()
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert prepare_process(cfg).type == on_gpu
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert prepare_process(cfg).type == "cpu"  # no GPU visible: every run on the CPU
    finally:
        torch.set_num_threads(threads)  # prepare_process sets hardware.torch_threads for the process
