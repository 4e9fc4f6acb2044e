"""Micro-benchmarks run on one CPU thread unless SBD_BENCH_THREADS says otherwise: on a shared
machine two OpenMP threads wait for each other whenever another process holds a core (STACK.md)."""
import os

import torch

torch.set_num_threads(int(os.environ.get("SBD_BENCH_THREADS", "1")))
