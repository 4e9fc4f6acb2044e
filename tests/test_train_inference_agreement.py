"""Training and inference see the same thing: the noisy half of the two-copy training input gives, for
each block, exactly the logits the decoding core computes for that block from its exact cache. A
mismatch here (block alignment, positions, masks) would make a well-trained model decode badly."""
import dataclasses

import pytest
import torch
from tiny_models import build_tiny_model

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.training.objective import make_batch, sbd_inputs


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("k", [4, 6])
def test_noisy_half_logits_equal_the_cached_block_forward(tmp_path, family, k):
    lm = load_model(build_tiny_model(tmp_path / family, family, sharpen=True), device="cpu", dtype="float32")
    lm = dataclasses.replace(lm, stop_token_ids=())
    tok = lm.tokenizer
    prompt = tok("12+34=")["input_ids"]
    completion = tok("46; so 46 it is", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    batch = make_batch([(prompt, completion)], [0], k, "sbd", torch.Generator().manual_seed(1),
                       tok.pad_token_id, lm.mask_token_id)
    ids, positions = sbd_inputs(batch)
    L = batch.ids.shape[1]
    with torch.no_grad():
        train_logits = lm.model(input_ids=ids, position_ids=positions, attention_mask=batch.mask).logits[0, L:]
    train_logits[:, lm.mask_token_id] = float("-inf")
    decoder = Decoder(lm, block_size=k, max_new_tokens=64)
    P = len(prompt)
    checked = 0
    for start in range(P, P + len(completion), k):  # every block of the completion
        committed = torch.tensor([(prompt + completion)[:start]])
        cache = decoder.new_cache(1, 256)
        decoder.prefill(committed[:, :-1], cache)
        block = batch.noisy[:, start:start + k]  # this block's masked/unmasked state in training
        logits = decoder.block_step(committed[:, -1:], block, start, cache)[0]
        assert torch.allclose(logits, train_logits[start:start + k], atol=1e-4, rtol=0), start
        checked += 1
    assert checked >= 3 and (batch.noisy == lm.mask_token_id).any()
