"""The run: what the public verbs do in this process (import them from :mod:`instrument`).

:mod:`._api` holds the verbs and their cheap disabled path; :mod:`._state` the flags that path
reads; :mod:`._session` the per-process run (which step and rank is profiled, the recorder, the
manifest, the finish hook) with its stage bookkeeping in :mod:`._stages`; :mod:`._triggers` the
slow-step / signal / file triggers; :mod:`._process` rank detection, signals and fork; and
:mod:`._info` the read-only :class:`RunInfo` that ``configure()`` returns; :mod:`._requests` the
request spans of a rollout (``instrument.request``). The one public module,
:mod:`.controller`, holds what a controller process (the Ray driver) needs to drive the runs of others.
"""
