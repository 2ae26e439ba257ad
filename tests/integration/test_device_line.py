"""Where a run computes, said through the real `pgcli` (issue 34): the device and dtype in the start line, the summary
and train.log, with a note where the choice is known to be slow (a half-precision `model.dtype` on the CPU,
`hardware=auto` that found no GPU for a text run)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import run_pgcli

SMALL = [
    "env.n_digits=2",
    "env.n_eval=8",
    "env.eval_pass_k=1",
    "env.eval_samples=2",
    "progress=false",
    "tracking=off",
    "total_steps=16",
    "eval.every=0",
    "algo.batch_size=8",
    "algo.warmup_steps=0",
    "checkpoint_every=0",
]


def test_a_bfloat16_text_run_on_hardware_auto_names_its_device_and_dtype_and_says_why_it_is_slow(
    tiny_hf_model: Path, tmp_path: Path
):
    run_dir = tmp_path / "run"
    args = ["sft", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "model.dtype=bfloat16", "hardware=auto"]
    proc = run_pgcli([*args, *SMALL, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    if torch.cuda.is_available():  # hardware=auto puts a text run on the GPU: nothing is slow
        device = f"cuda ({torch.cuda.get_device_name(0)}), bfloat16"
        assert "pgcli: note: hardware=auto" not in proc.stderr and "pgcli: note: model.dtype" not in proc.stderr
    else:
        device = "cpu, bfloat16"
        notes = [
            "pgcli: note: hardware=auto found no CUDA GPU (torch.cuda.is_available() is False): this text run trains "
            "on the CPU, slower than on a GPU",
            "pgcli: note: model.dtype=bfloat16 on the CPU is slower than float32 (bfloat16 about twice as slow); "
            "model.dtype=float32 trains faster here",
        ]
        for note in notes:
            assert f"{note}\n" in proc.stderr
            assert note.removeprefix("pgcli: note: ") in log
    assert f"pgcli: sft on addition (seed 0): {device}\n" in proc.stderr
    assert f"  device             {device}\n" in proc.stdout
    assert f"sft on addition (seed 0): {device}" in log and f"device             {device}" in log
