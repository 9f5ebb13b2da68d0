"""Real headless Chromium for the page tests (``apt-get install -y chromium``; skipped without it).

:func:`probe` loads a copy of a page with a script of the test's own that reports what the page drew as JSON
into a ``<pre id="probe">``, with every console error and uncaught exception the page raised, offline (every
host name resolves to nothing), on virtual time; then it screenshots the page itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium) for the browser test"
)
_HANG_GUARD_S = 300  # a guard against a hung browser, not a timing: the page runs on virtual time
_ERRORS_HOOK = (
    "<script>window.__probeErrors=[];window.addEventListener('error',function(e){__probeErrors.push(String(e.message))});"
    "(function(){var ce=console.error;console.error=function(){__probeErrors.push(Array.from(arguments).join(' '));"
    "ce.apply(console,arguments)}})();</script>"
)


@dataclass(frozen=True)
class Probed:
    """What the probe script reported (``errors``: the page's console errors), the console lines Chromium
    logged, and the screenshot of the page."""

    seen: dict[str, Any]
    console: list[str]
    screenshot: Path


def probe(page: Path, script: str, tmp_path: Path, *, window: str = "1300,2400") -> Probed:
    """Load ``page`` with ``script`` (a ``<script>`` that appends ``<pre id="probe">JSON</pre>``) in Chromium."""
    probed = tmp_path / f"probed-{page.name}"
    text = page.read_text(encoding="utf-8")
    probed.write_text(text.replace("<head>", "<head>" + _ERRORS_HOOK, 1).replace("</body>", script + "</body>", 1))
    base = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # should the page ask the network, nothing answers
        "--virtual-time-budget=30000",
        "--enable-logging=stderr",
        "--v=0",
    ]
    env = {**os.environ, "HOME": str(tmp_path)}
    dump = subprocess.run(
        [*base, f"--window-size={window}", "--dump-dom", probed.as_uri()],  # the layout the screenshot shows
        capture_output=True,
        text=True,
        timeout=_HANG_GUARD_S,
        env=env,
        check=False,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', dump.stdout, re.S)
    assert found, f"the probe wrote nothing; stderr:\n{dump.stderr[-3000:]}"
    seen = json.loads(
        found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )
    console = [line for line in dump.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    shot = tmp_path / f"{page.stem}.png"
    subprocess.run(
        [*base, "--hide-scrollbars", f"--window-size={window}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=_HANG_GUARD_S,
        env=env,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return Probed(seen, console, shot)
