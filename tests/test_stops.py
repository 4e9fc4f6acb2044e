"""Stop tokens, stop strings and the token budget inside a block: generation ends as soon as the stop
is revealed and everything before it is revealed; what follows is dropped; NFE counts to there."""
import dataclasses

import torch
from transformers import LlamaForCausalLM

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import build_solver, solver_registry, verified


class ScriptedLlama(LlamaForCausalLM):
    """A real tiny Llama (real cache traffic) whose logits are replaced by a script: at generated index
    i it predicts script[i] with confidence rising with sharpness[i]. Block logits predict their own
    position; causal logits predict the next one."""

    script: list[int] = []
    sharpness: list[float] = []
    prompt_len: int = 0
    block_query: bool = True

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
        logits = torch.zeros_like(out.logits)
        for q, pos in enumerate(position_ids[0].tolist()):
            # a causal query (committed token or prompt) predicts pos + 1; a block query predicts pos
            is_block = bool(input_ids[0, q] == self.mask_id) or (self.block_query and q >= self.n_causal(input_ids))
            i = pos - self.prompt_len + (0 if is_block else 1)
            if 0 <= i < len(self.script):
                logits[0, q, self.script[i]] = self.sharpness[i]
        out.logits = logits
        return out

    def n_causal(self, input_ids):
        return input_ids.shape[1] - self.k if input_ids.shape[1] >= self.k else input_ids.shape[1]


def scripted(path, text: str, sharpness: list[float], k: int, prompt: str = "Q:"):
    lm = load_model(path, device="cpu", dtype="float32")
    model = ScriptedLlama.from_pretrained(path)
    tok = lm.tokenizer
    ids = [tok.convert_tokens_to_ids(c) if c != "$" else tok.eos_token_id for c in text]
    prompt_ids = tok(prompt)["input_ids"]
    model.script, model.sharpness, model.prompt_len = ids, sharpness, len(prompt_ids)
    model.mask_id, model.k = lm.mask_token_id, k
    return dataclasses.replace(lm, model=model.eval()), prompt_ids


def run(lm, prompt_ids, solver, k, **kw):
    name, params = solver
    return Decoder(lm, block_size=k, **kw).generate(prompt_ids, build_solver(solver_registry()[name], params))


def test_stop_token_revealed_early_waits_for_the_positions_before_it(tiny_models):
    # block of 8: "abcd$xyz"; right-to-left confidence, so x,y,z and $ come before a,b,c,d
    lm, prompt = scripted(tiny_models["llama"], "abcd$xyz", [1, 2, 3, 4, 5, 6, 7, 8], k=8)
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=64)
    assert gen.output_text == "abcd" and gen.stop_reason == "stop_token"
    assert gen.output_ids[-1] == lm.tokenizer.eos_token_id and gen.tokens == 5
    assert gen.nfe == 8  # z y x $ d c b a: the stop only counts once 'a' is revealed
    assert gen.revealed_per_forward == [0, 0, 0, 1, 1, 1, 1, 1] and gen.forwards_per_block == [8]


def test_stop_token_revealed_first_ends_the_block_at_its_prefix(tiny_models):
    # "abcd$xyz" with $ the surest, then x, y, z, then d, c, b, a: once $ is revealed the slots after it cannot
    # change the output, so the solver is not handed them: $ d c b a, 5 forwards (8 before: $ x y z d c b a)
    lm, prompt = scripted(tiny_models["llama"], "abcd$xyz", [1, 2, 3, 4, 9, 8, 7, 6], k=8)
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=64)
    assert gen.output_text == "abcd" and gen.stop_reason == "stop_token" and gen.tokens == 5
    assert gen.nfe == 5 and gen.revealed_per_forward == [1] * 5 and gen.forwards_per_block == [5]
    for solver in (("pc_sampler", {"lam": 0.0}), ("confidence", {"tau": 0.99}), ("wino", {})):
        gen = run(lm, prompt, solver, 8, max_new_tokens=64)
        assert gen.output_text == "abcd" and gen.nfe == 5, solver
    # verified: slot 0 is NTP's 'a'; $ d c b are drafted in 4 forwards (7 before: $ x y z d c b), one more judges
    fixed_k = build_solver(solver_registry()["fixed_k"], {"k": 1})
    gen = Decoder(lm, block_size=8, max_new_tokens=64).generate(prompt, verified(fixed_k))
    lm.model.block_query = False
    ntp = run(lm, prompt, ("ntp", {}), 8, max_new_tokens=64)
    assert gen.output_ids == ntp.output_ids and gen.nfe == 5


def test_stop_token_with_everything_before_it_ends_at_once(tiny_models):
    lm, prompt = scripted(tiny_models["llama"], "abcd$xyz", [8, 7, 6, 5, 4, 3, 2, 1], k=8)
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=64)
    assert gen.output_text == "abcd" and gen.nfe == 5 and gen.revealed_per_forward == [1] * 5


def test_stop_in_a_later_block_and_ntp(tiny_models):
    text = "abcdefgh" + "ij$klmno"
    lm, prompt = scripted(tiny_models["llama"], text, [5.0] * 16, k=8)
    gen = run(lm, prompt, ("entropy_bounded", {"gamma": 1e9}), 8, max_new_tokens=64)
    assert gen.output_text == "abcdefghij" and gen.nfe == 2 and gen.revealed_per_forward == [8, 3]
    assert gen.forwards_per_block == [1, 1]
    lm.model.block_query = False  # the NTP path has no block queries
    gen = run(lm, prompt, ("ntp", {}), 8, max_new_tokens=64)
    assert gen.output_text == "abcdefghij" and gen.nfe == 11 and gen.forwards_per_block == [8, 3]


def test_stop_string_and_budget(tiny_models):
    lm, prompt = scripted(tiny_models["llama"], "ab;cdefg", [8, 7, 6, 5, 4, 3, 2, 1], k=8)
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=64, stop_strings=(";",))
    assert gen.output_text == "ab" and gen.stop_reason == "stop_string" and gen.tokens == 3 and gen.nfe == 3
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=3)
    assert gen.output_text == "ab;" and gen.stop_reason == "max_new_tokens" and gen.nfe == 3
    # right-to-left: the slots past the budget are not the solver's to reveal, so c, b, a and the block ends
    lm, prompt = scripted(tiny_models["llama"], "abcdefgh", [1, 2, 3, 4, 5, 6, 7, 8], k=8)
    gen = run(lm, prompt, ("fixed_k", {"k": 1}), 8, max_new_tokens=3)
    assert gen.output_text == "abc" and gen.nfe == 3 and gen.revealed_per_forward == [1, 1, 1]
