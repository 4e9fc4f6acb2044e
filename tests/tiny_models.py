"""Tiny random Llama / Qwen3 checkpoints (char tokenizer, GQA: 4 heads over 2 KV heads), saved as
ordinary HF folders: the models every test decodes with. No downloaded weights."""
from __future__ import annotations

from pathlib import Path


def no_cache_block_logits(model, committed: list[int], block):
    """The reference of SBD's cache: one forward over committed + block (B=1, k), committed causal, the
    block bidirectional over all of it; the block's logits (1, k, V)."""
    import torch

    n, k = len(committed), block.shape[1]
    ids = torch.cat([torch.tensor([committed]), block], dim=1)
    allowed = torch.ones(n + k, n + k, dtype=torch.bool)
    allowed[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    allowed[:n, n:] = False
    mask = torch.zeros(n + k, n + k).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(n + k)[None]).logits[:, n:]


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


# Chat templates as published models write them (trimmed to what matters here): Llama-3's, whose
# generation prompt ends in "\n\n", and ChatML (Qwen2/3), whose ends in "\n".
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
                   "{{ m['content'] }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n"
                   "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BPE_CORPUS = ["hello world, how are you?", "Say hi.", "what is 12 plus 30? It is 42.", "The cat sat on the mat.\n\n",
              "be brief\n\nyes\n\nno", "Answer: 7\n\nQuestion: 3+4?", "count to five: one two three four five"]


def build_bpe_chat_model(folder: Path, style: str = "llama3", spare_rows: int = 0, rows_multiple: int = 1,
                         seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """A look-alike of a published chat model (../shared/STACK.md, 'Published tokenizers'): a byte-level
    BPE trained here with the GPT-2 split pattern (the ByteLevel default), no mask token, and random
    weights whose embedding has ``spare_rows`` rows past the tokenizer, rounded up to a multiple of
    ``rows_multiple`` (as Llama and Qwen pad theirs). ``style``: "llama3" (Llama
    3's special tokens, a BOS added to every text, pad-less, EOS <|eot_id|>, its template: the
    generation prompt ends in "\\n\\n", one token at the end of a text and two before a word) on a
    Llama; "chatml" (Qwen's: no BOS, EOS <|im_end|>, pad <|endoftext|>) on a Qwen3."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    if style == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        names = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        template = LLAMA3_TEMPLATE
    elif style == "chatml":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        names = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
        template = CHATML_TEMPLATE
    else:
        raise ValueError(f"unknown style {style!r}: llama3 or chatml")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(BPE_CORPUS * 20, trainer=trainer)
    if style == "llama3":
        bos = names["bos_token"]
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tk.token_to_id(bos))])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, **names)
    tok.chat_template = template
    shape = dict(vocab_size=-(-(len(tok) + spare_rows) // rows_multiple) * rows_multiple, hidden_size=hidden, intermediate_size=2 * hidden,
                 num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if style == "llama3":
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=hidden // 4, tie_word_embeddings=True))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# Nemotron-Labs-Diffusion as published (docs/models.md, its sources): the 8B
# config.json's fields, scaled down; a Ministral-3 backbone stored as encoder.* plus diffusion_head.weight;
# mask 100, eos 11 (<|im_end|>), block 32, YaRN rope with the Llama-4 query scaling; an auto_map to remote
# code that must never run.
NLD_CONFIG = {
    "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
    "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                 "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
    "block_size": 32, "mask_token_id": 100, "bos_token_id": 1, "eos_token_id": 11, "dlm_paradigm": "bidirectional",
    "ar_loss_weight": 1.0, "dlm_loss_weight": None, "dp_varying_mask_ratio": False, "tie_word_embeddings": False,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "max_position_embeddings": 262144, "attn_implementation": "sdpa",
    "use_cache": False, "transformers_version": "5.0.0", "torch_dtype": "bfloat16", "initializer_range": 0.02,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                        "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1},
}
NLD_SPECIALS = 128  # Tekken's first ids are control tokens (<unk>, <s>, </s>, ..., <SPECIAL_n>); NLD's are 1000
NLD_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n<think></think>{% endif %}")
TRAP = "raise RuntimeError('remote code of the checkpoint was imported')\n"


def build_nld_model(folder: Path, seed: int = 0, hidden: int = 64, layers: int = 2, trap: bool = True,
                    sharpen: float = 8.0) -> Path:
    """A random model in Nemotron-Labs-Diffusion's published shape and names. ``trap``: the files its
    auto_map names exist and raise (and leave ``TRAP_RAN``) when imported. Returns the folder; the same
    weights in the stock class's names are ``reference_nld_model(folder)``."""
    import json

    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Ministral3Config, Ministral3ForCausalLM, PreTrainedTokenizerFast

    names = {0: "<unk>", 1: "<s>", 2: "</s>", 10: "<|im_start|>", 11: "<|im_end|>", 12: "<think>", 13: "</think>"}
    specials = [names.get(i, f"<SPECIAL_{i}>") for i in range(NLD_SPECIALS)]
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=NLD_SPECIALS + 300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(BPE_CORPUS * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = NLD_TEMPLATE  # no mask_token declared: the mask id is the config's (100)
    fields = {k: v for k, v in NLD_CONFIG.items() if k not in ("architectures", "auto_map", "model_type",
                                                                 "transformers_version", "torch_dtype",
                                                                 "attn_implementation")}
    config = Ministral3Config(**{**fields, "vocab_size": 512, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                                 "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": hidden // 4})
    torch.manual_seed(seed)
    model = Ministral3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)  # fewer near-ties than the 0.02-std init
        model.get_input_embeddings().weight[100].zero_()
    state = {("diffusion_head." + k[len("lm_head."):]) if k.startswith("lm_head.") else "encoder." + k[len("model."):]:
             v.contiguous() for k, v in model.state_dict().items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(folder)
    shape = {"vocab_size": 512, "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": hidden // 4}
    (folder / "config.json").write_text(json.dumps({**NLD_CONFIG, **shape}, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [11]}))
    if trap:
        for module in ("configuration_nemotron_labs_diffusion", "modeling_nemotron_labs_diffusion"):
            (folder / f"{module}.py").write_text(f"open({str(folder / 'TRAP_RAN')!r}, 'w').close()\n" + TRAP)
    return folder


def reference_nld_model(folder: Path):
    """The same weights loaded by hand into the stock class (the names renamed here, not by the loader)."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import Ministral3Config, Ministral3ForCausalLM

    fields = json.loads((Path(folder) / "config.json").read_text())
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "auto_map", "model_type",
                                                             "transformers_version", "torch_dtype",
                                                             "attn_implementation")}
    model = Ministral3ForCausalLM(Ministral3Config(**fields))
    state = load_file(str(Path(folder) / "model.safetensors"))
    renamed = {("lm_head." + k[len("diffusion_head."):]) if k.startswith("diffusion_head.") else
               "model." + k[len("encoder."):]: v for k, v in state.items()}
    model.load_state_dict(renamed, strict=True)
    return model.eval().to(torch.float32)


# SDAR (JetAstra/SDAR training/model/SDAR-4B-Chat/config.json at c2041a8, scaled down) and Fast-dLLM v2
# (Efficient-Large-Model/Fast_dLLM_v2_7B config.json, refs/pr/3, as docs/models.md reads it): Qwen3 and Qwen2 backbones under their own model_type and an auto_map to remote code.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _qwen_like_tokenizer(extra: list[str], mask_token: str | None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=QWEN_SPECIALS + extra,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(BPE_CORPUS * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=extra, **({"mask_token": mask_token} if mask_token else {}))
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_block_diffusion_model(folder: Path, family: str, seed: int = 0, hidden: int = 64, layers: int = 2,
                                block: int | None = None, sharpen: float = 8.0) -> Path:
    """A random checkpoint in SDAR's (``family="sdar"``) or Fast-dLLM v2's (``"fast_dllm_v2"``) published
    shape and conventions: the backbone's stock tensor names, its own model_type and an auto_map whose files
    raise when imported (and leave TRAP_RAN), the mask token as the family declares it (SDAR: the
    tokenizer's mask_token and config.mask_token_id; Fast-dLLM v2: only the added token |<MASK>|)."""
    import json

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shape = dict(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(seed)
    if family == "sdar":
        tok = _qwen_like_tokenizer(["<|MASK|>"], "<|MASK|>")
        ids = tok.get_vocab()
        model = Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=hidden // 4, rope_theta=1000000.0))
        fields = {"architectures": ["SDARForCausalLM"], "model_type": "sdar",
                  "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                               "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
                  "attn_implementation": "flex_attention", "block_size": block or 4, "mask_token_id": ids["<|MASK|>"],
                  "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"], "head_dim": hidden // 4,
                  "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                  "fuse_cross_entropy": True, "use_cache": False, "torch_dtype": "bfloat16",
                  "transformers_version": "4.52.4", "use_sliding_window": False, "sliding_window": None, **shape}
        generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                      "pad_token_id": ids["<|endoftext|>"], "do_sample": True, "temperature": 0.6}
        traps = ("configuration_sdar", "modeling_sdar")
        mask = ids["<|MASK|>"]
    elif family == "fast_dllm_v2":
        tok = _qwen_like_tokenizer(["|<MASK>|"], None)
        ids = tok.get_vocab()
        model = Qwen2ForCausalLM(Qwen2Config(**shape, rope_theta=1000000.0))
        fields = {"architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen",
                  "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                               "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
                  "bd_size": block or 16, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
                  "pad_token_id": ids["<|im_end|>"], "hidden_act": "silu", "rms_norm_eps": 1e-06,
                  "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "transformers_version": "4.53.1",
                  "use_cache": True, "use_sliding_window": False, **shape}
        generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}
        traps = ("configuration", "modeling")
        mask = ids["|<MASK>|"]
    else:
        raise ValueError(f"unknown family {family!r}: sdar or fast_dllm_v2")
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
        model.get_input_embeddings().weight[mask].zero_()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(fields, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation))
    for module in traps:
        (folder / f"{module}.py").write_text(f"open({str(folder / 'TRAP_RAN')!r}, 'w').close()\n" + TRAP)
    return folder
