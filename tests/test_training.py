"""The SBD training objective (SBD.md §2), the train loop and the `train` subcommand."""
import json

import pytest
import torch
from safetensors.torch import load_file

from sbd_bench.cli import main
from sbd_bench.core.model import load_model
from sbd_bench.training.tokenizer import char_tokenizer
from sbd_bench.training.objective import IGNORE, make_batch, sbd_attention_allowed, sbd_inputs
from sbd_bench.training.checkpoint import CHECKPOINT_DIR, latest, read_meta
from sbd_bench.training.config import TrainConfig
from sbd_bench.training.train import train

TINY = ["--hidden-size", "32", "--layers", "2", "--heads", "4", "--intermediate-size", "64", "--max-positions", "96"]


def reference_allowed(L: int, c: int, k: int) -> torch.Tensor:
    """The rules of SBD.md §2 written out one (query, key) pair at a time; blocks start at c."""
    def block(p):
        return (p - c) // k

    allowed = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for q in range(2 * L):
        for j in range(2 * L):
            q_clean, j_clean, qp, jp = q < L, j < L, q % L, j % L
            if q_clean and j_clean:
                allowed[q, j] = jp <= qp  # clean -> clean: causal
            elif not q_clean and not j_clean:
                allowed[q, j] = block(qp) == block(jp)  # noisy -> noisy: same block
            elif not q_clean and j_clean:
                allowed[q, j] = block(jp) < block(qp)  # noisy -> clean: strictly earlier block
            # clean -> noisy: never
    return allowed


@pytest.mark.parametrize("L,k,c", [(8, 2, 0), (12, 4, 5), (17, 16, 3), (20, 3, 7), (9, 5, 9), (33, 8, 1)])
def test_training_mask_follows_the_rules(L, k, c):
    got = sbd_attention_allowed(L, torch.tensor([c]), k)[0]
    assert torch.equal(got, reference_allowed(L, c, k))


def test_mask_is_per_sequence_and_additive():
    tok = char_tokenizer()
    pairs = [(tok("ab\n")["input_ids"], [5, 6, 7, tok.eos_token_id]), (tok("rev abcdef\n")["input_ids"], [8, tok.eos_token_id])]
    batch = make_batch(pairs, [0, 1], 3, "sbd", torch.Generator().manual_seed(0), tok.pad_token_id, tok.mask_token_id)
    L = batch.ids.shape[1]
    assert batch.mask.shape == (2, 1, 2 * L, 2 * L) and batch.mask.dtype == torch.float32
    for b, (prompt, _) in enumerate(pairs):
        expected = reference_allowed(L, len(prompt), 3)
        assert torch.equal(batch.mask[b, 0] == 0, expected)
        assert torch.all(batch.mask[b, 0][~expected] == torch.finfo(torch.float32).min)


def test_labels_prompt_free_block_aligned_and_padded():
    tok = char_tokenizer()
    eos, pad, mask = tok.eos_token_id, tok.pad_token_id, tok.mask_token_id
    prompt, completion = tok("12+3=\n")["input_ids"], [10, 11, 12, 13, 14, eos]  # c=7, n=6
    c, k = len(prompt), 4
    batch = make_batch([(prompt, completion)], [0] * 64, k, "sbd", torch.Generator().manual_seed(1), pad, mask)
    ids, ntp, noisy, matp = batch.ids, batch.ntp_labels, batch.noisy, batch.matp_labels
    assert ids.shape[1] == c + 8  # the completion fills two blocks of 4: the last one padded
    # NTP: logit t predicts token t+1, only for completion tokens (prompt tokens carry no loss)
    assert ntp[0].tolist() == [IGNORE] * (c - 1) + completion + [IGNORE] * 3
    # masked positions only, inside the completion's blocks, pad targets after EOS
    in_blocks = torch.zeros(ids.shape[1], dtype=torch.bool)
    in_blocks[c:] = True
    is_masked = noisy == mask
    assert not is_masked[:, ~in_blocks].any()
    assert torch.equal(matp != IGNORE, is_masked)
    assert torch.equal(matp[is_masked], ids[is_masked])
    assert ids[0, c + 6:].tolist() == [pad, pad]
    assert torch.equal(noisy[~is_masked], ids[~is_masked])
    ratios = is_masked[:, in_blocks].float().mean(-1)
    assert ratios.min() < 0.3 and ratios.max() > 0.7  # eta is drawn per sequence


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_clean_half_is_a_plain_causal_forward(tiny_models, family, attn):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models[family], attn_implementation=attn).eval()
    tok = char_tokenizer()
    pairs = [(tok("rev abc\n")["input_ids"], [20, 21, 22, tok.eos_token_id]), (tok("7+8=\n")["input_ids"], [30] * 9 + [tok.eos_token_id])]
    batch = make_batch(pairs, [0, 1], 4, "sbd", torch.Generator().manual_seed(0), tok.pad_token_id, tok.mask_token_id)
    ids, positions = sbd_inputs(batch)
    L = batch.ids.shape[1]
    assert positions[0].tolist() == list(range(L)) * 2
    with torch.no_grad():
        two_copy = model(input_ids=ids, position_ids=positions, attention_mask=batch.mask).logits
        plain = model(input_ids=batch.ids).logits
    torch.testing.assert_close(two_copy[:, :L], plain, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ the loop
def _cfg(out, **kw):
    base = dict(out=str(out), data="reverse", steps=30, batch_size=8, lr=3e-3, warmup=5, train_examples=64,
                log_every=5, save_every=100, hidden_size=32, layers=2, heads=4, intermediate_size=64,
                max_positions=96, threads=1)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "sbd"
    train(_cfg(out), log=lambda line: None)
    return out


def _log(out):
    """The loss windows of the log (stage markers, which say which command the lines below ran, left out)."""
    lines = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    return [line for line in lines if "step" in line]


def _stages(out):
    return [json.loads(line) for line in (out / "training_stages.jsonl").read_text().splitlines()]


def test_short_run_lowers_both_losses(smoke_run):
    log = _log(smoke_run)
    assert log[-1]["step"] == 30
    assert log[-1]["loss_ntp"] < log[0]["loss_ntp"] - 0.3
    assert log[-1]["loss_matp"] < log[0]["loss_matp"] - 0.3


def test_same_seed_same_weights_and_resume_is_exact(smoke_run, tmp_path):
    again = tmp_path / "again"
    train(_cfg(again), log=lambda line: None)
    first, second = load_file(smoke_run / "model.safetensors"), load_file(again / "model.safetensors")
    assert all(torch.equal(first[name], second[name]) for name in first)
    # interrupted at step 25 (last checkpoint: step 20), then resumed: the uninterrupted run's weights
    def interrupt(line):
        if line.startswith("[25/"):
            raise KeyboardInterrupt

    split = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(split, save_every=10), log=interrupt)
    assert read_meta(latest(split))["step"] == 20 and not (split / "model.safetensors").exists()  # exported at the end
    train(_cfg(split, resume=True), log=lambda line: None)
    resumed = load_file(split / "model.safetensors")
    assert all(torch.equal(first[name], resumed[name]) for name in first)
    assert [(s["stage"], s["resume"], s["from_step"], s["to_step"]) for s in _stages(split)] == [(1, False, 0, 30),
                                                                                               (2, True, 20, 30)]
    # the window logged at step 25 before the kill is gone: one line per step, the resumed run's, equal in loss
    windows = [(w["step"], w["loss_ntp"], w["loss_matp"]) for w in _log(split)]
    assert windows == [(w["step"], w["loss_ntp"], w["loss_matp"]) for w in _log(smoke_run)]


def test_a_fine_tune_carries_its_bases_stages_and_log(smoke_run, tmp_path):
    """Every command that shaped the weights is in the folder, the base's first (the model card's source)."""
    tuned = tmp_path / "tuned"
    train(_cfg(tuned, base=str(smoke_run), steps=10, lr=1e-3, command="python -m sbd_bench train --base X"),
          log=lambda line: None)
    stages = _stages(tuned)
    assert [s["stage"] for s in stages] == [1, 2] and stages[0] == _stages(smoke_run)[0]
    assert stages[1]["base"] == str(smoke_run) and stages[1]["lr"] == 1e-3 and stages[1]["to_step"] == 10
    assert stages[1]["command"] == "python -m sbd_bench train --base X" and stages[1]["machine"]
    markers = [json.loads(line) for line in (tuned / "training_log.jsonl").read_text().splitlines() if "stage" in line]
    assert [m["stage"] for m in markers] == [1, 2]
    assert [w["step"] for w in _log(tuned)] == [w["step"] for w in _log(smoke_run)] + [5, 10]


def test_checkpoint_round_trips_through_run(smoke_run, tmp_path, capsys):
    lm = load_model(smoke_run, device="cpu")
    cfg = lm.model.config
    assert lm.mask_token_id == lm.tokenizer.mask_token_id >= 0
    assert (cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id) == (
        lm.tokenizer.eos_token_id, lm.tokenizer.bos_token_id, lm.tokenizer.pad_token_id)
    assert lm.stop_token_ids == (cfg.eos_token_id,)
    rc = main(["run", "--model", str(smoke_run), "--task", "reverse", "--limit", "2", "--solver", "entropy_bounded",
               "--device", "cpu", "--out", str(tmp_path / "run")])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] and {r["solver"] for r in summary["rows"]} == {"ntp", "entropy_bounded"}


def test_throughput_measurement_runs_both_objectives_on_the_same_batches():
    from sbd_bench.training.train import measure_throughput

    result = measure_throughput(_cfg(""), steps=2, log=lambda line: None)
    assert result["steps"] == 2 and result["tokens"] > 0
    assert result["sbd_tokens_per_s"] > 0 and result["ntp_tokens_per_s"] > 0  # speed itself is not asserted


def test_ntp_objective_and_jsonl_data(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(20)))
    out = tmp_path / "ntp"
    train(_cfg(out, data=str(data), objective="ntp", steps=10), log=lambda line: None)
    log = _log(out)
    assert log[-1]["loss_matp"] is None and log[-1]["loss_ntp"] < log[0]["loss_ntp"]


def test_base_without_mask_token_gets_one(tiny_models, tmp_path):
    out = tmp_path / "ft"
    rc = main(["train", "--base", str(tiny_models["nomask"]), "--data", "reverse", "--train-examples", "16",
               "--steps", "2", "--batch-size", "4", "--out", str(out), "--threads", "1"])
    assert rc == 0
    lm = load_model(out, device="cpu")
    assert lm.tokenizer.mask_token == "<|mask|>"
    assert lm.model.config.mask_token_id == lm.mask_token_id == len(lm.tokenizer) - 1
    assert lm.model.get_input_embeddings().weight.shape[0] == len(lm.tokenizer)


def test_ctrl_c_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path, capsys, monkeypatch):
    """Ctrl-C in DCP's writer (where a SIGINT after a `[N/...]` line lands when N is a save step): DCP
    hands it back wrapped as a rank's failure, which read as 'cannot write the checkpoint ...: unknown
    error', exit 2. It is an interruption: the partial copy goes, the previous checkpoint stays."""
    from torch.distributed.checkpoint import filesystem

    write, calls = filesystem._write_files_from_queue, []

    def interrupted_second_save(*args, **kwargs):  # the function DCP runs each save's files through
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return write(*args, **kwargs)

    monkeypatch.setattr(filesystem, "_write_files_from_queue", interrupted_second_save)
    out = tmp_path / "o"
    rc = main(["train", "--data", "reverse", "--train-examples", "16", "--steps", "400", "--batch-size", "2",
               "--save-every", "2", "--out", str(out), "--threads", "1", *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130 and len(calls) == 2, err
    at = next(i for i, line in enumerate(err) if line.startswith("interrupted"))
    assert err[at] == (f"interrupted while writing the step-4 checkpoint (its partial copy is removed): the step-2 "
                       f"checkpoint is kept in {out}; continue with")
    assert err[at + 1].strip().endswith("--resume") and err[at + 3].strip() == f"python -m sbd_bench train --export --out {out}"
    assert read_meta(latest(out))["step"] == 2 and not (out / f"{CHECKPOINT_DIR}.tmp").exists()


# ------------------------------------------------------------------------------------ bad input
def _bad(argv, capsys, *words):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert all(w in err for w in words), err


def test_unloadable_base_folder(tmp_path, capsys):
    base = tmp_path / "broken"
    base.mkdir()
    (base / "config.json").write_text("{not json")
    _bad(["train", "--base", str(base), "--out", str(tmp_path / "o")], capsys, "cannot load", str(base))
    _bad(["train", "--base", str(tmp_path / "missing"), "--out", str(tmp_path / "o")], capsys, "not a folder")


def test_data_file_without_completions(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    _bad(["train", "--data", str(data), "--out", str(tmp_path / "o"), *TINY], capsys, "completion", "d.jsonl:1")


def test_block_size_larger_than_the_sequence(tmp_path, capsys):
    _bad(["train", "--data", "reverse", "--block-size", "128", "--out", str(tmp_path / "o"), *TINY], capsys,
         "--block-size 128", "max_position_embeddings=96")
    _bad(["train", "--block-size", "1", "--min-block-size", "1", "--out", str(tmp_path / "o")], capsys, "2 <=")


def test_output_folder_with_a_checkpoint_is_refused(smoke_run, capsys):
    before = (smoke_run / "model.safetensors").read_bytes()
    _bad(["train", "--data", "reverse", "--out", str(smoke_run), *TINY], capsys, "already holds a checkpoint",
         "--resume", "--overwrite")
    assert (smoke_run / "model.safetensors").read_bytes() == before
    assert (smoke_run / CHECKPOINT_DIR / ".metadata").exists()
