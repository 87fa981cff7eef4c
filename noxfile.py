"""The suite on the interpreters and Django versions we support, oldest and newest pair.

`make test` runs the first pair in .venv; `make test-matrix` runs both, each in a virtual
environment of its own under .nox/, with the interpreters pyenv installed (or on PATH).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

#: (Python, Django) pairs: Django 5.2 LTS on the oldest Python we test, and the newest
#: Django on the newest Python (Django 6 needs Python 3.12 or later).
MATRIX = [("3.11", "5.2"), ("3.13", "6.1")]


def interpreter(version: str) -> str:
    """The path of Python `version` from pyenv when it has one, else the version for nox
    to find on PATH."""
    root = os.environ.get("PYENV_ROOT")
    if not root and shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}")) if root else []
    return found[-1] if found else version


@nox.session
@nox.parametrize(
    ("python", "django"),
    [(interpreter(python), django) for python, django in MATRIX],
    ids=[f"py{python}-django{django}" for python, django in MATRIX],
)
def tests(session: nox.Session, django: str) -> None:
    """The whole suite (arguments after `--` go to pytest)."""
    session.install("-e", ".[test]", f"django~={django}.0")
    session.run("python", "-m", "pytest", *session.posargs)
