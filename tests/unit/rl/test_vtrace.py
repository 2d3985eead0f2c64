"""V-trace against the paper's definition computed the slow way, sum by sum, in float64 Python."""

import math

import pytest
import torch

from gossiprl.rl.a2c import nstep_returns
from gossiprl.rl.vtrace import vtrace


def reference(log_rhos, discounts, rewards, values, rho_bar, c_bar, pg_rho_bar, lam):
    """Espeholt et al. 2018, eq. (1) and section 4.2, term by term for every s (no recursion):
    v_s = V_s + sum_{t=s}^{T-1} (prod_{k=s}^{t-1} gamma_k c_k) rho_t (r_t + gamma_t V_{t+1} - V_t),
    A_s = min(pg_rho_bar, pi/mu)_s (r_s + gamma_s v_{s+1} - V_s), with v_T = V_T."""
    T, N = len(rewards), len(rewards[0])
    ratio = [[math.exp(log_rhos[t][n]) for n in range(N)] for t in range(T)]
    vs = [[0.0] * N for _ in range(T + 1)]
    adv = [[0.0] * N for _ in range(T)]
    for n in range(N):
        vs[T][n] = values[T][n]
        for s in range(T):
            total = values[s][n]
            for t in range(s, T):
                weight = 1.0
                for k in range(s, t):
                    weight *= discounts[k][n] * lam * min(c_bar, ratio[k][n])
                rho = min(rho_bar, ratio[t][n])
                total += weight * rho * (rewards[t][n] + discounts[t][n] * values[t + 1][n] - values[t][n])
            vs[s][n] = total
        for s in range(T):
            adv[s][n] = min(pg_rho_bar, ratio[s][n]) * (rewards[s][n] + discounts[s][n] * vs[s + 1][n] - values[s][n])
    return vs[:T], adv


def fixed_data(seed=0, T=7, N=3):
    g = torch.Generator().manual_seed(seed)
    log_rhos = torch.randn(T, N, generator=g, dtype=torch.float64)  # ratios spread over ~0.1 to ~10
    dones = torch.rand(T, N, generator=g, dtype=torch.float64) < 0.2
    discounts = 0.9 * (~dones).double()
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T + 1, N, generator=g, dtype=torch.float64)
    return log_rhos, discounts, rewards, values


@pytest.mark.parametrize(
    "rho_bar,c_bar,pg_rho_bar,lam",
    [(1.0, 1.0, 1.0, 1.0), (2.0, 0.5, 1.5, 1.0), (1.0, 1.0, 1.0, 0.7), (math.inf, math.inf, math.inf, 1.0)],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_the_papers_sums(seed, rho_bar, c_bar, pg_rho_bar, lam):
    data = fixed_data(seed)
    assert data[1].eq(0).any(), "the data must hold an episode end"
    vs, adv = vtrace(*data, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lam=lam)
    ref_vs, ref_adv = reference(*(x.tolist() for x in data), rho_bar, c_bar, pg_rho_bar, lam)
    torch.testing.assert_close(vs, torch.tensor(ref_vs, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_on_policy_vtrace_is_the_n_step_return():
    log_rhos, discounts, rewards, values = fixed_data(2)
    dones = (discounts == 0).double()
    vs, adv = vtrace(torch.zeros_like(log_rhos), discounts, rewards, values)
    returns = nstep_returns(rewards, dones, values[-1], 0.9)
    assert torch.allclose(vs, returns, atol=1e-12)
    next_vs = torch.cat([returns[1:], values[-1:]])
    assert torch.allclose(adv, rewards + discounts * next_vs - values[:-1], atol=1e-12)


def test_truncation_caps_a_large_ratio():
    """One step, pi/mu = e^2: the TD error counts once (rho_bar 1), not 7.39 times."""
    values = torch.tensor([[1.0], [3.0]])
    vs, adv = vtrace(torch.tensor([[2.0]]), torch.tensor([[0.5]]), torch.tensor([[1.0]]), values)
    assert vs.item() == pytest.approx(1.0 + (1.0 + 0.5 * 3.0 - 1.0))
    assert adv.item() == pytest.approx(1.0 + 0.5 * 3.0 - 1.0)
