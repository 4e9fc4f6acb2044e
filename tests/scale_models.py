"""The scale tests' model: a tiny model with sharpened logits (varied outputs, few near-ties) over a
short alphabet, so batched and batch-1 decoding are compared on outputs that differ row by row."""
from tiny_models import build_tiny_model

SCALE_ALPHABET = "0123456789+-=*abcdefghij \n"


def build_scale_model(folder, family: str = "llama", seed: int = 0, max_positions: int = 64, **kw):
    return build_tiny_model(folder, family, seed=seed, max_positions=max_positions, alphabet=SCALE_ALPHABET,
                            sharpen=True, **kw)
