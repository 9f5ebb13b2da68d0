"""Reading a ``save_path``: which trace files there are and who wrote each (:mod:`._discover`,
:mod:`._names`), which of them the filters keep (:mod:`._selection`), and what each holds, read in one
streaming pass (:mod:`._reader`, :mod:`._stream`, :mod:`._scanner`, :mod:`._steps`, :mod:`._gpu`) behind a
guard on what is decoded (:mod:`._safe_io`), here or as Ray tasks across a cluster (:mod:`._ray`). Beside
them: the timeline files (:mod:`._timelines`, :mod:`._trace_spans`), the memory files (:mod:`._snapshots`),
the ops a comparison's causes and the page's top ops read again (:mod:`._ops`, :mod:`._details`), and
what an export layout copies (:mod:`._exports`).

What comes out is per file: :class:`~instrument.analyze.TraceFile`, :class:`~instrument.analyze.Skipped`
and :class:`._reader.FileScan`; adding files up is :mod:`instrument.analyze.analyzers`' part. The
scanner's GPU and step accounting lives here because it is fed event by event in that same pass.
Standard library only at import time.
"""
