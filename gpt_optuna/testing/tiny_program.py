"""A tiny PyTorch program saved as a ``.pt2``: what the inductor engine is tried on."""

from __future__ import annotations

from pathlib import Path


def tiny_program(path: Path) -> Path:
    """A seeded two-layer network on a [4, 16] input, exported and saved at ``path``."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    torch.export.save(torch.export.export(model, (torch.randn(4, 16),)), str(path))
    return path
