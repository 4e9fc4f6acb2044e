"""Bring your own model (issue 31): Hugging Face folders built the way published models come, from
`tokenizers` and a random config (tests/tiny_models.py, `build_bpe_chat_model`): a byte-level BPE with
the GPT-2 split pattern and a Llama-3-style template whose generation prompt ends in "\\n\\n", and a
ChatML (Qwen-style) base with 64 spare embedding rows; neither has a mask token.

  chat data is split on the rendered text, so the prompt a model trains on is the one `run` feeds it
  adding the mask token never shrinks an embedding; a spare row is set like a new token's
  `run --chat-template` on a JSONL file (a user message, or `messages`); one BOS per prompt
  chat-data refusals: unknown roles, an empty assistant turn, empty `messages`
and the whole way: train, export, decode with `run --chat-template`, vocab_size and rows kept."""
from __future__ import annotations

import json

import pytest
import torch
from tiny_models import build_bpe_chat_model

from sbd_bench.tasks import JsonlTask, encode_chat, load_task
from sbd_bench.training.config import TrainConfig, TrainError
from sbd_bench.training.data import chat_pairs, file_pairs
from sbd_bench.training.model import build_model, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "hello world"}, {"role": "user", "content": "what is 12 plus 30?"},
        {"role": "assistant", "content": "It is 42."}]
TINY = dict(steps=3, batch_size=2, block_size=4, threads=1, log_every=1, lr=3e-3, warmup=1)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    return {"llama3": build_bpe_chat_model(root / "llama3", "llama3", rows_multiple=64),
            "chatml": build_bpe_chat_model(root / "chatml", "chatml", spare_rows=64),
            "full": build_bpe_chat_model(root / "full", "llama3", spare_rows=0)}  # no spare row: it must grow


def tokenizer_of(folder):
    return build_tokenizer(TrainConfig(out=""), folder)[0]


@pytest.mark.parametrize("style", ["llama3", "chatml"])
def test_chat_turns_train_on_the_prompt_run_feeds(bases, style, tmp_path):
    tok = tokenizer_of(bases[style])
    pairs = chat_pairs(CHAT, tok, "x:1")
    assert len(pairs) == 2
    for (prompt, completion), turn in zip(pairs, (2, 4)):
        assert prompt == encode_chat(tok, CHAT[:turn])  # the ids run --chat-template gives the model
        assert tok.decode(completion) == CHAT[turn]["content"] + tok.eos_token  # the reply, then EOS
        rendered = tok.apply_chat_template(CHAT[:turn + 1], tokenize=False)
        assert rendered.startswith(tok.decode(prompt + completion))
    if style == "llama3":  # the case that was refused: the prompt's "\n\n" is one token, two before a word
        last = tok.convert_ids_to_tokens(pairs[0][0][-1])
        joined = tok(tok.decode(pairs[0][0] + pairs[0][1]), add_special_tokens=False)["input_ids"]
        assert last == "ĊĊ" and joined[:len(pairs[0][0])] != pairs[0][0]
        assert pairs[0][0].count(tok.bos_token_id) == 1
    # a JSONL file of user messages in run: the prompt is the conversation up to the generation prompt
    data = tmp_path / "users.jsonl"
    data.write_text(json.dumps({"id": "a", "prompt": "Say hi."}) + "\n"
                    + json.dumps({"id": "b", "messages": CHAT[:4]}) + "\n")
    task = load_task(str(data), chat_template=True)
    a, b = task.examples()
    assert task.encode(a, tok) == encode_chat(tok, CHAT[1:2]) and task.encode(b, tok) == pairs[1][0]


def test_a_prompt_that_starts_with_bos_gets_no_second_one(bases, tmp_path):
    tok = tokenizer_of(bases["llama3"])
    rendered = tok.apply_chat_template(CHAT[1:2], tokenize=False, add_generation_prompt=True)
    assert rendered.startswith(tok.bos_token) and tok(rendered)["input_ids"][:2] == [tok.bos_token_id] * 2
    data = tmp_path / "pasted.jsonl"
    data.write_text(json.dumps({"id": "a", "prompt": rendered}) + "\n" + json.dumps({"id": "b", "prompt": "hi"}) + "\n")
    pasted, plain = JsonlTask(data).examples()
    assert JsonlTask(data).encode(pasted, tok) == encode_chat(tok, CHAT[1:2])  # one BOS, as the template writes it
    assert JsonlTask(data).encode(plain, tok)[:2] == [tok.bos_token_id, *tok("hi", add_special_tokens=False)["input_ids"][:1]]
    train_data = tmp_path / "train.jsonl"
    train_data.write_text(json.dumps({"prompt": rendered, "completion": "hello world"}) + "\n")
    (prompt, completion), = [file_pairs(train_data, tok, None)[0]]
    assert prompt == encode_chat(tok, CHAT[1:2]) and tok.decode(completion) == "hello world" + tok.eos_token


def test_chat_data_refusals_name_the_problem(bases):
    tok = tokenizer_of(bases["chatml"])
    user = {"role": "user", "content": "hi"}
    cases = {"'messages' is empty": [],
             "message 2 has the role 'assistent', which is not one of system, user, assistant, tool": [
                 user, {"role": "assistent", "content": "hello"}],
             "the assistant's message 2 is empty": [user, {"role": "assistant", "content": ""}, user,
                                                    {"role": "assistant", "content": "x"}]}
    for expected, messages in cases.items():
        with pytest.raises(TrainError, match=expected):
            chat_pairs(messages, tok, "x:1")
    # a role the template names (ChatML's 'tool') is accepted; with Llama-3's template it is not
    assert len(chat_pairs([user, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}], tok, "x:2")) == 1
    with pytest.raises(TrainError, match="role 'tool', which is not one of system, user, assistant \\(the chat"):
        chat_pairs([user, {"role": "tool", "content": "42"}], tokenizer_of(bases["llama3"]), "x:3")


def test_the_mask_token_takes_a_spare_row_or_grows_the_embeddings(bases):
    from transformers import AutoModelForCausalLM

    for name in ("chatml", "llama3", "full"):
        before = AutoModelForCausalLM.from_pretrained(bases[name], dtype=torch.float32)
        rows = before.get_input_embeddings().weight.shape[0]
        said = []
        model, tok = build_model(TrainConfig(out="", **TINY), bases[name], log=said.append)
        added = [tok.mask_token_id] + ([tok.pad_token_id] if name != "chatml" else [])  # ChatML has a pad token
        own = len(tok) - len(added)
        assert len(said) == 1 and said[0].startswith("tokens: added <|mask|>"), said
        if name == "full":  # no spare row: it grows by the tokens added, never shrinks
            assert model.get_input_embeddings().weight.shape[0] == len(tok) == rows + 2 == model.config.vocab_size
            assert f"grew to {len(tok)} rows" in said[0]
        else:
            assert model.get_input_embeddings().weight.shape[0] == rows == model.config.vocab_size  # kept
            assert f"in spare rows of the embeddings ({rows} rows for {own} tokens; vocab_size kept)" in said[0]
        layers = [(model.get_input_embeddings(), before.get_input_embeddings())]
        if not model.config.tie_word_embeddings:
            layers.append((model.get_output_embeddings(), before.get_output_embeddings()))
        for layer, was in layers:
            mean = was.weight[:own].mean(0)
            for i in added:  # set like a new token: the mean of the tokenizer's rows (a resize's rule)
                assert torch.allclose(layer.weight[i], mean, atol=1e-5), (name, i)  # a resize adds 1e-9-covariance noise
            assert torch.equal(layer.weight[:own], was.weight[:own])  # the tokens the model had, untouched
            if name != "full":  # the spare rows no token took, as they were
                assert torch.equal(layer.weight[own + len(added):], was.weight[own + len(added):])


@pytest.mark.parametrize("style", ["llama3", "chatml"])
def test_a_published_look_alike_trains_exports_and_decodes_with_its_chat_template(bases, style, tmp_path):
    from safetensors.torch import load_file

    from sbd_bench.cli import main
    from sbd_bench.training.train import train

    data = tmp_path / "data.jsonl"
    if style == "llama3":  # multi-turn chat data
        data.write_text("".join(json.dumps({"messages": CHAT}) + "\n" for _ in range(3)))
    else:  # prompt/completion data on a ChatML base
        data.write_text("".join(json.dumps({"prompt": f"{q}", "completion": a}) + "\n"
                                for q, a in (("Say hi.", "hello"), ("12 plus 30?", "42"), ("cat?", "mat"))))
    out, said = tmp_path / "ft", []
    train(TrainConfig(out=str(out), base=str(bases[style]), data=str(data), **TINY), log=said.append)
    assert sum(line.startswith("tokens: added <|mask|>") and "vocab_size kept" in line for line in said) == 1
    config, base_config = (json.loads((folder / "config.json").read_text()) for folder in (out, bases[style]))
    weights = load_file(out / "model.safetensors")
    assert config["vocab_size"] == base_config["vocab_size"]
    assert weights["model.embed_tokens.weight"].shape[0] == base_config["vocab_size"]
    users = tmp_path / "users.jsonl"
    users.write_text(json.dumps({"id": "1", "prompt": "Say hi."}) + "\n"
                     + json.dumps({"id": "2", "messages": CHAT[:4]}) + "\n")
    rc = main(["run", "--model", str(out), "--task", str(users), "--chat-template", "--solver", "ntp,entropy_bounded",
               "--max-new-tokens", "6", "--block-size", "4", "--device", "cpu", "--threads", "1", "--no-cost-curve",
               "--out", str(tmp_path / "run")])
    records = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert rc == 0 and len(records) == 4 and not any(r["error"] for r in records)
    tok = tokenizer_of(out)
    assert {r["prompt_tokens"] for r in records if r["id"] == "1"} == {len(encode_chat(tok, CHAT[1:2]))}


def test_plan_counts_the_rows_training_trains(bases, capsys):
    """`--plan --base` plans the model `train` builds: the mask (and pad) row where the embedding has no
    spare one, none where it has."""
    from sbd_bench.cli import main

    for name in ("full", "chatml"):
        model = build_model(TrainConfig(out="", **TINY), bases[name])[0]
        capsys.readouterr()
        assert main(["train", "--plan", "--base", str(bases[name]), "--device", "cpu"]) == 0
        planned = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert planned["parameters"] == sum(p.numel() for p in model.parameters()), name
        assert planned["embedding_rows"] == model.get_input_embeddings().weight.shape[0], name
