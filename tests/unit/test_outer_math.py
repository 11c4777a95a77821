"""Every outer method's update against the equations of docs/algorithms.md, on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from p2p_trainer.algo import outer


def _rand(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


SHAPES = ((3, 4), (5,))


def test_pseudo_grad_points_uphill() -> None:
    # A step of gradient descent from φ lands at θ = φ − lr·g: Δ = φ − θ must equal +lr·g.
    anchor = _rand(0, *SHAPES)
    grad = _rand(1, *SHAPES)
    fast = [a - 0.1 * g for a, g in zip(anchor, grad, strict=True)]
    for d, g in zip(outer.pseudo_grad(anchor, fast), grad, strict=True):
        torch.testing.assert_close(d, 0.1 * g)


def test_diloco_outer_step_equals_torch_sgd_nesterov() -> None:
    anchor, delta1, delta2 = _rand(0, *SHAPES), _rand(1, *SHAPES), _rand(2, *SHAPES)
    params = [torch.nn.Parameter(a.clone()) for a in anchor]
    sgd = torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)
    phi, m = list(anchor), [torch.zeros_like(a) for a in anchor]
    for delta in (delta1, delta2):  # two steps, so the momentum term is exercised
        for p, d in zip(params, delta, strict=True):
            p.grad = d.clone()
        sgd.step()
        phi, m = outer.nesterov_outer_step(phi, m, delta, outer_lr=0.7, outer_momentum=0.9)
    for p, x in zip(params, phi, strict=True):
        torch.testing.assert_close(p.detach(), x)


def test_diloco_step_by_hand() -> None:
    phi, m, d = [torch.tensor([1.0])], [torch.tensor([0.5])], [torch.tensor([0.2])]
    new_phi, new_m = outer.nesterov_outer_step(phi, m, d, outer_lr=0.7, outer_momentum=0.9)
    assert new_m[0].item() == pytest.approx(0.9 * 0.5 + 0.2)
    assert new_phi[0].item() == pytest.approx(1.0 - 0.7 * (0.2 + 0.9 * (0.9 * 0.5 + 0.2)))


def test_noloco_general_form_by_hand() -> None:
    phi, m = [torch.tensor([1.0])], [torch.tensor([0.2])]
    descent, mean_phi = [torch.tensor([-0.3])], [torch.tensor([1.4])]
    new_phi, new_m = outer.noloco_outer_step(phi, m, descent, mean_phi, 0.7, 0.5, gamma=0.2)
    expect_m = 0.5 * 0.2 + 0.7 * -0.3 + 0.2 * (1.4 - 1.0)
    assert new_m[0].item() == pytest.approx(expect_m)
    assert new_phi[0].item() == pytest.approx(1.0 + expect_m)


def test_noloco_gamma_equal_alpha_is_the_shortcut() -> None:
    # Two group members: mean_G(θ_j − φ_j) and mean_G(φ_j) versus mean_G(θ_j) alone.
    phis = [_rand(0, *SHAPES), _rand(1, *SHAPES)]
    thetas = [_rand(2, *SHAPES), _rand(3, *SHAPES)]
    m = _rand(4, *SHAPES)
    descent = outer.weighted_mean(
        [outer.pseudo_grad(t, p) for p, t in zip(phis, thetas, strict=True)], [1, 1]
    )
    mean_phi = outer.weighted_mean(phis, [1, 1])
    mean_theta = outer.weighted_mean(thetas, [1, 1])
    general = outer.noloco_outer_step(phis[0], m, descent, mean_phi, 0.7, 0.5, gamma=0.7)
    short = outer.noloco_shortcut_step(phis[0], m, mean_theta, 0.7, 0.5)
    for a, b in zip(general[0] + general[1], short[0] + short[1], strict=True):
        torch.testing.assert_close(a, b)


def test_noloco_gamma_zero_ignores_anchor_spread() -> None:
    phi, m = _rand(0, *SHAPES), _rand(1, *SHAPES)
    descent = _rand(2, *SHAPES)
    far = [p + 10 for p in phi]
    a = outer.noloco_outer_step(phi, m, descent, far, 0.7, 0.5, gamma=0.0)
    b = outer.noloco_outer_step(phi, m, descent, phi, 0.7, 0.5, gamma=0.0)
    for x, y in zip(a[0], b[0], strict=True):
        torch.testing.assert_close(x, y)


def test_factored_without_mix1_and_all_peer_mix2_is_diloco() -> None:
    # No Mix1 means φ̂ = φ; an all-peer Mix2 is the all-peer mean of Δ: exactly DiLoCo's inputs.
    n = 3
    phi = _rand(0, *SHAPES)  # identical anchors, as in DiLoCo
    thetas = [_rand(10 + i, *SHAPES) for i in range(n)]
    m = _rand(5, *SHAPES)
    deltas = [outer.pseudo_grad(phi, t) for t in thetas]
    mix2 = outer.weighted_mean(deltas, [1.0] * n)
    diloco = outer.nesterov_outer_step(phi, m, outer.weighted_mean(deltas, [1.0] * n), 0.7, 0.9)
    factored = outer.nesterov_outer_step(outer.weighted_mean([phi] * n, [1.0] * n), m, mix2, 0.7, 0.9)
    for a, b in zip(diloco[0], factored[0], strict=True):
        torch.testing.assert_close(a, b)


def test_group_of_one_is_identity() -> None:
    x = _rand(0, *SHAPES)
    for a, b in zip(outer.weighted_mean([x], [3.0]), x, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(outer.rda_mean([x], [3.0]), x, strict=True):
        torch.testing.assert_close(a, b)


def test_unequal_weights() -> None:
    a, b = [torch.tensor([0.0, 4.0])], [torch.tensor([3.0, 0.0])]
    (mean,) = outer.weighted_mean([a, b], [1.0, 2.0])
    torch.testing.assert_close(mean, torch.tensor([2.0, 4.0 / 3.0]))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_invalid_weights_are_rejected(bad: float) -> None:
    x = _rand(0, *SHAPES)
    with pytest.raises(ValueError, match="weight 1"):
        outer.weighted_mean([x, x], [1.0, bad])
    with pytest.raises(ValueError, match="weight 1"):
        outer.rda_mean([x, x], [1.0, bad])


def test_rda_keeps_the_norm_of_orthogonal_updates() -> None:
    a, b = [torch.tensor([3.0, 0.0])], [torch.tensor([0.0, 3.0])]
    (plain,) = outer.weighted_mean([a, b], [1.0, 1.0])
    (rda,) = outer.rda_mean([a, b], [1.0, 1.0])
    assert float(plain.norm()) == pytest.approx(3 / math.sqrt(2))
    assert float(rda.norm()) == pytest.approx(3.0)
    torch.testing.assert_close(rda / rda.norm(), plain / plain.norm())


def test_rda_weighted_radius() -> None:
    a, b = [torch.tensor([1.0, 0.0])], [torch.tensor([4.0, 0.0])]
    (rda,) = outer.rda_mean([a, b], [3.0, 1.0])
    torch.testing.assert_close(rda, torch.tensor([(3 * 1 + 1 * 4) / 4, 0.0]))


def test_consensus_distance() -> None:
    a, b = [torch.tensor([1.0, 0.0])], [torch.tensor([3.0, 0.0])]
    assert outer.consensus_distance([a, b]) == pytest.approx(1.0 / 2.0)
    assert outer.consensus_distance([a, a]) == 0.0


def test_math_does_not_mutate_inputs() -> None:
    phi, m, d = _rand(0, *SHAPES), _rand(1, *SHAPES), _rand(2, *SHAPES)
    before = [t.clone() for t in phi + m + d]
    outer.nesterov_outer_step(phi, m, d, 0.7, 0.9)
    outer.noloco_outer_step(phi, m, d, d, 0.7, 0.5, 0.7)
    outer.weighted_mean([phi, d], [1.0, 2.0])
    for x, y in zip(before, phi + m + d, strict=True):
        assert torch.equal(x, y)
