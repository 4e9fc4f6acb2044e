"""lm-evaluation-harness through SBD: an lm-eval model (``sbd_bench``) backed by our core, and the run
folder that `run` writes, made from its requests. Needs the optional extra: ``pip install -e ".[lmeval]"``.

    python -m sbd_bench lm-eval --model models/sbd-tiny --tasks gsm8k --solver entropy_bounded:gamma=0.1
    sbd-lm-eval --model sbd_bench --model_args pretrained=models/sbd-tiny,solver=ntp \\
        --tasks gsm8k                        # lm-eval's own command line, our model registered first

``generate_until`` decodes each request exactly as `run` decodes an example (``Planned`` samples through
``measure_sample`` / ``batched_records``: same core, same records): lm-eval's ``until`` strings are the
stop strings, its ``max_gen_toks`` the budget, its batch size ours. ``loglikelihood`` and
``loglikelihood_rolling`` score the text with one causal forward through ``Decoder.forward``, the model call
of NTP decoding (the mask token excluded, as NTP never emits it): a solver has no effect on them.
lm-eval's registry finds models only in its own process (it scans no entry points), so the second
command imports this module, which registers the model, and then hands lm-eval's own flags to lm-eval.
This is the one module that imports lm_eval (pyproject.toml's import contracts).
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

# Nothing may download: a hub dataset without a local copy fails at once instead of retrying the network
# (read by datasets and huggingface_hub when they are imported, so before lm_eval is)
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import lm_eval.models  # noqa: E402,F401 - lm-eval's own models first: get_model fills only an empty registry
import torch  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

from ..analysis.records import SAMPLES, RecordWriter, prepare_output_folder, read_records  # noqa: E402
from ..analysis.report import check_report_folder, write_report  # noqa: E402
from ..core.cache import KVCache  # noqa: E402
from ..core.decoding import Decoder  # noqa: E402
from ..core.model import load_model  # noqa: E402
from ..registry import parse_solver_spec, solver_registry  # noqa: E402
from ..types import SCHEMA_VERSION, Example, Solver, Task, UsageError  # noqa: E402
from .batches import batched_records  # noqa: E402
from .harness import choose_threads, provenance, warm_up, write_summary  # noqa: E402
from .samples import Planned, RunConfig, measure_sample  # noqa: E402

MODEL_NAME = "sbd_bench"
NTP = "ntp"
LOGLIKELIHOOD_TYPES = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")
LOGLIKELIHOOD_NOTE = ("solver has no effect on log-likelihood tasks: their requests are scored by the NTP path "
                      "(one causal forward per request)")


class RequestTask(Task):
    """The requests of one lm-eval task that share ``until`` and ``max_gen_toks``, as a task of ours:
    its stop strings and budget; no verdict (lm-eval scores the outputs; ``lm-eval`` copies its score in)."""

    def __init__(self, name: str, stop: tuple[str, ...], max_new_tokens: int):
        self.name, self.stop, self.max_new_tokens = name, stop, max_new_tokens

    def examples(self, split: str = "test") -> list[Example]:
        return []

    def verdict(self, example: Example, output: str):
        return None, None


def _int_arg(name: str, value, minimum: int = 1) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"model argument {name}={value} must be an integer"
                         + (" (sbd_bench decodes fixed batches: give --batch_size N)" if name == "batch_size" else ""))
    if number < minimum:
        raise UsageError(f"model argument {name}={value} must be >= {minimum}")
    return number


def _bool_arg(name: str, value) -> bool:
    text = str(value).lower()
    if text not in ("true", "false", "1", "0", "on", "off"):
        raise UsageError(f"model argument {name}={value} must be true or false")
    return text in ("true", "1", "on")


@register_model(MODEL_NAME)
class SBDLM(TemplateLM):
    """lm-eval's model ``sbd_bench``: ``--model_args pretrained=DIR,solver=SPEC,block_size=16,...``.

    One solver configuration per model (``solver=entropy_bounded:gamma=0.1``, or a ``Solver``; a spec with
    commas is quoted on lm-eval's command line). ``loaded``: a ``LoadedModel`` to use instead of loading
    ``pretrained``; ``records``: the list to add the records to, one `run` sample record per generation
    request in the order decoded. ``out=DIR`` appends each to DIR/samples.jsonl as it is decoded and
    writes the run folder (samples.jsonl, summary.json, the report and page) after each ``generate_until``.
    """

    def __init__(self, pretrained: str = "sbd-tiny", solver: str = NTP, block_size=16, batch_size=1,
                 max_batch_size=None, device=None, dtype: str = "auto", seed=0, max_block_forwards=None,
                 threads=None, out: str | None = None, exact=False, command: str = "", loaded=None, records=None,
                 **ignored):
        super().__init__()
        if ignored:
            raise UsageError(f"model argument(s) {', '.join(sorted(ignored))} unknown to sbd_bench: it takes "
                             f"pretrained, solver, block_size, batch_size, device, dtype, seed, max_block_forwards, "
                             f"threads, exact, out")
        if device in ("cuda", "cuda:0") and not torch.cuda.is_available():  # lm-eval's command line passes its default
            device = "auto"  # ("cuda:0") whatever the machine; its own HF model falls back to the CPU likewise
        spec = solver.label if isinstance(solver, Solver) else str(solver)
        configs = [solver] if isinstance(solver, Solver) else parse_solver_spec(spec, solver_registry())
        chosen = [s for s in configs if s.label != NTP] or configs[:1]
        if len(chosen) != 1:
            raise UsageError(f"solver={spec} names {len(chosen)} configurations; the lm-eval model decodes one "
                             f"(`python -m sbd_bench lm-eval --solver` runs a sweep, one evaluation each)")
        self.solver = chosen[0]
        self.cfg = RunConfig(model=str(pretrained), tasks=[], solvers=spec, out=Path(out or "runs/lm-eval"),
                             block_size=_int_arg("block_size", block_size), seed=_int_arg("seed", seed, 0),
                             batch_size=_int_arg("batch_size", batch_size or 1), device=device or "auto",
                             dtype=str(dtype), max_block_forwards=_int_arg("max_block_forwards", max_block_forwards),
                             threads=_int_arg("threads", threads), exact=_bool_arg("exact", exact),
                             cost_curve=False, trace=0, command=command or " ".join(sys.argv))
        self.out = Path(out) if out else None
        if self.out is not None:  # a bad folder costs no model load; a run folder of ours is never overwritten
            prepare_output_folder(self.out, flag="out=")
            check_report_folder(self.out, also=("summary.json", SAMPLES), flag="out=")
            if (self.out / SAMPLES).exists() and read_records(self.out / SAMPLES):
                raise UsageError(f"out={self.out} already holds records: choose another folder")
        self.lm = loaded or load_model(self.cfg.model, device=self.cfg.device, dtype=self.cfg.dtype,
                                       exact=self.cfg.exact)
        threads, self.threads_chosen = choose_threads(self.cfg.threads, self.lm)
        torch.set_num_threads(threads)
        self.tokenizer = self.lm.tokenizer
        self.records: list[dict] = [] if records is None else records  # shared by the configurations of one command
        self.stream = self.out / SAMPLES if self.out is not None else None  # where each record is appended
        self.loglikelihood_requests: Counter = Counter()  # lm-eval task -> requests scored by the NTP path
        self._ids_seen: Counter = Counter()
        self._warned = False

    # --------------------------------------------------------------------------- lm-eval's interface
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:  # an empty context is conditioned on BOS where the tokenizer has one
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.lm.max_positions or 2048

    @property
    def device(self):
        return self.lm.device

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "sbd_bench").replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As `run` encodes a plain prompt (tasks.encode_prompt): with the tokenizer's special tokens."""
        from ..tasks import encode_prompt

        if add_special_tokens is False:
            return self.tokenizer(string, add_special_tokens=False)["input_ids"]
        return encode_prompt(self.tokenizer, string)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        tasks: dict[tuple, RequestTask] = {}
        planned: list[Planned] = []
        for request in requests:
            context, options = request.args
            key = self._request_task(request.task_name, options)
            task = tasks.get(key) or tasks.setdefault(key, RequestTask(*key))
            example = Example(self._example_id(request), context)
            planned.append(Planned(task, example, self.tok_encode(context), 0, self.solver))
        rank = {key: n for n, key in enumerate(tasks)}
        order = sorted(range(len(planned)), key=lambda i: rank[tasks_key(planned[i].task)])
        todo = [planned[i] for i in order]  # one task (stops, budget) after another: batches share them
        if todo and self.cfg.warmup:
            warm_up(self.lm, [(todo[0].task, todo[0].example, todo[0].ids)], [self.solver], self.cfg)
        if self.cfg.batch_size > 1:
            decoded = batched_records(self.lm, todo, self.cfg)
        else:
            decoded = (measure_sample(self.lm, p.task, p.example, p.ids, p.solver, self.cfg, 0) for p in todo)
        writer = RecordWriter(self.stream) if self.stream is not None else None
        records = []
        try:
            for record in decoded:  # each kept as soon as it is decoded: an interruption loses none
                records.append(record)
                self.records.append(record)
                if writer is not None:
                    writer.write(record)
                if record["error"]:
                    print(f"failed: {record['config']} on {record['task']}/{record['id']}: {record['error']}",
                          file=sys.stderr)
        finally:
            if writer is not None:
                writer.close()
        outputs = [""] * len(planned)
        for i, record in zip(order, records):
            outputs[i] = record["output_text"]  # a failed request gives "" (its record holds the error)
        if self.out is not None:
            self.write_run_folder(self.out)
        return outputs

    def _request_task(self, name: str, options: dict) -> tuple[str, tuple[str, ...], int]:
        options = dict(options or {})
        until = options.pop("until", None) or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        budget = _int_arg("max_gen_toks", options.pop("max_gen_toks", 256))
        temperature = float(options.pop("temperature", 0.0) or 0.0)
        if temperature > 0:
            raise UsageError(f"task {name} asks for sampling (temperature={temperature}): sbd_bench samples as the "
                             f"solver spec says; give solver=NAME:temperature={temperature} (or --gen_kwargs "
                             f"temperature=0 for greedy)")
        return name, until, budget

    def _example_id(self, request) -> str:
        """The doc id; a second request of the same doc (lm-eval's repeats) gets '.1', '.2', ..."""
        base = f"{request.task_name}/{request.doc_id}"
        n = self._ids_seen[base]
        self._ids_seen[base] += 1
        return str(request.doc_id) if n == 0 else f"{request.doc_id}.{n}"

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._note_loglikelihood(requests)
        scores = super().loglikelihood(requests, disable_tqdm=True)
        self._rewrite_folder()
        return scores

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        self._note_loglikelihood(requests)
        totals = []
        for request in requests:
            (text,) = request.args
            windows = map(make_disjoint_window, get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            totals.append(sum(self._score(context, continuation)[0] for context, continuation in windows))
        self._rewrite_folder()
        return totals

    def _loglikelihood_tokens(self, requests, **kwargs) -> list[tuple[float, bool]]:
        return [self._score(context, continuation) for _, context, continuation in requests]

    # ---------------------------------------------------------------------------------- the NTP path
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """(log p(continuation | context), whether every continuation token is the argmax): one causal
        forward through the core's model call, as NTP decoding reads its logits."""
        ids = (context + continuation)[-(self.max_length + 1):][:-1]
        decoder = Decoder(self.lm, max_new_tokens=1)
        tokens = torch.tensor([ids], dtype=torch.long, device=self.lm.device)
        positions = torch.arange(len(ids), device=self.lm.device)[None]
        logits = decoder.forward(tokens, positions, None, KVCache(self.lm.model.config), phase="prefill")
        log_probs = torch.log_softmax(logits[0, -len(continuation):], dim=-1)  # (C, V)
        target = torch.tensor(continuation, device=log_probs.device)
        picked = log_probs.gather(-1, target[:, None])[:, 0]
        return float(picked.sum()), bool((log_probs.argmax(-1) == target).all())

    def _note_loglikelihood(self, requests) -> None:
        for request in requests:
            self.loglikelihood_requests[request.task_name] += 1
        if self.solver.label != NTP and not self._warned:
            self._warned = True
            print(f"note: {LOGLIKELIHOOD_NOTE}; solver={self.solver.label} applies to generation tasks only",
                  file=sys.stderr)

    # ------------------------------------------------------------------------------- the run folder
    def _rewrite_folder(self) -> None:
        """After log-likelihood requests, the summary counts them (the records stay the generation ones)."""
        if self.out is not None and self.records:
            self.write_run_folder(self.out)

    def write_run_folder(self, out: Path, lm_eval: dict | None = None) -> Path:
        """``records`` as a run folder of `run`'s kind: samples.jsonl, summary.json (provenance, rows), the
        report and page. ``lm_eval``: what the summary says of the evaluation (tasks, where its results lie)."""
        if not self.cfg.tasks:  # lm-eval's command line: the tasks are known once their requests come
            self.cfg.tasks = list(dict.fromkeys(r["task"] for r in self.records))
        return write_run_folder(out, self.cfg, self.lm, self.threads_chosen, self.records,
                                {"loglikelihood_requests": dict(self.loglikelihood_requests), **(lm_eval or {})})


def tasks_key(task: RequestTask) -> tuple:
    return task.name, task.stop, task.max_new_tokens


def write_run_folder(out: Path, cfg: RunConfig, lm, threads_chosen: str, records: list[dict], lm_eval: dict) -> Path:
    """The run folder of ``records`` (any order of configurations; NTP's first in the tables)."""
    out = Path(out)
    prepare_output_folder(out)
    prov = provenance(cfg, lm, threads_chosen)
    prov["lm_eval"] = {"version": _lm_eval_version(), **lm_eval}
    if lm_eval.get("loglikelihood_requests"):
        prov["lm_eval"]["note"] = LOGLIKELIHOOD_NOTE
    (out / SAMPLES).unlink(missing_ok=True)  # the folder holds this model's records, all of them, rewritten
    writer = RecordWriter(out / SAMPLES)
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()
    summary = {"schema_version": SCHEMA_VERSION, "complete": False, "provenance": prov, "rows": [], "failures": [],
               "cost_curve": None, "resume_command": None}
    write_summary(out, summary, len(records))
    if records:
        write_report(out)
    return out


def _lm_eval_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None
