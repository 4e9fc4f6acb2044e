"""Tiny models built from configs (no downloaded weights), saved as ordinary HF folders."""
from __future__ import annotations

import pytest
import torch

from sbd_bench.tokenizer import char_tokenizer


def build_tiny(path, family: str = "llama", with_mask: bool = True, max_positions: int = 512, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = char_tokenizer(with_mask=with_mask)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2,  # GQA: 2 query heads per KV head
                  max_position_embeddings=max_positions, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "llama": build_tiny(root / "llama", "llama"),
        "qwen3": build_tiny(root / "qwen3", "qwen3"),
        "nomask": build_tiny(root / "nomask", "llama", with_mask=False),
        "short": build_tiny(root / "short", "llama", max_positions=32),
    }
