"""Training with the SBD objective (SBD.md §2): the two-copy layout, mask and losses (``objective``),
the loop and the ``train`` command (``train``), and the character tokenizer of the shipped models
(``tokenizer``).
"""
