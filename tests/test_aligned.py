"""Block-diffusion families with aligned blocks (core/aligned.py): SDAR-shaped and Fast-dLLM-v2-shaped
random checkpoints load into their stock classes without their code, and decode exactly (fp32, CPU,
greedy): every forward of every block solver equals a no-cache forward of the whole sequence under the
family's block-causal mask, a decode reads each slot where the family reads it (the shift pinned by an
independent reference decode), batch 3 gives batch 1's records, traces add up to their records, and what
such a family cannot decode (ntp, verify=on, another block size) is refused in one line."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sbd_bench.core import aligned, families
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from tiny_models import build_block_diffusion_model

ROOT = Path(__file__).resolve().parent.parent
# prompt lengths 7, 4 (SDAR: a multiple of its block; full prompt blocks and an empty tail) and 16/18
PROMPTS = ["hello world, how are you?", "Say hi.", "what is 12 plus 30? It is 42. The cat sat on the mat."]
BLOCK = {"sdar": 4, "fast_dllm_v2": 16}
FIELDS = ("output_ids", "stop_reason", "nfe", "vendor_nfe", "revealed_per_forward", "forwards_per_block")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: build_block_diffusion_model(root / name, name) for name in BLOCK}


@pytest.fixture(scope="module")
def models(folders):
    return {name: dataclasses.replace(load_model(folder, device="cpu", dtype="float32"), stop_token_ids=())
            for name, folder in folders.items()}


def _solvers(lm):
    return [s for s in parse_solver_spec("all", solver_registry()) if aligned.refusal(lm, s) is None]


@pytest.mark.parametrize("name, cls", [("sdar", "Qwen3ForCausalLM"), ("fast_dllm_v2", "Qwen2ForCausalLM")])
def test_the_folder_loads_into_the_stock_class_without_its_code(folders, models, name, cls):
    lm = models[name]
    assert type(lm.model).__name__ == cls and lm.family.name == name
    assert lm.info["load"] == {"class": cls, "missing": 0, "unexpected": 0}
    assert lm.info["trained_block_size"] == BLOCK[name]
    vocab = lm.tokenizer.get_vocab()
    assert lm.mask_token_id == vocab["<|MASK|>" if name == "sdar" else "|<MASK>|"]  # FDv2: by the token's text
    stops = load_model(folders[name], device="cpu").stop_token_ids
    assert vocab["<|im_end|>"] in stops  # SDAR: from generation_config.json; FDv2: config.json
    assert not (folders[name] / "TRAP_RAN").exists()


def _reference_logits(lm, sequence: list[int], start: int, ids: list[int]) -> torch.Tensor:
    """No cache: one forward over sequence[:start] + ids, every query seeing the keys of its own aligned
    block and of all earlier blocks (positions // block size), float32, the mask's logit -inf."""
    tokens = sequence[:start] + ids
    blocks = torch.arange(len(tokens)) // lm.info["trained_block_size"]
    allowed = blocks[:, None] >= blocks[None, :]
    mask = torch.zeros(len(tokens), len(tokens)).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([tokens]), attention_mask=mask,
                          position_ids=torch.arange(len(tokens))[None]).logits[0, start:].float()
    logits[:, lm.mask_token_id] = float("-inf")
    return logits


@pytest.mark.parametrize("name", list(BLOCK))
def test_every_forward_of_every_solver_equals_a_no_cache_forward(models, name, monkeypatch):
    lm = models[name]
    calls = []
    forward = aligned._Row.forward

    def recording(self, ids, start, pattern, keep, phase="decode"):
        logits = forward(self, ids, start, pattern, keep, phase)
        calls.append((list(ids), start, logits.clone(), getattr(pattern, "shadow", False),
                      len(getattr(pattern, "sizes", ())) == 2))
        return logits

    monkeypatch.setattr(aligned._Row, "forward", recording)
    kinds = set()
    for solver in _solvers(lm):
        for text in PROMPTS:
            prompt = lm.tokenizer(text)["input_ids"]
            calls.clear()
            gen = Decoder(lm, block_size=BLOCK[name], max_new_tokens=14).generate(prompt, solver)
            sequence = prompt + gen.output_ids
            assert len(calls) == gen.nfe + gen.prefill_forwards, solver.label
            for ids, start, logits, shadow, two_blocks in calls:
                k = len(ids) if shadow else logits.shape[0]  # a shadow's queries follow the block's: not compared
                reference = _reference_logits(lm, sequence, start, ids)[-k:]
                assert torch.allclose(logits[:k], reference, atol=1e-4, rtol=0), (solver.label, text, start)
                kinds.add("carried" if two_blocks else "block" if k > 1 else "one")
    assert "block" in kinds and ("carried" in kinds) == (name == "sdar")


def _reference_left_to_right(lm, prompt: list[int], budget: int, shift: bool, commit_forward: bool) -> list[int]:
    """One slot per forward, left to right, the argmax of the query the family reads it from, recomputing
    everything: slot t from query t (SDAR) or t - 1 (Fast-dLLM v2); a Fast-dLLM v2 block's first slot is
    the argmax after the finished block before it (or after the prompt, when it ends a block)."""
    width, mask = lm.info["trained_block_size"], lm.mask_token_id
    sequence = list(prompt)
    while len(sequence) < len(prompt) + budget:
        t = len(sequence)
        block_start = t // width * width
        end = min(block_start + width, len(prompt) + budget)
        if commit_forward and t == block_start:  # the clean blocks before it, block-causally: the last logit
            sequence.append(int(_reference_logits(lm, sequence, t - 1, sequence[-1:])[-1].argmax()))
            continue
        ids = sequence[block_start:] + [mask] * (end - t)
        logits = _reference_logits(lm, sequence, block_start, ids)
        sequence.append(int(logits[t - block_start - 1 if shift else t - block_start].argmax()))
    return sequence[len(prompt):]


@pytest.mark.parametrize("name", list(BLOCK))
def test_a_decode_reads_each_slot_where_the_family_reads_it(models, name):
    """Fails with the family's shift flipped (and with Fast-dLLM v2's commit forward fused)."""
    lm = models[name]
    solver = parse_solver_spec("left_to_right:n=1", solver_registry())[-1]
    for text in PROMPTS:
        prompt = lm.tokenizer(text)["input_ids"]
        gen = Decoder(lm, block_size=BLOCK[name], max_new_tokens=21).generate(prompt, solver)
        assert gen.output_ids == _reference_left_to_right(lm, prompt, 21, lm.family.logit_shift,
                                                          lm.family.commit == "forward"), text


@pytest.mark.parametrize("name", list(BLOCK))
def test_breaking_the_shift_or_the_cache_rule_fails_the_reference(models, name):
    lm = models[name]
    solver = parse_solver_spec("left_to_right:n=1", solver_registry())[-1]
    prompt = lm.tokenizer(PROMPTS[0])["input_ids"]
    expected = _reference_left_to_right(lm, prompt, 21, lm.family.logit_shift, lm.family.commit == "forward")
    for broken in ({"logit_shift": not lm.family.logit_shift},
                   {"commit": "fused" if lm.family.commit == "forward" else "forward"}):
        wrong = dataclasses.replace(lm, family=dataclasses.replace(lm.family, **broken))
        assert Decoder(wrong, block_size=BLOCK[name], max_new_tokens=21).generate(prompt, solver).output_ids != expected


@pytest.mark.parametrize("name", list(BLOCK))
def test_every_solver_s_trace_adds_up_to_its_record(models, name):
    """One entry per forward (the prefill's and a commit's first token: "ntp"), the committed tokens are the
    output, each forward's kept reveals its revealed_per_forward (analysis/traces.trace_problems)."""
    from sbd_bench.analysis.traces import check_trace, trace_problems

    lm = models[name]
    kinds = set()
    for solver in _solvers(lm):
        for text in PROMPTS:
            prompt = lm.tokenizer(text)["input_ids"]
            gen = Decoder(lm, block_size=BLOCK[name], max_new_tokens=20).generate_batch([prompt], solver, trace=True)[0]
            trace = {"task": "t", "id": "0", "config": solver.label, "block_size": BLOCK[name], **gen.trace}
            check_trace(trace, "here")
            record = {"nfe": gen.nfe, "output_ids": gen.output_ids, "revealed_per_forward": gen.revealed_per_forward}
            assert trace_problems(trace, record) == [], (solver.label, text)
            kinds |= {f["kind"] for f in trace["forwards"]}
    assert kinds == ({"block", "ntp"} if lm.family.commit == "forward" else {"block"})


@pytest.mark.parametrize("name", list(BLOCK))
def test_batch_three_gives_batch_one_s_records(models, name):
    lm = models[name]
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    for solver in _solvers(lm):
        decoder = Decoder(lm, block_size=BLOCK[name], max_new_tokens=10, seed=3)
        one = [{f: getattr(decoder.generate(p, solver), f) for f in FIELDS} for p in prompts]
        three = [{f: getattr(g, f) for f in FIELDS} for g in decoder.generate_batch(prompts, solver)]
        assert three == one, solver.label
        for record in one:
            assert sum(record["revealed_per_forward"]) == len(record["output_ids"]) == 10
            assert sum(record["forwards_per_block"]) == record["nfe"] == len(record["revealed_per_forward"])


def test_a_stop_ends_the_block_and_the_commit_is_not_paid(models):
    lm = models["fast_dllm_v2"]
    prompt = lm.tokenizer(PROMPTS[1])["input_ids"]
    solver = parse_solver_spec("left_to_right:n=1", solver_registry())[-1]
    free = Decoder(lm, block_size=16, max_new_tokens=21).generate(prompt, solver)
    stop = free.output_ids[4]
    stopped = Decoder(dataclasses.replace(lm, stop_token_ids=(stop,)), block_size=16,
                      max_new_tokens=21).generate(prompt, solver)
    cut = free.output_ids.index(stop) + 1
    assert stopped.output_ids == free.output_ids[:cut] and stopped.stop_reason == "stop_token"
    assert stopped.nfe == cut  # one slot per forward, nothing after the stop, no commit forward


def sbd(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", list(BLOCK))
def test_run_decodes_the_folder_with_every_solver_it_can(folders, models, name, tmp_path):
    out = tmp_path / "run"
    proc = sbd("run", "--model", folders[name], "--solver", "all", "--task", "arith", "--limit", "1", "--block-size",
               BLOCK[name], "--max-new-tokens", "8", "--threads", "1", "--no-cost-curve", "--no-report",
               "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: a " + name + " checkpoint cannot decode ntp" in proc.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["config"] for r in records} == {s.label for s in _solvers(models[name])}
    assert all(r["vendor_nfe"] >= r["nfe"] for r in records)
    assert not (folders[name] / "TRAP_RAN").exists()
    from sbd_bench.analysis.metrics import sample_key
    from sbd_bench.analysis.traces import read_traces, trace_problems

    traces = read_traces(out / "traces.jsonl")  # the first example of the task, every configuration: checked
    by_key = {sample_key(r): r for r in records}
    assert len(traces) == len(records) and all(trace_problems(t, by_key[sample_key(t)]) == [] for t in traces)


@pytest.mark.parametrize("args, message", [
    (["--solver", "ntp"], "has no NTP path, and nothing but ntp was asked for"),
    (["--solver", "fixed_k:k=2;verify=on"], "verified decoding checks drafts against next-token predictions"),
    (["--solver", "hf_prompt_lookup"], "is no next-token model"),
    (["--solver", "nld_spec"], "is no next-token model"),
    (["--solver", "fixed_k", "--block-size", "8"], "trained with blocks of 4"),
    (["--solver", "fixed_k", "--temperature", "0.7"], "sampling is not decoded"),
])
def test_what_sdar_cannot_decode_is_refused_in_one_line(folders, tmp_path, capsys, args, message):
    """In this process (the real-process battery is tests/test_bad_inputs.py's): exit 2, one error line."""
    from sbd_bench.cli import main

    block = [] if "--block-size" in args else ["--block-size", "4"]
    status = main(["run", "--model", str(folders["sdar"]), "--task", "arith", "--limit", "1", *block, *args,
                   "--out", str(tmp_path / "out")])
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("note:", "models/"))]
    errors = [line for line in lines if line.startswith("error: ")]
    assert status == 2 and len(errors) == 1 and message in errors[0], lines
    assert not (tmp_path / "out").exists()


def test_wino_on_shifted_logits_is_refused_by_a_real_process(folders, tmp_path):
    proc = sbd("run", "--model", folders["fast_dllm_v2"], "--task", "arith", "--limit", "1", "--block-size", "16",
               "--solver", "wino", "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and "shifted logits" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_families_table_names_both():
    assert families.FAMILIES["sdar"].aligned and families.FAMILIES["fast_dllm_v2"].logit_shift


def test_a_run_without_ntp_says_what_its_speed_factors_are_relative_to(folders, tmp_path):
    from sbd_bench.analysis.metrics import no_baseline_note
    from sbd_bench.cli import main

    out = tmp_path / "run"
    assert main(["run", "--model", str(folders["sdar"]), "--solver", "fixed_k:k=2", "--task", "arith", "--limit", "1",
                 "--block-size", "4", "--max-new-tokens", "6", "--threads", "1", "--no-cost-curve", "--trace", "0",
                 "--out", str(out)]) == 0
    note = "No NTP baseline (a sdar checkpoint has no NTP path): the speed factors relative to NTP are blank"
    assert note in (out / "report.md").read_text()
    assert note in (out / "report.html").read_text()  # the page's banner
    assert no_baseline_note({}, [{"solver": "ntp"}, {"solver": "fixed_k"}]) is None
