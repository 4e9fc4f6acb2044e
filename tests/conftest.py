"""Tiny models built from configs (no downloaded weights), saved as ordinary HF folders."""
from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model


def build_tiny(path, family: str = "llama", with_mask: bool = True, max_positions: int = 512, seed: int = 0):
    return build_tiny_model(path, family, seed=seed, max_positions=max_positions, with_mask=with_mask)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "llama": build_tiny(root / "llama", "llama"),
        "qwen3": build_tiny(root / "qwen3", "qwen3"),
        "nomask": build_tiny(root / "nomask", "llama", with_mask=False),
        "short": build_tiny(root / "short", "llama", max_positions=32),
    }


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one thread is several times faster than two that wait
    for each other; restored afterwards, so other test modules keep their setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
