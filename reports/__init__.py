"""HTML reports (``fedaudit.reports``): the leakage report and ``compare``.

The full report lands with its own issue; until then a run's results are in
``metrics.json``, ``history.csv`` and ``wire.jsonl``.
"""
