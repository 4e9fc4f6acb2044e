"""The read-only side: records in, tables, plots and verdicts out. Imports neither torch nor the core.

The record files (``records``), definitions of every summary figure (``metrics``), the report
(``report``), regression checks against a baseline (``compare``), the cost model's arithmetic
(``roofline``) and the field's yardsticks, AUP and the PB score (``yardsticks``).
"""
