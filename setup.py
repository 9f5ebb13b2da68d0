"""One build step beyond pyproject.toml: docs/*.md and the example configurations travel in the wheel.

They are copied into ``instrument/docs`` and ``instrument/examples`` of the built package, so
``instrument docs`` and ``instrument plan --example`` work after ``pip install`` while the pages and
configurations keep one copy in the repository (an editable install reads them from the checkout).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# folder of the repository -> what of it ships; instrument/_shipped.py reads the checkout with the same patterns
SHIPPED = {"docs": "*.md", "examples": "verl_*.yaml"}


class BuildWithDocs(build_py):
    """``build_py``, then the shipped files copied into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout's own folders are read in place
        for folder, pattern in SHIPPED.items():
            target = Path(self.build_lib) / "instrument" / folder
            target.mkdir(parents=True, exist_ok=True)
            for source in sorted((ROOT / folder).glob(pattern)):
                shutil.copyfile(source, target / source.name)


setup(cmdclass={"build_py": BuildWithDocs})
