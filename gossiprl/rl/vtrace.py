"""V-trace (Espeholt et al. 2018, "IMPALA", section 4): value targets and policy-gradient
advantages for trajectories an older policy acted on.

IMPALA's actors act with the parameters they last received, mu, while the learner has moved on to
pi, so the learner's returns must be corrected for the difference. V-trace weighs each TD error
by the truncated importance ratio rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)) and cuts the
trace of later errors by c_i = lambda min(c_bar, pi / mu):

    v_s = V(x_s) + sum_{t >= s} (prod_{k=s}^{t-1} gamma_k c_k) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))

computed backwards as v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})) (the paper's
Remark 1). rho_bar sets which value function v converges to (that of a policy between mu and pi;
pi itself for rho_bar = inf), c_bar how fast; both are 1 in the paper's experiments. On-policy
(pi = mu) with lambda = 1, v_s is the n-step return. The learner that uses it is ``impala``, its
actors ``actors``.
"""

from __future__ import annotations

import torch


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The V-trace targets v_s and the policy-gradient advantages rho_s (r_s + gamma_s v_{s+1} - V(x_s)).

    log_rhos: (T, N), log pi(a_t|x_t) - log mu(a_t|x_t) of the actions taken. discounts: (T, N),
    gamma where the episode went on after step t and 0 where it ended, so nothing crosses an
    episode's end. rewards: (T, N). values: (T + 1, N), V(x_t) under the learner's network, the
    last row the bootstrap value. The policy gradient's ratio is truncated at pg_rho_bar (rho_bar
    in the paper). Both results are detached: they are targets, not paths for gradients.
    """
    with torch.no_grad():
        rhos = log_rhos.exp()
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = lam * rhos.clamp(max=c_bar)
        deltas = clipped_rhos * (rewards + discounts * values[1:] - values[:-1])
        vs_minus_v = torch.empty_like(rewards)
        running = torch.zeros_like(values[-1])
        for t in reversed(range(rewards.shape[0])):
            running = deltas[t] + discounts[t] * cs[t] * running
            vs_minus_v[t] = running
        vs = vs_minus_v + values[:-1]
        vs_next = torch.cat([vs[1:], values[-1:]])
        advantages = rhos.clamp(max=pg_rho_bar) * (rewards + discounts * vs_next - values[:-1])
    return vs, advantages
