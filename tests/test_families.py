"""Model families (core/families.py): a Nemotron-Labs-Diffusion folder as published loads into the
stock Ministral3ForCausalLM without running its code, and our SBD decoding on it is exact (fp32, CPU,
greedy): every cached forward equals a no-cache forward for every solver, batch 3 gives batch 1's
records, ntp is transformers' greedy generate, verify=on is ntp. Families we do not decode are refused
in one line before anything loads."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sbd_bench.core import families
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import ModelError, load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from tiny_models import build_nld_model, build_tiny_model, no_cache_block_logits, reference_nld_model

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["hello world, how are you?", "Say hi.", "what is 12 plus 30?"]
FIELDS = ("output_ids", "stop_reason", "nfe", "revealed_per_forward", "forwards_per_block")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nld_dir(tmp_path_factory):
    return build_nld_model(tmp_path_factory.mktemp("nld") / "NLD-tiny")


@pytest.fixture(scope="module")
def nld(nld_dir):
    return load_model(nld_dir, device="cpu", dtype="float32")


def _no_stops(lm):
    return dataclasses.replace(lm, stop_token_ids=())  # a random model: decode the whole budget


def test_the_published_folder_loads_into_ministral3_without_its_code(nld_dir, nld):
    assert type(nld.model).__name__ == "Ministral3ForCausalLM"
    assert nld.family.name == "nemotron_labs_diffusion"
    assert nld.info["load"] == {"class": "Ministral3ForCausalLM", "missing": 0, "unexpected": 0}
    assert nld.info["trained_block_size"] == 32
    assert nld.mask_token_id == 100  # from config.json: the tokenizer declares no mask token
    assert nld.tokenizer.mask_token_id is None
    assert nld.stop_token_ids == (2, 11)  # </s> of the tokenizer, <|im_end|> of config and generation_config
    assert not (nld_dir / "TRAP_RAN").exists()  # the auto_map's files were never imported
    assert "encoder.layers.0.self_attn.q_proj.weight" in __import__("safetensors").safe_open(
        str(nld_dir / "model.safetensors"), "pt").keys()  # the folder holds NLD's names, not the stock ones
    head, embed = nld.model.lm_head.weight, nld.model.get_input_embeddings().weight
    assert head.data_ptr() != embed.data_ptr() and not torch.equal(head, embed)  # untied, as published


def test_logits_equal_the_stock_class_loaded_by_hand_past_the_query_scaling_threshold(nld_dir, nld):
    """Ministral-3 scales queries by 1 + 0.1 log(1 + floor(pos / 16384)): positions past 16384 tell it
    from the Mistral and Llama classes, which load the same tensors but lack the scaling."""
    reference = reference_nld_model(nld_dir)
    ids = torch.tensor([nld.tokenizer(PROMPTS[0])["input_ids"]])
    far = torch.arange(ids.shape[1])[None] + 40000
    with torch.no_grad():
        for positions in (None, far):
            assert torch.equal(nld.model(input_ids=ids, position_ids=positions).logits,
                               reference(input_ids=ids, position_ids=positions).logits)
        # the scaling is live at these positions: without it the logits move
        beta = reference.config.rope_parameters["llama_4_scaling_beta"]
        reference.config.rope_parameters["llama_4_scaling_beta"] = 0.0
        unscaled = reference(input_ids=ids, position_ids=far).logits
        reference.config.rope_parameters["llama_4_scaling_beta"] = beta
        assert not torch.allclose(nld.model(input_ids=ids, position_ids=far).logits, unscaled, atol=1e-4)


def test_without_the_key_mapping_the_folder_is_refused(nld_dir, monkeypatch):
    plain = dataclasses.replace(families.FAMILIES["nemotron_labs_diffusion"], key_mapping={})
    monkeypatch.setitem(families.FAMILIES, "nemotron_labs_diffusion", plain)
    with pytest.raises(ModelError, match=r"lack \d+ tensors"):
        load_model(nld_dir, device="cpu", dtype="float32")


def test_a_tokenizer_class_only_remote_code_defines_falls_back_to_tokenizer_json(nld_dir, tmp_path):
    folder = tmp_path / "custom-tokenizer"
    folder.mkdir()
    for file in nld_dir.iterdir():
        if file.is_file():
            (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="TekkenNLDTokenizer", auto_map={"AutoTokenizer": ["tokenization_nld.TekkenNLDTokenizer",
                                                                                   None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_nld.py").write_text(f"open({str(folder / 'TRAP_RAN')!r}, 'w').close()\nraise RuntimeError\n")
    lm = load_model(folder, device="cpu", dtype="float32")
    assert lm.tokenizer(PROMPTS[1])["input_ids"] == load_model(nld_dir, device="cpu").tokenizer(PROMPTS[1])["input_ids"]
    assert not (folder / "TRAP_RAN").exists()


def _every_cached_forward_recorder(lm):
    calls = []

    class Recording(Decoder):
        def block_step(self, pending, block, start, *args, **kwargs):
            logits = super().block_step(pending, block, start, *args, **kwargs)
            calls.append((start, block.clone(), logits.clone()))
            return logits

    return Recording, calls


def _no_cache_block_logits(model, committed: list[int], block: torch.Tensor, mask_id: int) -> torch.Tensor:
    logits = no_cache_block_logits(model, committed, block)
    logits[..., mask_id] = float("-inf")
    return logits


def _block_solvers():
    return [s for s in parse_solver_spec("all", solver_registry()) if s.name != "ntp" and not s.label.endswith("verify=on")]


def test_every_solver_s_cached_forwards_equal_no_cache_forwards(nld):
    lm = _no_stops(nld)
    prompt = lm.tokenizer(PROMPTS[2])["input_ids"]
    for solver in _block_solvers():
        Recording, calls = _every_cached_forward_recorder(lm)
        gen = Recording(lm, block_size=4, max_new_tokens=10).generate(prompt, solver)
        sequence = prompt + gen.output_ids
        assert calls, solver.label
        for start, block, logits in calls:
            reference = _no_cache_block_logits(lm.model, sequence[:start], block[:, : logits.shape[1]],
                                               lm.mask_token_id)
            assert torch.allclose(logits[:, : block.shape[1]], reference, atol=1e-4, rtol=0), solver.label


def test_batch_three_gives_batch_one_s_records_for_every_solver(nld):
    lm = _no_stops(nld)
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    for solver in parse_solver_spec("all", solver_registry()):
        decoder = Decoder(lm, block_size=4, max_new_tokens=10, seed=3)
        one = [{f: getattr(decoder.generate(p, solver), f) for f in FIELDS} for p in prompts]
        three = [{f: getattr(g, f) for f in FIELDS} for g in decoder.generate_batch(prompts, solver)]
        assert three == one, solver.label


def test_ntp_is_greedy_generate_and_verified_decoding_is_ntp(nld):
    lm = _no_stops(nld)
    solvers = parse_solver_spec("all", solver_registry())
    ntp = next(s for s in solvers if s.name == "ntp")
    verified = [s for s in solvers if s.label.endswith("verify=on")]
    assert verified
    for text in PROMPTS:
        prompt = lm.tokenizer(text)["input_ids"]
        ours = Decoder(lm, block_size=4, max_new_tokens=16).generate(prompt, ntp).output_ids
        with torch.no_grad():
            ref = lm.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, eos_token_id=None,
                                    pad_token_id=0)
        assert ours == ref[0, len(prompt):].tolist()
        for solver in verified:
            assert Decoder(lm, block_size=4, max_new_tokens=16).generate(prompt, solver).output_ids == ours, solver.label


def sbd(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_run_decodes_the_folder_with_every_solver(nld_dir, tmp_path):
    out = tmp_path / "run"
    proc = sbd("run", "--model", nld_dir, "--solver", "all", "--task", "arith", "--limit", "1", "--block-size", "4",
               "--max-new-tokens", "12", "--threads", "1", "--no-cost-curve", "--no-report", "--trace", "0",
               "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["complete"] is True
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["config"] for r in records} == {s.label for s in parse_solver_spec("all", solver_registry())}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["model_info"]["family"] == "nemotron_labs_diffusion"
    assert not (nld_dir / "TRAP_RAN").exists()


@pytest.mark.parametrize("model_type, family", [("llada2_moe", "llada2"), ("Dream", "dream"), ("llada", "llada"),
                                                ("bd3lm", "bd3lm")])
def test_families_we_do_not_decode_are_refused_in_one_line(tmp_path, model_type, family):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "auto_map": {"AutoConfig": "x.Y"}}))
    out = tmp_path / "out"
    proc = sbd("run", "--model", folder, "--out", out, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"is a {family} checkpoint" in proc.stderr, proc.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_an_unknown_custom_model_type_is_refused_without_a_question(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "foo_lm", "auto_map": {"AutoConfig": "c.C"}}))
    (folder / "c.py").write_text(f"open({str(folder / 'TRAP_RAN')!r}, 'w').close()\n")
    proc = sbd("run", "--model", folder, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "model_type 'foo_lm'" in proc.stderr
    assert "sbd_family.json" in proc.stderr and not (folder / "TRAP_RAN").exists()


def test_sbd_family_json_names_the_family(tmp_path):
    folder = build_tiny_model(tmp_path / "llama", "llama")
    assert families.detect_family(folder).name == "sbd"
    (folder / families.FAMILY_FILE).write_text('{"family": "dream"}')
    assert families.detect_family(folder).name == "dream"
    (folder / families.FAMILY_FILE).write_text('{"family": "nemotron"}')
    with pytest.raises(families.FamilyError, match="unknown model family 'nemotron'"):
        families.detect_family(folder)
    (folder / families.FAMILY_FILE).write_text('["sdar"]')
    with pytest.raises(families.FamilyError, match='must hold'):
        families.detect_family(folder)


def test_list_shows_the_families(tmp_path):
    proc = sbd("list", "--models", cwd=tmp_path)
    assert proc.returncode == 0
    assert "nemotron_labs_diffusion" in proc.stdout and "sdar" in proc.stdout and "sbd-tiny" in proc.stdout


def test_the_family_flag_names_the_family(tmp_path):
    from tiny_models import build_block_diffusion_model

    folder = build_block_diffusion_model(tmp_path / "renamed", "sdar")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    config.pop("auto_map")
    (folder / "config.json").write_text(json.dumps(config))  # a fine-tune saved under the stock type
    assert families.detect_family(folder).name == "sbd"
    out = tmp_path / "run"
    proc = sbd("run", "--model", folder, "--family", "sdar", "--solver", "fixed_k:k=2", "--task", "arith", "--limit",
               "1", "--block-size", "4", "--max-new-tokens", "6", "--no-cost-curve", "--no-report", "--out", out,
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert record["vendor_nfe"] == record["nfe"] + 1  # decoded as SDAR: one store forward folded (6 tokens, 2 blocks)
    proc = sbd("run", "--model", folder, "--family", "nemotron", "--out", tmp_path / "other", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown model family 'nemotron'" in proc.stderr
