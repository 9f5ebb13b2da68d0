"""From per-file summaries to a report's numbers: :mod:`._fold` sums the files' segments per step x
role x stage x rank under the filters, :mod:`._stats` compares the ranks of a stage and names its
straggler, :mod:`._snapshots` lists the memory files beside the traces (with their peaks).

They take what :mod:`instrument.analyze.traces` read and give :mod:`instrument.analyze.model` values.
"""
