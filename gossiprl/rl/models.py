"""Actor-critic networks for A2C, and the flat parameter buffer that gossip mixes.

The Atari network is the Nature CNN that GALA and PALA use (1,687,719 parameters for six
actions, 6.75 MB in fp32), so message sizes and timings match the papers. Vector
observations (CartPole and friends) get the small tanh MLP that CleanRL and Stable-Baselines3
use for A2C/PPO. MinAtar's 10x10xC boolean grids get the MinAtar paper's small CNN.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn


def layer_init(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights, zero bias: the A2C papers' init, which keeps early logits near
    uniform (gain 0.01 on the policy head) so exploration does not collapse in the first updates."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class AtariActorCritic(nn.Module):
    """Nature CNN with a shared trunk and two linear heads.

    Takes the raw uint8 frame stack (B, 4, 84, 84) and scales it inside, so the rollout
    buffer and any message stay uint8 (4x smaller than float frames).
    """

    def __init__(self, num_actions: int, in_channels: int = 4):
        super().__init__()
        relu_gain = math.sqrt(2)
        self.trunk = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4), relu_gain),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2), relu_gain),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1), relu_gain),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512), relu_gain),
            nn.ReLU(),
        )
        self.policy = layer_init(nn.Linear(512, num_actions), 0.01)
        self.value = layer_init(nn.Linear(512, 1), 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(obs.float() / 255.0)
        return self.policy(hidden), self.value(hidden).squeeze(-1)


class MinAtarActorCritic(nn.Module):
    """The network of the MinAtar paper (Young & Tian, 2019): one 3x3 conv with 16 channels,
    then 128 hidden units, with a policy and a value head.

    Takes MinAtar's (B, 10, 10, C) boolean grid channels-last, as the env gives it, and moves
    channels first inside, so rollouts and messages keep the 1-byte observations.
    """

    def __init__(self, in_channels: int, num_actions: int, size: int = 10):
        super().__init__()
        relu_gain = math.sqrt(2)
        self.trunk = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 16, 3, stride=1), relu_gain),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(16 * (size - 2) ** 2, 128), relu_gain),
            nn.ReLU(),
        )
        self.policy = layer_init(nn.Linear(128, num_actions), 0.01)
        self.value = layer_init(nn.Linear(128, 1), 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(obs.permute(0, 3, 1, 2).float())
        return self.policy(hidden), self.value(hidden).squeeze(-1)


class MLPActorCritic(nn.Module):
    """Separate actor and critic MLPs (two tanh layers each).

    Separate, not shared, because on small control tasks the value loss otherwise drags
    the policy's features around; this is the layout CleanRL and SB3 use for vector inputs.
    """

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64):
        super().__init__()
        gain = math.sqrt(2)
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden), gain),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden), gain),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, num_actions), 0.01),
        )
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden), gain),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden), gain),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, 1), 1.0),
        )

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = obs.flatten(1).float()
        return self.actor(obs), self.critic(obs).squeeze(-1)


def make_model(obs_space: gym.Space, action_space: gym.Space) -> nn.Module:
    """Pick the network from the (single-env) spaces: uint8 image stacks get the Nature CNN,
    MinAtar's boolean (10, 10, C) grids its paper's small CNN, anything else with a Box
    observation the MLP. A2C here is categorical only."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"A2C here needs a Discrete action space, got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"expected a Box observation space, got {obs_space}")
    num_actions = int(action_space.n)
    if obs_space.dtype == "uint8" and len(obs_space.shape) == 3:
        return AtariActorCritic(num_actions, in_channels=obs_space.shape[0])
    if obs_space.dtype == bool and len(obs_space.shape) == 3 and obs_space.shape[0] == obs_space.shape[1]:
        return MinAtarActorCritic(obs_space.shape[2], num_actions, size=obs_space.shape[0])
    return MLPActorCritic(math.prod(obs_space.shape), num_actions)


def flatten_parameters(module: nn.Module) -> torch.Tensor:
    """Move every parameter into one contiguous tensor and make each parameter a view of it.

    Gossip then publishes and mixes a single buffer in place (one memcpy / one message frame
    instead of one per layer), and the module and its optimizer see the mixed values at once
    because they share its storage. Call it after ``module.to(device)``: ``.to`` allocates
    fresh parameter storage and would silently cut the views.
    """
    params = list(module.parameters())
    if not params:
        raise ValueError("module has no parameters to flatten")
    device, dtype = params[0].device, params[0].dtype
    if any(p.device != device or p.dtype != dtype for p in params):
        raise ValueError("all parameters must share one device and dtype to live in one flat tensor")
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        offset += n
    return flat
