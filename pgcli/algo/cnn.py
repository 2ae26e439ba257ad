"""Convolutional torsos for image observations (``model=cnn``; docs/pixels.md): frames in, one feature vector out.

- :class:`NatureCNN` (Mnih et al., 2015, "Human-level control through deep reinforcement learning"): convolutions
  32x8x8 stride 4, 64x4x4 stride 2, 64x3x3 stride 1, then 512 linear units; ReLU. For 84x84 Atari frames.
- :class:`MinAtarCNN` (Young & Tian, 2019, "MinAtar"): one 16x3x3 convolution, then 128 linear units. For 10x10 frames.
- :class:`ImpalaCNN` (Espeholt et al., 2018, "IMPALA"): three stages of 16, 32, 32 channels, each a 3x3 convolution,
  a 3x3 stride-2 max-pool and two residual blocks; then 256 linear units.
- :class:`FlatTorso`: no convolution; the frame flattened into 256 linear units. With a 256-unit hidden layer in each
  head it is gymnax-blines' MinAtar network (two 256x256 ReLU MLPs on the flattened 10x10xC frame).

Frames are (C, H, W). A uint8 frame (pgcli's frames are uint8 in [0, 255] end to end) is scaled by 1/255 here, on the
device the torso runs on; a float frame is taken as scaled already (SB3 scales image observations itself).

:class:`CNNNet` puts an MLP head (``pgcli.algo.networks.MLP``) on a torso: the policy and value networks of pgcli's own
trainers on frames (``pgcli.algo.policies``), one torso shared by both or one each (``model.share_features``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pgcli.algo.networks import MLP
from pgcli.config.pixels import MIN_FRAME_SIZE

TORSO_GAIN = math.sqrt(2.0)
"""Orthogonal-init gain of the torso's convolutions and linear layer (SB3's ``ActorCriticPolicy`` with ortho_init)."""


def resolve_arch(arch: str, obs_shape: tuple[int, ...]) -> str:
    """The torso ``model.arch`` names for frames of ``obs_shape`` (C, H, W): 'auto' is nature for frames of 36 px or
    more, else minatar."""
    if arch != "auto":
        return arch
    return "nature" if min(obs_shape[1:]) >= MIN_FRAME_SIZE["nature"] else "minatar"


class Torso(nn.Module):
    """A CNN torso: ``forward(frames [B, C, H, W]) -> features [B, features_dim]``."""

    features_dim: int

    def __init__(self, convs: nn.Module, obs_shape: tuple[int, ...], features_dim: int) -> None:
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            n_flat = int(convs(torch.zeros(1, *obs_shape)).flatten(1).shape[1])
        linear = nn.Linear(n_flat, features_dim)
        self.head = nn.Sequential(nn.Flatten(), linear, nn.ReLU())
        self._linear = (linear,)  # a plain reference (a tuple is not registered a second time in the state dict)
        self.features_dim = features_dim

    def forward(self, frames: Tensor) -> Tensor:
        if frames.dim() != 4:
            raise ValueError(f"frames must be [B, C, H, W] (got shape {tuple(frames.shape)})")
        dtype = self._linear[0].weight.dtype  # float32, or float64 in the Fisher tests
        x = frames.to(dtype) / 255.0 if frames.dtype == torch.uint8 else frames.to(dtype)
        return self.head(self.convs(x))


class NatureCNN(Torso):
    """Mnih et al. (2015): three convolutions and 512 features."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
        )
        super().__init__(convs, obs_shape, 512)


class MinAtarCNN(Torso):
    """Young & Tian (2019): one 3x3 convolution of 16 channels and 128 features."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__(nn.Sequential(nn.Conv2d(obs_shape[0], 16, kernel_size=3, stride=1), nn.ReLU()), obs_shape, 128)


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(Torso):
    """Espeholt et al. (2018): three residual stages (16, 32, 32 channels) and 256 features."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        layers: list[nn.Module] = []
        channels = obs_shape[0]
        for out in (16, 32, 32):
            layers += [
                nn.Conv2d(channels, out, kernel_size=3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _Residual(out),
                _Residual(out),
            ]
            channels = out
        super().__init__(nn.Sequential(*layers, nn.ReLU()), obs_shape, 256)


class FlatTorso(Torso):
    """No convolution: the flattened frame into 256 features (an MLP's first layer)."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__(nn.Identity(), obs_shape, 256)


TORSOS: dict[str, Callable[[tuple[int, ...]], Torso]] = {
    "nature": NatureCNN,
    "minatar": MinAtarCNN,
    "impala": ImpalaCNN,
    "flat": FlatTorso,
}


def make_torso(arch: str, obs_shape: tuple[int, ...]) -> Torso:
    """The torso ``model.arch`` names (resolved by :func:`resolve_arch`) for frames of ``obs_shape`` (C, H, W)."""
    return TORSOS[resolve_arch(arch, obs_shape)](tuple(obs_shape))


def orthogonal_init(torso: Torso) -> Torso:
    """SB3's initialisation of a features extractor: orthogonal weights of gain sqrt(2), zero biases."""
    for module in torso.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(module.weight, gain=TORSO_GAIN)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return torso


class CNNNet(nn.Module):
    """A torso, then an MLP head: frames [B, C, H, W] (uint8) -> [B, out_dim].

    The torso may be another net's too (``model.share_features``): it is then one module in both, and its
    parameters are in both nets' ``parameters()``. No hand-written Jacobian (unlike :class:`MLP`): ``linearize`` and
    ``mse_grad_fn`` return None, so TRPO's Fisher-vector products and the critic's gradients take autograd.
    """

    obs_dtype = torch.uint8
    """The dtype observations are handed over in (frames stay uint8 until the torso scales them)."""

    def __init__(self, torso: Torso, head: MLP) -> None:
        super().__init__()
        self.torso = torso
        self.head = head
        """The MLP on the torso's ``features_dim`` features."""

    @property
    def device(self) -> torch.device:
        return self.head.device

    def forward(self, frames: Tensor) -> Tensor:
        """[B, C, H, W] -> [B, out_dim]."""
        return self.head(self.torso(frames))

    def linearize(self, frames: Tensor) -> None:
        """None: no explicit Jacobian through the convolutions (callers use autograd)."""
        return None

    def mse_grads(self, frames: Tensor, target: Tensor) -> tuple[Tensor, list[Tensor]]:
        """mean((f(frames) - target)^2) (detached) and its gradient per parameter, by autograd; target [B, out_dim]."""
        loss = F.mse_loss(self(frames), target)
        return loss.detach(), list(torch.autograd.grad(loss, list(self.parameters())))

    def mse_grad_fn(self) -> None:
        """None: no explicit backprop here (``pgcli.algo.rollout.fit_value`` uses :meth:`mse_grads`)."""
        return None
