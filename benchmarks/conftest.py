"""Micro-benchmarks run on one CPU thread unless SBD_BENCH_THREADS says otherwise: on a shared
machine two OpenMP threads wait for each other whenever another process holds a core (STACK.md).
Set per module and restored after, so the tests that share a pytest process keep their own setting."""
import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def bench_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SBD_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)
