"""Small helpers shared by test modules."""

from __future__ import annotations

import torch


def perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Move every trainable weight off its init (LoRA B and the value head start at zero, so
    gradients of LoRA A and values would all be 0 at init)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
