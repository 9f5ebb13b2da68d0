"""From per-file summaries to a report's numbers: :mod:`._fold` sums the files' segments per step x
role x stage x rank under the filters, :mod:`._stats` compares the ranks of a stage and names its
straggler, :mod:`._timeline` says where each step's time went across roles and :mod:`._findings` holds the
rules that say it in words (one list, ranked in one place); :mod:`._compare` (with :mod:`._compare_stats`
and :mod:`._compare_words`) judges two runs.

They take what :mod:`instrument.analyze.traces` read and give :mod:`instrument.analyze.model` values; they
never import a renderer.
"""
