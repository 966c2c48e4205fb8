"""mkdocs hooks: the site carries the files its pages show from beside docs/.

The pages link the screenshots as ``../screenshots/NAME.svg`` and the licence as
``../LICENSE``: right on GitHub and in a checkout, outside the site's docs folder. Here those
files join the site (as if they were in docs/) and the pages' links are pointed at them, so
the built site shows every image and every link leads somewhere (tests/test_docs.py checks
the built pages).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
# Link prefix in a page (relative to docs/) -> the site path the files take.
OUTSIDE = {"../screenshots/": "screenshots/"}
SINGLE = {"../LICENSE": "LICENSE.txt"}


def on_files(files, config):
    for path in sorted((REPO / "screenshots").glob("*.svg")):
        files.append(File.generated(config, f"screenshots/{path.name}", abs_src_path=str(path)))
    for link, name in SINGLE.items():
        source = (REPO / "docs" / link).resolve()
        if source.is_file():
            files.append(File.generated(config, name, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")  # pages in docs/decisions/ are one folder down
    up = "../" * depth
    for prefix, target in OUTSIDE.items():
        markdown = markdown.replace(f"]({up}{prefix}", f"]({up}{target}")
    for link, name in SINGLE.items():
        markdown = re.sub(rf"\]\({re.escape(up + link)}\)", f"]({up}{name})", markdown)
    return markdown
