"""Tiny random Llama / Qwen3 checkpoints (char tokenizer, GQA: 4 heads over 2 KV heads), saved as
ordinary HF folders: the models every test decodes with. No downloaded weights."""
from __future__ import annotations

from pathlib import Path


def build_tiny_model(folder: Path, family: str = "llama", seed: int = 0, max_positions: int = 256,
                     hidden: int = 32, layers: int = 2, alphabet: str | None = None, with_mask: bool = True,
                     sharpen: bool | float = False) -> Path:
    """``sharpen``: True multiplies the LM head by 25 (near-greedy logits), a number by that number."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from sbd_bench.training.tokenizer import char_tokenizer

    tok = char_tokenizer(alphabet, with_mask=with_mask) if alphabet else char_tokenizer(with_mask=with_mask)
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    if with_mask:
        ids["mask_token_id"] = tok.mask_token_id
    shape = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape, **ids))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=hidden // 4, **ids))
    else:
        raise ValueError(f"unknown family {family!r}: llama or qwen3")
    if sharpen:
        with torch.no_grad():  # sharper logits than the 0.02-std init: fewer near-ties, varied outputs
            model.lm_head.weight.mul_(25.0 if sharpen is True else float(sharpen))
            # a zero mask embedding lets block logits depend on the context, as in a trained SBD model
            model.get_input_embeddings().weight[tok.mask_token_id].zero_()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
