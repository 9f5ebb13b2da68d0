"""The end of a run: one user finish command, on the chosen ranks, bounded and never raising.

:mod:`._coordinator` decides when and where the command runs (after the last step, once per
chosen rank, after the peers met); :mod:`._hook` builds its environment and runs it;
:mod:`._launch` starts ``/bin/sh`` in its own process group and reads its output; :mod:`._reaper`
is the stdlib-only watchdog script that kills the group at the timeout even if this process dies;
:mod:`._progress` shows a long hook's time against its timeout on a terminal.
"""
