"""Backtracking line search: trust-region acceptance, backtrack counting and exact restoration."""

import math

import pytest
import torch
from torch import nn

from pgcli.ops.linesearch import backtracking_line_search


def scalar_param(value: float = 0.0) -> nn.Parameter:
    return nn.Parameter(torch.tensor([value], dtype=torch.float64))


def test_accepts_full_step_when_fine():
    p = scalar_param()
    result = backtracking_line_search(
        [p],
        torch.tensor([1.0], dtype=torch.float64),
        lambda: (p.item(), 0.5 * p.item() ** 2),
        backtrack_coeff=0.5,
        max_backtracks=10,
        max_kl=1.0,
        old_objective=0.0,
    )
    assert result == (True, 1.0, 0, 1.0, 0.5)
    assert p.item() == 1.0


def test_backtracks_until_kl_within_radius():
    p = scalar_param()
    seen: list[tuple[float, float]] = []

    def evaluate() -> tuple[float, float]:
        seen.append((p.item(), p.item() ** 2))  # objective grows with the step, KL = p^2
        return seen[-1]

    result = backtracking_line_search(
        [p],
        torch.tensor([1.0], dtype=torch.float64),
        evaluate,
        backtrack_coeff=0.5,
        max_backtracks=10,
        max_kl=0.01,
        old_objective=0.0,
    )
    # fractions 1, 1/2, 1/4, 1/8 give KL 1, .25, .0625, .015625 > 0.01; 1/16 gives 0.00390625
    assert [kl for _, kl in seen] == [1.0, 0.25, 0.0625, 0.015625, 0.00390625]
    assert result == (True, 0.0625, 4, 0.0625, 0.00390625)
    assert p.item() == 0.0625


def test_never_accepts_kl_above_max_and_restores_params_bit_exactly():
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    params = list(net.parameters())
    before = [q.detach().clone() for q in params]
    n_calls = 0

    def evaluate() -> tuple[float, float]:  # always improves, but the KL never fits in the radius
        nonlocal n_calls
        n_calls += 1
        return 1.0, 0.02

    result = backtracking_line_search(
        params,
        torch.randn(15) * 0.1234567,
        evaluate,
        backtrack_coeff=0.8,
        max_backtracks=10,
        max_kl=0.01,
        old_objective=0.0,
    )
    assert result == (False, 0.0, 9, 0.0, 0.0)
    assert n_calls == 10
    assert all(torch.equal(q, b) for q, b in zip(params, before, strict=True))


def test_rejects_non_improving_and_non_finite_steps():
    p = scalar_param()
    objectives = iter([math.nan, 0.0, -1.0, 0.5])  # nan, no improvement, worse, better
    result = backtracking_line_search(
        [p],
        torch.tensor([1.0], dtype=torch.float64),
        lambda: (next(objectives), 0.0),
        backtrack_coeff=0.5,
        max_backtracks=10,
        max_kl=0.01,
        old_objective=0.0,
    )
    assert result == (True, 0.125, 3, 0.5, 0.0)
    assert p.item() == 0.125


def test_expected_improve_enforces_armijo_ratio():
    def run(expected_improve: float | None):
        p = scalar_param()
        # objective p - 0.95 p^2: full step improves by 0.05 (< 0.1 * 1.0 expected); half step by 0.2625 (> 0.05)
        return backtracking_line_search(
            [p],
            torch.tensor([1.0], dtype=torch.float64),
            lambda: (p.item() - 0.95 * p.item() ** 2, 0.0),
            expected_improve=expected_improve,
            backtrack_coeff=0.5,
            max_backtracks=10,
            max_kl=0.01,
            old_objective=0.0,
        )

    assert run(None).n_backtracks == 0
    assert run(1.0)[:3] == (True, 0.5, 1)


def test_bad_arguments_raise():
    p = scalar_param()
    kwargs = {"max_kl": 0.01, "old_objective": 0.0}
    with pytest.raises(ValueError, match="full_step"):
        backtracking_line_search(
            [p], torch.zeros(2), lambda: (0.0, 0.0), backtrack_coeff=0.5, max_backtracks=3, **kwargs
        )
    with pytest.raises(ValueError, match="backtrack_coeff"):
        backtracking_line_search(
            [p], torch.zeros(1), lambda: (0.0, 0.0), backtrack_coeff=1.0, max_backtracks=3, **kwargs
        )
    with pytest.raises(ValueError, match="max_backtracks"):
        backtracking_line_search(
            [p], torch.zeros(1), lambda: (0.0, 0.0), backtrack_coeff=0.5, max_backtracks=0, **kwargs
        )
