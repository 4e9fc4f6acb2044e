"""The decoding core: everything that touches the model and nothing that knows of runs.

Model loading (``model``), attention masks (``masks``), KV caches (``cache``), the decoder with its
prefill / NTP step / block step, one loop per decode mode for batch 1 and batch N, and the one place
NFE is counted (``decoding``), the CUDA fast path (``fastpath``) and token choice above temperature 0
(``sampling``).
"""
