"""Loading a local Hugging Face causal-LM folder for SBD decoding: tokenizer, mask token, device,
dtype and attention implementation. Nothing is ever fetched from a hub, and a checkpoint's own (remote)
code is never run: its family (core/families.py) says which stock class its weights load into.

    >>> lm = load_model("models/sbd-tiny")            # a shipped name or any local HF folder
    >>> lm.mask_token_id, lm.device, lm.dtype, lm.family.name
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..types import UsageError
from .families import DEFAULT_FAMILY, FAMILIES, Family, check_supported, detect_family, family_by_name, read_config, \
    stock_config, trained_block_size

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
DEFAULT_MODEL = "sbd-tiny"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASK_TOKEN = "<|mask|>"


class ModelError(UsageError):
    """The model folder cannot be used; the message says how to fix it."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    mask_token_id: int
    stop_token_ids: tuple[int, ...]
    path: str
    device: torch.device
    dtype: torch.dtype
    attn_implementation: str
    max_positions: int | None
    info: dict = field(default_factory=dict)
    exact: bool = False  # every row computed alone (core/exact.py): batch and row count change no bit
    family: Family = FAMILIES[DEFAULT_FAMILY]


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """A shipped model name ('sbd-tiny', 'ntp-tiny') or a folder path."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.is_file():
        holder = path.parent if (path.parent / "config.json").exists() else None
        raise ModelError(f"model '{name_or_path}' is a file, not a model folder: "
                         + (f"give the folder that holds it, {holder}" if holder else
                            "give a local Hugging Face folder (config.json + weights + tokenizer) or a shipped model "
                            f"name ({', '.join(shipped_models()) or 'none shipped'})"))
    shipped = MODELS_DIR / str(name_or_path)
    if shipped.is_dir():
        return shipped
    raise ModelError(
        f"model folder '{name_or_path}' does not exist: pass a local Hugging Face folder "
        f"(config.json + weights + tokenizer) or a shipped model name ({', '.join(shipped_models()) or 'none shipped'})"
    )


def check_model_folder(name_or_path: str | os.PathLike, family_name: str | None = None) -> tuple[Path, dict, Family]:
    """The folder, its config.json fields and its family (``family_name``, else the folder's own),
    refusing in one line before anything loads a folder that is not a model or whose family is not
    decoded here (the cheapest checks of a run)."""
    path = resolve_model_path(name_or_path)
    if not (path / "config.json").exists():
        raise ModelError(f"{path} has no config.json: it is not a Hugging Face model folder")
    config_fields = read_config(path)
    family = family_by_name(family_name) if family_name else detect_family(path, config_fields)
    check_supported(family, path)
    return path, config_fields, family


def shipped_models() -> list[str]:
    return sorted(p.name for p in MODELS_DIR.glob("*") if (p / "config.json").exists()) if MODELS_DIR.is_dir() else []


def pick_device(device: str) -> torch.device:
    """The one rule for ``--device`` (run, throughput, train): auto, cpu, mps, cuda or cuda:N."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):  # "tpu", "gpu", "meta", a typo
        raise ModelError(f"unknown --device {device!r}: use auto, cpu, cuda or cuda:N")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but torch sees no CUDA device: use --device cpu or auto")
    return torch.device(device)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` knows."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_clock(device: torch.device) -> float:
    """perf_counter once the device's queued work is done (CUDA runs asynchronously): decode timings'."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def device_name(device: torch.device) -> str:
    """What a record calls the machine that computed it: the GPU's name, or the CPU's."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def find_mask_token_id(tokenizer, config, config_first: bool = False) -> int | None:
    """The mask token: the tokenizer's mask_token, else ``config.mask_token_id`` (``config_first``: the
    other way round, for families whose tokenizer need not declare the mask the model was trained with)."""
    from_tokenizer = getattr(tokenizer, "mask_token_id", None)
    from_config = getattr(config, "mask_token_id", None)
    for value in ((from_config, from_tokenizer) if config_first else (from_tokenizer, from_config)):
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    return None


def stop_token_ids(tokenizer, config, generation_config: dict | None = None) -> tuple[int, ...]:
    """Every id that ends an answer: config.json's eos, the tokenizer's, and generation_config.json's
    (where chat models name their end-of-turn token)."""
    ids: set[int] = set()
    sources = (getattr(config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None),
               (generation_config or {}).get("eos_token_id"))
    for source in sources:
        if isinstance(source, int) and not isinstance(source, bool):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source if isinstance(i, int))
    return tuple(sorted(ids))


def read_generation_config(path: Path) -> dict:
    """generation_config.json as JSON ({} when absent or unreadable: it only adds stops)."""
    import json

    try:
        data = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# What a model folder may hold besides the model: its card and its training history (and state). They change
# without changing a single output, so they are not part of the model's identity.
NOT_THE_MODEL = ("*.md", "*.png", "training_args.json", "training_log.jsonl", "training_stages.jsonl",
                 "training_state.pt", "tokenized_data.pt", "checkpoint/*", "checkpoint.old/*", "checkpoint.tmp/*")


def folder_hash(path: Path) -> str:
    """sha256 over the folder's file names and contents (weights, config, tokenizer): the model's
    identity. The card and the training history (``NOT_THE_MODEL``) are left out."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not any(p.match(g) for g in NOT_THE_MODEL)):
        digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def one_line(exc: Exception, limit: int = 400) -> str:
    """An exception from a library as one line: its lines joined, cut at ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_weights(path: Path, family: Family | None = None, config=None, **kwargs) -> torch.nn.Module:
    """The model from ``path``'s weights, refusing in one line weights that do not fit the config:
    shapes that differ, or tensors missing (transformers would initialise those at random and say so
    only in a table of warnings). A family with a stock class loads into it, its tensors renamed by
    the family's ``key_mapping``; then a tensor left over is refused too. The load report
    (missing / unexpected counts) is on the model as ``sbd_load_report``."""
    import transformers
    from transformers.utils import logging as hf_logging

    family = family or FAMILIES[DEFAULT_FAMILY]
    loader = getattr(transformers, family.model_class or "AutoModelForCausalLM")
    if family.model_class:
        kwargs = {**kwargs, "config": config, "key_mapping": dict(family.key_mapping) or None}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report is a table of warnings; the one line below says it
    try:
        try:
            model, info = loader.from_pretrained(path, local_files_only=True, output_loading_info=True, **kwargs)
        except Exception as exc:
            if "ignore_mismatched_sizes" not in str(exc):
                raise ModelError(f"cannot load the weights in {path}: {one_line(exc)}") from exc
            model, info = loader.from_pretrained(path, local_files_only=True, output_loading_info=True,
                                                 ignore_mismatched_sizes=True, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    mismatched, missing = sorted(info.get("mismatched_keys") or ()), sorted(info.get("missing_keys") or ())
    if mismatched:
        key, saved, wanted = mismatched[0]
        raise ModelError(f"the weights in {path} do not match its config.json: {len(mismatched)} tensors differ in "
                         f"shape (e.g. {key} is {list(saved)} in the weights, config.json makes it {list(wanted)}); "
                         f"put back the config.json these weights were saved with")
    if missing:
        raise ModelError(f"the weights in {path} lack {len(missing)} tensors its config.json needs (e.g. {missing[0]}): "
                         f"they were saved from another architecture or cut short; put back the weights and "
                         f"config.json saved together")
    unexpected = sorted(info.get("unexpected_keys") or ())
    if family.model_class and unexpected:  # a renamed checkpoint with tensors the stock class has no place for
        raise ModelError(f"the weights in {path} hold {len(unexpected)} tensors {family.model_class} has no place for "
                         f"(e.g. {unexpected[0]}): it is not a {family.name} checkpoint as published; add "
                         f"{{\"family\": \"NAME\"}} in sbd_family.json if it is another family (list --models)")
    model.sbd_load_report = {"class": type(model).__name__, "missing": len(missing), "unexpected": len(unexpected)}
    return model


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    require_mask_token: bool = True,
    device_map: str | dict | None = None,
    exact: bool = False,
    family: str | None = None,
) -> LoadedModel:
    """``device_map`` ("auto", "balanced", or a dict): spread a model too large for one device over
    every visible GPU (then CPU) with accelerate, instead of moving it whole to ``device``. ``exact``:
    the model's modules wrapped and its attention replaced so that each row is computed alone
    (core/exact.py); ``attn_implementation`` is then exact.EXACT_ATTENTION."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress line is the only one on stderr

    # before anything loads: a refusal costs nothing; ``family``: a family name, else the folder's own
    path, config_fields, family = check_model_folder(name_or_path, family)
    dev = pick_device(device)
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif dtype in DTYPES:
        torch_dtype = DTYPES[dtype]
    else:
        raise ModelError(f"unknown --dtype '{dtype}': use auto, {', '.join(DTYPES)}")
    try:
        # trust_remote_code=False: a folder with an auto_map is refused, never asked about interactively
        config = (stock_config(family, config_fields) if family.config_class
                  else AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False))
    except Exception as exc:
        model_type = config_fields.get("model_type")
        if "custom code" in str(exc) or "trust_remote_code" in str(exc):
            raise ModelError(f"{path}'s config.json names model_type {model_type!r}, which needs the checkpoint's own "
                             f"code: sbd_bench never runs it, and no family it knows maps that type onto a stock "
                             f"class (list --models); if the folder is one of them, write {{\"family\": \"NAME\"}} "
                             f"into {path / 'sbd_family.json'}") from exc
        raise ModelError(f"cannot load the config in {path}: {one_line(exc)}") from exc
    tokenizer = _load_tokenizer(path)
    mask_id = find_mask_token_id(tokenizer, config, config_first=family.mask_from_config)
    if mask_id is None and family.mask_token and family.mask_token in tokenizer.get_vocab():
        mask_id = tokenizer.get_vocab()[family.mask_token]  # a family whose code hard-codes its mask's id
    if mask_id is None and require_mask_token:
        raise ModelError(
            f"{path} has no mask token (tokenizer.mask_token or config.mask_token_id): it is not an SBD model; "
            f"fine-tune it with `python -m sbd_bench train --base {path} --out DIR`, which adds one"
        )
    if exact:
        from . import exact as exact_mode

        if device_map is not None:
            raise ModelError("--exact runs the model on the CPU, one device: drop --device-map")
        exact_mode.check_exact(config, dev)  # before the weights load: a refusal costs nothing
        exact_mode.register_attention()
        attn_implementation = exact_mode.EXACT_ATTENTION
    placement = {}
    if device_map is not None:
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:
            raise ModelError("--device-map needs the accelerate package: pip install accelerate "
                             "(or drop --device-map to load the model on one device)")
        placement = {"device_map": device_map}
    model = _load_weights(path, family, config, dtype=torch_dtype, attn_implementation=attn_implementation,
                          **placement)
    if device_map is None:
        model.to(dev)
    else:  # inputs go where the embeddings are; accelerate's hooks move activations between devices
        dev = model.get_input_embeddings().weight.device
        if dev.type == "meta":  # embeddings offloaded: their hook runs them on the first GPU
            dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    model.eval()
    if exact:
        exact_mode.wrap_rows(model)
    max_pos = getattr(config, "max_position_embeddings", None)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        mask_token_id=mask_id if mask_id is not None else -1,
        stop_token_ids=stop_token_ids(tokenizer, config, read_generation_config(path)),
        path=str(path),
        device=dev,
        dtype=torch_dtype,
        attn_implementation=attn_implementation,
        max_positions=max_pos,
        info={"model_type": config.model_type, "num_parameters": sum(p.numel() for p in model.parameters()),
              **({"family": family.name, "trained_block_size": trained_block_size(family, config),
                  "load": model.sbd_load_report} if family.name != DEFAULT_FAMILY else {}),
              **({"device_map": {k: str(v) for k, v in (getattr(model, "hf_device_map", None) or {"": str(dev)}).items()}}
                 if device_map is not None else {})},
        exact=exact,
        family=family,
    )


def _load_tokenizer(path: Path):
    """The folder's tokenizer, never running code of the folder's (``trust_remote_code=False``): where
    its tokenizer_config.json names a class only remote code defines, the fast tokenizer that
    tokenizer.json describes, with the special tokens tokenizer_config.json declares."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    import warnings

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # it reads config.json too, and warns of a custom model_type it only peeks at
    try:
        with warnings.catch_warnings():  # ... and of that config's older spellings (rope_scaling)
            warnings.simplefilter("ignore", FutureWarning)
            return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        if not any((path / name).exists() for name in TOKENIZER_FILES):
            raise ModelError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the tokenizer "
                             f"files of the model it was made from into it") from exc
        custom = "custom code" in str(exc) or "trust_remote_code" in str(exc) or "does not exist" in str(exc)
        if custom and (path / "tokenizer.json").exists():
            try:
                return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
            except Exception as fallback:
                raise ModelError(f"cannot load the tokenizer in {path}: {one_line(fallback)}") from fallback
        raise ModelError(f"cannot load the tokenizer in {path}: {one_line(exc)}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
