"""Command-line options of the commands that decode (`run`, `tune` and `throughput`), declared once, so
that their names, defaults and help cannot drift apart. Only argparse here: `--help` stays fast."""
from __future__ import annotations

import argparse

DTYPES = ["auto", "float32", "bfloat16", "float16"]


def add_decode_options(parser: argparse.ArgumentParser) -> None:
    """The model, how it runs, and what every decode shares (block size, budget, seed, sampling, plugins)."""
    parser.add_argument("--model", default="sbd-tiny", help="shipped model name or local HF folder")
    parser.add_argument("--family", default=None, metavar="NAME",
                        help="the model folder's family (sbd, nemotron_labs_diffusion, sdar, fast_dllm_v2; list "
                             "--models); default: read from its config.json or sbd_family.json")
    parser.add_argument("--block-size", type=int, default=16, help="k, the positions decoded together in a block")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: each task's own budget")
    parser.add_argument("--max-block-forwards", type=int, default=None, metavar="N",
                        help="forwards a block may take; at the last one every position still masked is revealed "
                             "(default: 2 x --block-size; only a solver that revokes can need more than the block size)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of randomised solvers (random_order) and, hashed per example and sample, of sampling")
    parser.add_argument("--plugins", action="append", default=[], metavar="DIR", help="folder of solver .py files")
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda[:N]")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--fast", action=argparse.BooleanOptionalAction, default=None,
                        help="preallocated KV cache + CUDA graphs (default: on for CUDA, off on CPU)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile the fast path's forward inside its graphs (default: on with the graphs; "
                             "--no-compile keeps graphs only)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample tokens at this temperature (0: greedy, argmax); a spec's temperature= overrides it")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="with a temperature: keep the most probable tokens whose mass reaches P (1: all)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="with a temperature: keep the K most probable tokens (0: all)")
    parser.add_argument("--exact", action="store_true",
                        help="compute every row of every forward alone (CPU): verified output = ntp's and batch N = "
                             "batch 1, bit for bit, in any dtype; several times slower (docs: 'Exact mode')")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 for a model under 100M parameters on the CPU, else the "
                             "cores the machine's load leaves free; recorded)")


def add_tune_options(parser: argparse.ArgumentParser) -> None:
    """`tune`'s own: the certificate's levels and the split of each task's examples."""
    parser.add_argument("--max-loss", type=float, default=0.02, metavar="EPS",
                        help="ε: certify settings whose accuracy loss against NTP (the share of examples NTP gets right "
                             "and the setting wrong) is at most this")
    parser.add_argument("--delta", type=float, default=0.1,
                        help="δ: the certificate may be wrong with at most this probability (over the calibration draw)")
    parser.add_argument("--calibration", type=int, default=300,
                        help="examples per task the settings are tested on (at least ln δ / ln(1 - ε): 114 at the defaults)")
    parser.add_argument("--held-out", type=int, default=200, help="examples per task the picks are checked on")
    parser.add_argument("--order-examples", type=int, default=20,
                        help="examples per task whose mean NFE orders each solver's settings before testing (most "
                             "forwards first); 0: test them in the order given in --solver")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the split of each task's examples by id")
