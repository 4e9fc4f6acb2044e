"""The model a training run starts from: a tiny Llama from scratch (the shipped models' architecture,
character tokenizer), a local Hugging Face folder (``--base``), or a checkpoint's config (resume and
export). A tokenizer without a mask (or pad) token gets one, in a spare embedding row when the
model has one, else in a row the embeddings grow by (``embed_added_tokens``).

Optional LoRA (``--lora-rank R``, needs ``peft``: ``pip install 'sbd_bench[lora]'``): adapters of rank
R on every linear layer (alpha = 2R, no dropout) plus the mask token's embedding row, which SBD must
learn and which a base model has never trained; the rest is frozen. The export merges them.
"""
from __future__ import annotations

from pathlib import Path

from .config import TrainConfig, TrainError


def check_peft(cfg: TrainConfig) -> None:
    if not cfg.lora_rank:
        return
    try:
        import peft  # noqa: F401
    except ImportError:
        raise TrainError("--lora-rank needs peft, an optional extra: pip install 'sbd_bench[lora]' (or pip install "
                         "peft); without --lora-rank every weight trains") from None


def build_tokenizer(cfg: TrainConfig, source: Path | None, from_checkpoint: bool = False):
    """(tokenizer with a mask, pad and EOS token, the tokens added to it): what ``build_model`` gives,
    without loading any weights (the data is checked with it first)."""
    from transformers import AutoTokenizer

    from ..core.model import MASK_TOKEN
    from .tokenizer import char_tokenizer

    if source is None:
        tokenizer = char_tokenizer()
    else:
        if not from_checkpoint and not (source / "config.json").exists():
            raise TrainError(f"--base {source} has no config.json: give a local Hugging Face model folder")
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except Exception as exc:
            raise TrainError(f"cannot load the tokenizer in {source}: {str(exc).splitlines()[0][:200]}; "
                             f"give a local Hugging Face folder with config, weights and tokenizer") from exc
    added = {}
    if tokenizer.mask_token is None:
        added["mask_token"] = MASK_TOKEN
    if tokenizer.pad_token is None:
        added["pad_token"] = "<pad>"
    if tokenizer.eos_token is None:
        raise TrainError(f"the tokenizer in {source} has no EOS token: completions must end with one")
    if added:
        tokenizer.add_special_tokens(added)
    return tokenizer, list(added.values())


def context_length(cfg: TrainConfig, source: Path | None) -> int | None:
    """The model's max_position_embeddings, from its config alone (no weights load)."""
    if source is None:
        return cfg.max_positions
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception as exc:
        raise TrainError(f"cannot load the model in {source}: {str(exc).splitlines()[0][:200]}; "
                         f"give a local Hugging Face folder with config, weights and tokenizer") from exc
    return getattr(config, "max_position_embeddings", None)


def build_model(cfg: TrainConfig, source: Path | None, from_checkpoint: bool = False, log=None):
    """(model, tokenizer) in fp32 on the CPU. ``from_checkpoint``: ``source`` is a checkpoint folder
    (config and tokenizer only; the weights come from its shards). ``log`` is told where the tokens
    added to the tokenizer found their embedding rows (``embed_added_tokens``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    tokenizer, added = build_tokenizer(cfg, source, from_checkpoint)
    if from_checkpoint:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    elif source is None:
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
            max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = LlamaForCausalLM(config)
        added = []  # built for the tokenizer's size
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch.float32,
                                                         attn_implementation="sdpa")
        except Exception as exc:
            raise TrainError(f"cannot load the model in {source}: {str(exc).splitlines()[0][:200]}; "
                             f"give a local Hugging Face folder with config, weights and tokenizer") from exc
    if added:
        said = embed_added_tokens(model, tokenizer, added)
        if log is not None:
            log(said)
    model.config.mask_token_id = tokenizer.mask_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = tokenizer.bos_token_id
    if cfg.lora_rank:
        model = with_lora(model, cfg.lora_rank, tokenizer.mask_token_id)
    return model, tokenizer


def embed_added_tokens(model, tokenizer, added: list[str]) -> str:
    """Embedding rows for the tokens just added to the tokenizer (the mask token, a pad token), never
    fewer rows than the model has: a token whose id falls inside the embedding takes that spare row (a
    padded vocabulary: Qwen2/3 ship 151,936 rows for 151,669 tokens) and ``vocab_size`` is kept; only
    ids past the last row make it grow (``resize_token_embeddings``). Either way a new token's rows
    (input embedding, and LM head when untied) start as ``resize_token_embeddings`` starts the rows it
    adds (``mean_resizing``): the mean of the rows of the tokens the model already had, so a spare row,
    never trained, is not left as it was. Returns the line that says which happened."""
    import torch

    rows = model.get_input_embeddings().weight.shape[0]
    own = len(tokenizer) - len(added)  # the base tokenizer's tokens: ids 0..own-1
    ids = tokenizer.convert_tokens_to_ids(added)
    spare = [i for i in ids if i < rows]
    if len(tokenizer) > rows:  # transformers sets the new rows; a spare row below them is ours to set
        model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():
        for layer in {id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}.values():
            if spare:
                layer.weight[spare] = layer.weight[:own].mean(0, dtype=torch.float32).to(layer.weight.dtype)
            if getattr(layer, "bias", None) is not None and spare:
                layer.bias[spare] = layer.bias[:own].mean(dtype=torch.float32).to(layer.bias.dtype)
    named = ", ".join(f"{token} (id {i})" for token, i in zip(added, ids))
    if len(tokenizer) > rows:
        return (f"tokens: added {named}; the embeddings had no spare row for them ({rows} rows, {own} tokens) and "
                f"grew to {len(tokenizer)} rows (vocab_size {len(tokenizer)}), new rows set to the mean of the others")
    return (f"tokens: added {named} in spare rows of the embeddings ({rows} rows for {own} tokens; vocab_size kept), "
            f"set to the mean of the tokenizer's rows as for a new token")


def with_lora(model, rank: int, mask_token_id: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
                        trainable_token_indices=[mask_token_id])
    return get_peft_model(model, config)
