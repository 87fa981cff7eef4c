"""Sphinx configuration for the ratelimits docs site (`make docs`).

The pages are Markdown (MyST); the API reference is read from the docstrings, with
Django set up on the demo project's settings so the app's modules import as in a project.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
django.setup()

project = "ratelimits"
author = "the ratelimits authors"
copyright = "2026, the ratelimits authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# `[text](page.md#a-heading)` links are checked: every heading up to level 4 is an anchor.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# `text` in a docstring is code, as in the Markdown pages.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = "ratelimits"
html_static_path: list[str] = []
