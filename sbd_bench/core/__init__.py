"""The decoding core: everything that touches the model and nothing that knows of runs.

Model loading (``model``), attention masks (``masks``), KV caches (``cache``), the decoder with its
prefill / NTP step / block step and the one place NFE is counted (``decoding``), batched decoding
(``batching``) and the CUDA fast path (``fastpath``).
"""
