"""Build hook (metadata: pyproject.toml): a wheel of kvgate carries its data folders.

gates/, inventory/, reports/, traces/ and workloads/ stay at the top of the repository, where people edit them; the
build copies them into the wheel as harness/_data/, where an installed kvgate finds them (harness.paths).
An editable install needs no copy: it runs from the checkout and reads the repository's folders.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA_DIRS = ("gates", "inventory", "reports", "traces", "workloads")  # as harness.paths.DATA_DIRS


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in DATA_DIRS:
            dst = Path(self.build_lib) / "harness" / "_data" / name
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ROOT / name, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithData})
