"""The README's quick start names what the Makefile takes."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_names_the_demos_port_setting():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PORT \?= 8000$", makefile, re.MULTILINE)
    assert "runserver 127.0.0.1:$(PORT)" in makefile
    readme = (ROOT / "README.md").read_text()
    assert "`make demo PORT=8001`" in readme
