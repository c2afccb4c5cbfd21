"""Kueue's own scheduler performance scenarios (``test/performance/scheduler``)
run through the whole of Quartermaster, beside Kueue's published figures and
the physical limit of each config: ``python -m bench.kueue_perf --help``.

``configs`` (Kueue's generator configs and figures, the limit), ``manifests``
(our objects for them), ``load`` (the generator), ``run`` (the stack and one
run), ``checks`` (what must hold), ``measure`` (the figures), ``profile``
(py-spy summaries).
"""
