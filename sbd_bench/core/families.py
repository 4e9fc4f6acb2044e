"""Model families: what a checkpoint folder is, read from its ``config.json`` alone, and how its
weights load into a stock transformers class. One table, so that a new family is one entry.

    >>> family = detect_family(Path("models/sbd-tiny"))       # reads config.json (and sbd_family.json)
    >>> family.name, family.next_token
    ('sbd', True)

A family never runs the checkpoint's own (remote) code: its config fields become the stock config
class's, its tensor names are renamed onto the stock class's (``key_mapping``), and what the loader
would otherwise ask of remote code (the mask id, the stops, the block size the model was trained with)
is read from the folder's JSON files. Sources for every entry: docs/models.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..types import UsageError

FAMILY_FILE = "sbd_family.json"  # {"family": "NAME"}: a user's override, when config.json says another


class FamilyError(UsageError):
    """The folder's family cannot be decoded here; the message says which and why."""


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    model_types: tuple[str, ...] = ()  # config.json "model_type" values that name this family
    # the stock transformers classes the weights load into; None: the Auto classes resolve config.json
    config_class: str | None = None
    model_class: str | None = None
    key_mapping: dict[str, str] = field(default_factory=dict)  # checkpoint tensor name (regex) -> stock name
    mask_from_config: bool = False  # the config's mask_token_id first (the tokenizer may not declare one)
    block_size_field: str | None = None  # the config field holding the block size the model was trained with
    # the weights are an exact next-token model under causal attention: ntp, verify=on and the hf_*
    # baselines mean what they say (SBD's defining property; NLD's AR loss)
    next_token: bool = True
    logit_shift: bool = False  # slot i is read from query i-1 (Fast-dLLM v2); SBD reads slot i at i
    # blocks at multiples of the block size from position 0, each block (the prompt's too) bidirectional
    # within itself: decoded by core/aligned.py (SDAR, Fast-dLLM v2); SBD's blocks start where the prompt ends
    aligned: bool = False
    # how a finished block's keys and values are written: "fused" into the next block's first forward
    # (SBD, SDAR), or "forward", one of its own whose last logit gives the next block's first token (Fast-dLLM v2)
    commit: str = "fused"
    sub_block: int | None = None  # slots revealed left to right in windows of this many (Fast-dLLM v2: 8)
    mask_token: str | None = None  # the mask's text, where neither tokenizer nor config names its id
    supported: bool = True
    reason: str = ""  # why a recognised family is refused
    source: str = ""  # where its facts come from (docs/models.md has the rows)


# config.json fields that describe the checkpoint's own code, not the architecture: dropped before the
# fields become a stock config (keeping "auto_map" would point transformers at remote code)
NOT_CONFIG_FIELDS = ("architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
                     "attn_implementation", "_name_or_path")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("sbd", "an SBD-fine-tuned causal LM in a stock transformers class (Llama, Qwen, ...): the default",
           source="SBD (arXiv 2509.04185); the folders `train` writes"),
    Family("nemotron_labs_diffusion",
           "NVIDIA Nemotron-Labs-Diffusion 3B/8B/14B: a Ministral-3 backbone trained with SBD's layout "
           "(sbd_block_diff); loads into Ministral3ForCausalLM",
           model_types=("nemotron_labs_diffusion",), config_class="Ministral3Config",
           model_class="Ministral3ForCausalLM",
           key_mapping={r"^encoder\.": "model.", r"^diffusion_head\.": "lm_head."},
           mask_from_config=True, block_size_field="block_size",
           source="arXiv 2607.05722; the HF remote code's NemotronLabsDiffusionModel (docs/models.md)"),
    # recognised, refused: no stock class, no causal LM, or no exact cache
    Family("sdar", "JetAstra SDAR 1.7B-8B / TraDo 4B-8B (Qwen3, block 4; b8-b64 variants): blocks aligned, "
           "same-position logits; loads into Qwen3ForCausalLM",
           model_types=("sdar",), config_class="Qwen3Config", model_class="Qwen3ForCausalLM", mask_from_config=True,
           block_size_field="block_size", next_token=False, aligned=True, commit="fused",
           source="JetAstra/SDAR generate.py and training/model/SDAR-4B-Chat at c2041a8 (docs/models.md)"),
    Family("fast_dllm_v2", "NVlabs Fast-dLLM v2 1.5B/7B (Qwen2.5, block 32 in sub-blocks of 8): blocks aligned, "
           "shifted logits, a commit forward per block; loads into Qwen2ForCausalLM",
           model_types=("Fast_dLLM_Qwen",), config_class="Qwen2Config", model_class="Qwen2ForCausalLM",
           block_size_field="bd_size", next_token=False, logit_shift=True, aligned=True, commit="forward",
           sub_block=8, mask_token="|<MASK>|",
           source="NVlabs/Fast-dLLM v2/generation_functions.py at 6cf2722 (docs/models.md)"),
    Family("llada2", "inclusionAI LLaDA2.0/2.1 (MoE)", model_types=("llada2_moe",), next_token=False,
           supported=False, reason="no stock transformers class holds its MoE architecture and its own code "
           "does not import under transformers 5"),
    Family("bd3lm", "kuleshov-group BD3-LM (DiT)", model_types=("bd3lm",), next_token=False, supported=False,
           reason="a DiT with its own forward signature, not a causal LM; it generates unconditionally"),
    Family("llada", "GSAI LLaDA 8B (full-sequence diffusion)", model_types=("llada", "llada_moe"),
           next_token=False, supported=False,
           reason="every position attends to the masked future, so no exact KV cache of committed tokens exists"),
    Family("dream", "Dream 7B (full-sequence diffusion)", model_types=("Dream", "dream"), next_token=False,
           supported=False,
           reason="every position attends to the masked future, so no exact KV cache of committed tokens exists"),
)}
DEFAULT_FAMILY = "sbd"


def read_config(path: Path) -> dict:
    """``config.json`` as JSON, without transformers (which refuses a custom model_type)."""
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FamilyError(f"cannot read {path / 'config.json'}: {exc}; put back the config.json the weights were "
                          f"saved with") from exc
    if not isinstance(data, dict):
        raise FamilyError(f"{path / 'config.json'} is not a JSON object: put back the config.json the weights "
                          f"were saved with")
    return data


def family_by_name(name: str) -> Family:
    if name not in FAMILIES:
        raise FamilyError(f"unknown model family {name!r}: use one of {', '.join(FAMILIES)} (list --models)")
    return FAMILIES[name]


def detect_family(path: Path, config: dict | None = None) -> Family:
    """The folder's family: ``sbd_family.json`` when the user put one there, else config.json's
    ``model_type``; any model_type no family claims is the default (a stock class transformers knows)."""
    override = path / FAMILY_FILE
    if override.exists():
        try:
            name = json.loads(override.read_text(encoding="utf-8"))["family"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FamilyError(f"{override} must hold {{\"family\": \"NAME\"}} with NAME one of "
                              f"{', '.join(FAMILIES)}") from exc
        return family_by_name(str(name))
    model_type = (config if config is not None else read_config(path)).get("model_type")
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    return FAMILIES[DEFAULT_FAMILY]


def check_supported(family: Family, path: Path) -> None:
    if not family.supported:
        raise FamilyError(f"{path} is a {family.name} checkpoint ({family.description}), which sbd_bench does not "
                          f"decode: {family.reason} (docs/models.md lists the families it does)")


def stock_config(family: Family, fields: dict):
    """The stock config class of ``family`` built from config.json's fields (the checkpoint's own
    code fields dropped; fields the stock class does not know stay as attributes, as transformers keeps them)."""
    import warnings

    import transformers

    kept = {key: value for key, value in fields.items() if key not in NOT_CONFIG_FIELDS}
    with warnings.catch_warnings():  # a published config's older spellings (rope_scaling: null) are read as meant
        warnings.simplefilter("ignore", FutureWarning)
        return getattr(transformers, family.config_class)(**kept)


def trained_block_size(family: Family, config) -> int | None:
    value = getattr(config, family.block_size_field, None) if family.block_size_field else None
    return int(value) if isinstance(value, int) and value > 0 else None
