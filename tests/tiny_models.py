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


ISSUE_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 +-=*/.,;:|$()[]{}'\"\n_<>?!#"


def build_issue_model(folder: Path, family: str = "llama", seed: int = 7, max_positions: int = 512) -> Path:
    """The random models that issue reproducers name (``../shared/tools/make_tiny_model.py FOLDER FAMILY
    SEED`` builds the same weights): a character vocabulary without a BOS post-processor, hidden 96,
    3 layers, 6 query heads over 2 key/value heads, every weight multiplied by 3 (peaked logits)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    specials = ["<pad>", "<s>", "</s>", "<mask>"]
    vocab = {t: i for i, t in enumerate(specials + list(ISSUE_ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   mask_token="<mask>", unk_token="?")
    shape = dict(vocab_size=len(vocab), hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                 num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=max_positions,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        config = LlamaConfig(**shape, rope_theta=10000.0, tie_word_embeddings=False)
        model_class = LlamaForCausalLM
    elif family == "qwen3":
        config = Qwen3Config(**shape, head_dim=16, rope_theta=500000.0, tie_word_embeddings=True)
        model_class = Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown family {family!r}: llama or qwen3")
    config.mask_token_id = vocab["<mask>"]
    model = model_class(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder
