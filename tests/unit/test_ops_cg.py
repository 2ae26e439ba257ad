"""Conjugate gradient against exact solves."""

import pytest
import torch

from pgcli.ops.cg import conjugate_gradient


def test_cg_solves_random_spd_system():
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(20, 20, generator=gen, dtype=torch.float64)
    a = m @ m.T + 0.5 * torch.eye(20, dtype=torch.float64)
    b = torch.randn(20, generator=gen, dtype=torch.float64)
    x, residual = conjugate_gradient(lambda v: a @ v, b, n_iters=100)
    assert torch.allclose(x, torch.linalg.solve(a, b), atol=1e-6)
    assert residual < 1e-10


def test_cg_2x2_exact_in_two_iterations():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    n_calls = 0

    def matvec(v: torch.Tensor) -> torch.Tensor:
        nonlocal n_calls
        n_calls += 1
        return a @ v

    # one step: r0 = p0 = b, A p0 = [6, 7], alpha = 5 / 20, x1 = [0.25, 0.5], r1 = [-0.5, 0.25], |r1|^2 = 0.3125
    x1, res1 = conjugate_gradient(matvec, b, n_iters=1)
    assert torch.allclose(x1, torch.tensor([0.25, 0.5], dtype=torch.float64))
    assert res1 == pytest.approx(0.3125)
    # A^-1 b = [[3, -1], [-1, 4]] / 11 @ [1, 2] = [1/11, 7/11]; converged after 2 matvecs, then stops early
    n_calls = 0
    x, res = conjugate_gradient(matvec, b, n_iters=10)
    assert torch.allclose(x, torch.tensor([1 / 11, 7 / 11], dtype=torch.float64), atol=1e-12)
    assert res < 1e-20
    assert n_calls == 2


def test_cg_zero_rhs_returns_zero_without_matvec():
    x, res = conjugate_gradient(lambda v: pytest.fail("matvec called"), torch.zeros(3), n_iters=5)
    assert torch.equal(x, torch.zeros(3)) and res == 0.0


def test_cg_bad_inputs_raise():
    with pytest.raises(ValueError, match="1-D"):
        conjugate_gradient(lambda v: v, torch.ones(2, 2), n_iters=3)
    with pytest.raises(ValueError, match="n_iters"):
        conjugate_gradient(lambda v: v, torch.ones(2), n_iters=-1)
    with pytest.raises(ValueError, match="matvec"):
        conjugate_gradient(lambda v: v[:1], torch.ones(2), n_iters=3)
