"""Baselines decoded by transformers' own ``generate`` (``types.GenerateBaseline``: prompt lookup, assisted
decoding with a draft model) on the core's model, prompt, stops and budget, measured as the core measures
itself (docs/baselines.md).

    >>> decoder = Decoder(load_model("sbd-tiny"), max_new_tokens=48)
    >>> gen = decoder.generate(prompt_ids, HFPromptLookup(tokens=10, ngram=2))   # dispatched here
    >>> gen.nfe, gen.revealed_per_forward, gen.accepted_per_block, gen.draft_forwards

What is counted, and where:
- ``nfe``: forwards of the target model, counted at the model call by a forward pre-hook (the core counts
  its own at ``Decoder.forward``). ``generate`` has no prefill apart: its first forward reads the whole
  prompt and yields the first token(s), as the core's first forward after its prefill does, so it counts in
  ``nfe``, ``prefill_forwards`` is 0, and a prompt on which nothing is ever drafted costs one forward per
  token, as NTP. Its time is in ``decode_time_s`` (``prefill_time_s`` is 0): ``speed_factor_e2e`` is the
  wall-clock factor that compares like with like.
- per target forward (``forwards_per_block`` is 1 each: each forward verifies its own draft): the tokens
  drafted (the forward's queries after the committed ones), accepted (drafts equal to the tokens then
  committed at their places), replaced (1 when the target committed a token of its own in place of a
  draft) and committed (``revealed_per_forward``; the next forward starts where they end).
- ``draft_forwards``: forwards of the draft model, its own reading of the prompt included (0 for prompt
  lookup, which drafts without a model), counted by the same hook on it.
Stops and budget are the core's (``decoder.stop``, core/stops.py): ``generate`` stops after the first forward that
commits what ends the core's decoding (a stopping criterion asks ``decoder.stop.stop_at``), and its output is cut where the
core's would be. HF's assisted decoding takes one sequence at a time: a batch is decoded row by row.
"""
from __future__ import annotations

import copy

import torch

from ..types import Generation, UsageError, generate_baseline, schedule_baseline
from .model import DTYPES, LoadedModel, ModelError, device_clock, load_model, resolve_model_path

# options that HF reads from the draft model's generation_config, not from generate's arguments
DRAFT_CONFIG_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
_DRAFTS: dict[tuple, LoadedModel] = {}  # drafts loaded once per process, on their target's device and dtype


def load_draft(lm: LoadedModel, name: str) -> LoadedModel:
    """The draft model ``name`` (a folder or a shipped model name) on ``lm``'s device, dtype and attention,
    refused in one line when its tokenizer is not ``lm``'s (HF's assisted decoding compares token ids)."""
    key = (str(resolve_model_path(name).resolve()), str(lm.device), lm.dtype, lm.attn_implementation, lm.path)
    if key not in _DRAFTS:
        dtype = next(name for name, value in DTYPES.items() if value == lm.dtype)
        draft = load_model(name, device=str(lm.device), dtype=dtype, attn_implementation=lm.attn_implementation,
                           require_mask_token=False)
        if draft.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
            raise ModelError(f"{name} has another tokenizer than the model {lm.path}: assisted decoding "
                             f"needs the model's own tokenizer; train a draft on it (as models/ntp-draft/README.md does)")
        _DRAFTS[key] = draft
    return _DRAFTS[key]


def check_baselines(lm: LoadedModel, solvers) -> None:
    """Refuse, before anything is decoded, a baseline this model cannot run: a draft model that does not
    load or does not share its tokenizer, or ``--exact`` (exact mode is the core's own attention)."""
    for solver in solvers:
        baseline = generate_baseline(solver)
        if baseline is None or schedule_baseline(solver) is not None:  # a family's schedule: core/schedules.py
            continue
        if lm.exact:
            raise UsageError(f"{solver.label} decodes with transformers' generate, which --exact does not cover (it "
                             f"makes the core's own decoding exact): drop --exact or the {baseline.name} configuration")
        if baseline.draft_model:
            try:
                load_draft(lm, baseline.draft_model)
            except ModelError as exc:
                raise ModelError(f"{solver.label}: draft {exc}") from exc


class _Forwards:
    """A forward pre-hook on a model: every call's cache length before it and its query ids (host lists)."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[tuple[int, list[int]]] = []
        self._handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]  # (1, Q)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.calls.append((cache.get_seq_length() if cache is not None else 0, ids[0].tolist()))

    def remove(self) -> None:
        self._handle.remove()


def _stopping_criterion(decoder, prompt_len: int, budget: int):
    """A transformers StoppingCriteria that ends ``generate`` once the core's rule would end decoding."""
    from transformers import StoppingCriteria

    class CoreStop(StoppingCriteria):
        seen = 0  # tokens already checked: only the ones committed since are searched for a stop token

        def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
            out = input_ids[0, prompt_len:].tolist()
            cut, _ = decoder.stop.stop_at(out, len(out), budget, first_new=self.seen)
            self.seen = len(out)
            return torch.full((input_ids.shape[0],), cut is not None, dtype=torch.bool, device=input_ids.device)

    return CoreStop()


def _generation_config(lm: LoadedModel, sampling, budget: int, options: dict):
    from transformers import GenerationConfig

    pad = getattr(lm.tokenizer, "pad_token_id", None)
    drawn = {} if sampling.greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                        "top_k": sampling.top_k}  # top_k 0: every token (HF's default is 50)
    return GenerationConfig(max_new_tokens=budget, do_sample=not sampling.greedy, **drawn,
                            eos_token_id=list(lm.stop_token_ids) or None, pad_token_id=pad if pad is not None else 0,
                            suppress_tokens=[lm.mask_token_id] if lm.mask_token_id >= 0 else None, **options)


def generate_with_transformers(decoder, prompt_ids: list[int], solver, seed: int) -> Generation:
    """Decode one prompt with ``solver``'s ``GenerateBaseline`` through ``model.generate`` (see the module
    docstring); ``decoder`` gives the model, stops and budget; ``seed`` seeds sampling (torch's generator,
    forked, so the caller's stream is left as it was)."""
    from transformers.utils import logging as hf_logging

    lm, baseline = decoder.lm, generate_baseline(solver)
    decoder.check_prompt(prompt_ids)
    budget = min(decoder.max_new_tokens, decoder.context - len(prompt_ids))
    options = baseline.generate_options()
    draft = load_draft(lm, baseline.draft_model) if baseline.draft_model else None
    draft_config = None
    if draft is not None:  # HF reads these from the draft's own generation_config: set for this call only (the
        draft_config = draft.model.generation_config  # draft is shared by every configuration that names it)
        draft.model.generation_config = copy.deepcopy(draft_config)
        for key in DRAFT_CONFIG_KEYS:
            if key in options:
                setattr(draft.model.generation_config, key, options.pop(key))
    config = _generation_config(lm, solver.sampling, budget, options)
    assistant = {} if draft is None else {"assistant_model": draft.model}
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    target = _Forwards(lm.model)
    drafter = _Forwards(draft.model) if draft is not None else None
    devices = [lm.device] if lm.device.type == "cuda" else []
    verbosity = hf_logging.get_verbosity()
    # generate's draft-model call warns about its own arguments (a deprecation, a logits processor passed
    # twice), every time: not the user's to act on
    hf_logging.set_verbosity_error()
    try:
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(seed)
            t0 = device_clock(lm.device)
            sequence = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **assistant,
                                         stopping_criteria=[_stopping_criterion(decoder, len(prompt_ids), budget)])
            t1 = device_clock(lm.device)
    finally:
        hf_logging.set_verbosity(verbosity)
        target.remove()
        if drafter is not None:
            drafter.remove()
        if draft_config is not None:
            draft.model.generation_config = draft_config
    out = sequence[0, len(prompt_ids):].tolist()
    drafted, accepted, replaced, committed = _per_forward(target.calls, len(prompt_ids), out)
    cut, reason = decoder.stop.stop_at(out, len(out), budget)
    if cut is None:
        raise RuntimeError(f"{solver.label}: generate stopped after {len(out)} tokens where the core's rule goes on")
    committed[-1] -= len(out) - cut  # the forward that ended decoding keeps what precedes the stop
    out = out[:cut]
    return Generation(
        output_ids=out, stop_reason=reason, nfe=len(target.calls), prefill_forwards=0,
        revealed_per_forward=committed, forwards_per_block=[1] * len(target.calls), prefill_time_s=0.0,
        decode_time_s=t1 - t0, output_text=decoder.stop.text(out, reason), drafted_per_block=drafted,
        accepted_per_block=accepted, replaced_per_block=replaced,
        draft_forwards=len(drafter.calls) if drafter is not None else 0,
    )


def _per_forward(calls: list[tuple[int, list[int]]], prompt_len: int, out: list[int]):
    """(drafted, accepted, replaced, committed) per target forward, before any stop cut, from each call's
    (cache length, query ids): a forward's queries are the committed tokens the cache lacks (the whole prompt
    first, then the last committed token), then its drafts; the next forward's cache ends one before what
    this one committed. ``replaced``: 1 where the target committed its own token in place of a draft."""
    drafted, accepted, replaced, committed = [], [], [], []
    for i, (past, queries) in enumerate(calls):
        known = prompt_len if i == 0 else past + 1  # committed tokens before this forward
        drafts = queries[known - past :]
        end = calls[i + 1][0] + 1 if i + 1 < len(calls) else prompt_len + len(out)
        made = out[known - prompt_len : end - prompt_len]
        agree = next((j for j, (a, b) in enumerate(zip(drafts, made)) if a != b), min(len(drafts), len(made)))
        drafted.append(len(drafts))
        accepted.append(agree)
        replaced.append(int(agree < min(len(drafts), len(made))))
        committed.append(end - known)
    return drafted, accepted, replaced, committed
