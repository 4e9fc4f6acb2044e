"""A character-level tokenizer saved as an ordinary ``tokenizer.json``: the vocabulary of the tiny
shipped models and of the tests. Every character of ``alphabet`` is one token; ``<bos>`` is added in
front of every encoded text.

    >>> tok = char_tokenizer("0123456789+=\\n ")
    >>> tok("1+1=")["input_ids"]        # [bos, '1', '+', '1', '=']
"""
from __future__ import annotations

import string

SPECIALS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
            "mask_token": "<|mask|>"}
DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET, with_mask: bool = True):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = {k: v for k, v in SPECIALS.items() if with_mask or k != "mask_token"}
    chars = list(dict.fromkeys(alphabet))  # keep order, drop repeats
    vocab = {tok: i for i, tok in enumerate(list(specials.values()) + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()  # characters join without spaces
    bos = SPECIALS["bos_token"]
    tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, **specials)
