"""The run machinery: solver configurations x tasks x examples on one model, written as records.

The harness (``harness``: run, resume, provenance), sample records (``samples``), batched runs
(``batches``), data parallelism under torchrun (``distributed``), memory sampling (``memory``), the
measured per-forward cost curve (``costcurve``) and the ``throughput`` command.
"""
