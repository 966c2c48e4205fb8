"""The README and every page of docs/ (including pages added later: they are found, not listed):
every relative link leads to a file that exists (and to a heading, for an anchor), every page is
in mkdocs.yml's nav, and every `gputop ...` command-line example parses with gputop's own parser
(what `gputop ... --help` accepts), global options and scenario names included."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

LINK = re.compile(r"(?<!\\)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE = re.compile(r"`([^`\n]+)`")
SHELL_BREAK = re.compile(r"\s(\||\|\||&&|;|>|>>|2>|2>&1|&)\s.*$")
ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
COMMENT = re.compile(r"\s+#\s.*$")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(?:\.\.\.)?$")


def _text_and_code(page: Path) -> tuple[list[str], list[str]]:
    """(prose lines, command lines of fenced code blocks) of a page. A ``console`` block's
    commands are its ``$ `` lines (the rest is output); a ``bash``/``sh``/``shell`` block (or one
    with no language) is all commands, a line ending in ``\\`` joined with the next; other
    blocks (text, json, yaml) hold none."""
    prose, code, fence, pending = [], [], None, ""
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fence = None if fence is not None else line.strip()[3:].strip() or "bash"
            continue
        if fence is None:
            prose.append(line)
        elif pending or fence in ("bash", "sh", "shell") or (
                fence == "console" and line.startswith("$ ")):
            pending += line.removeprefix("$ ").rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                code.append(pending.strip())
                pending = ""
    return prose, code


def _paragraphs(lines: list[str]) -> list[str]:
    """Prose joined into paragraphs: an inline code span may wrap onto the next line."""
    return " ".join(line.strip() or "\n" for line in lines).split("\n")


def github_slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = _text_and_code(page)
    return {github_slug(line.lstrip("#")) for line in prose if line.startswith("#")}


def links() -> list[tuple[Path, str]]:
    found = []
    for page in PAGES:
        prose, _ = _text_and_code(page)
        for line in prose:
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if not re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    found.append((page, target))
    return found


def test_there_are_pages_and_links():
    assert len(PAGES) > 10 and len(links()) > 30


@pytest.mark.parametrize("page,target", links(),
                         ids=lambda v: v.name if isinstance(v, Path) else v)
def test_every_link_leads_somewhere(page, target):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(REPO)}: link to {target}: no such file"
    assert REPO in dest.parents or dest == REPO, f"{page}: {target} leaves the repository"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{page.relative_to(REPO)}: no heading #{anchor} in {dest.name}"


def test_every_page_is_in_the_sites_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    for page in (REPO / "docs").rglob("*.md"):
        assert f": {page.relative_to(REPO / 'docs')}" in nav, f"{page.name} is not in mkdocs.yml"


def examples() -> list[tuple[str, str, bool]]:
    """(page, command line, inline) of every `gputop ...` example: commands of code blocks and
    inline code. Placeholders in capitals (PID, TRACE) stand for a value; usage patterns with
    [optional] or ... parts are not command lines and are left out; so are output lines
    (``gputop replay: ...``)."""
    found = []
    for page in PAGES:
        prose, code = _text_and_code(page)
        candidates = [(line, False) for line in code]
        for paragraph in _paragraphs(prose):
            candidates += [(text, True) for text in INLINE.findall(paragraph)]
        for text, inline in candidates:
            text = ENV_PREFIX.sub("", COMMENT.sub("", text).strip())
            if not text.startswith("gputop ") and text != "gputop":
                continue
            if any(mark in text for mark in ("[", "...", "…", "<", "{", "\\|", "`")):
                continue
            text = SHELL_BREAK.sub("", text)
            if len(text.split()) > 1 and text.split()[1].endswith(":"):
                continue
            found.append((page.relative_to(REPO).as_posix(), text, inline))
    return sorted(set(found))


@functools.cache
def _parser():
    from gputop.cli import build_parser

    return build_parser()


def parse(words: list[str]) -> str | None:
    """None when gputop's parser (and its check of the global options) accepts ``words``, else
    what it said."""
    from gputop.cli import _top_options_last, _validate_globals
    from gputop.core.errors import UsageError

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            # As main() reads them: the monitor's own options without `top` named.
            args = _parser().parse_args(_top_options_last(words))
        _validate_globals(args)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    except UsageError as exc:
        return str(exc)
    return None


def test_there_are_examples():
    assert len(examples()) > 40


@pytest.mark.parametrize("page,command,inline", examples())
def test_every_command_line_example_parses(page, command, inline):
    words = []
    for word in shlex.split(re.sub(r"\$\([^)]*\)", "4242", command))[1:]:
        if PLACEHOLDER.match(word):  # a value: a scenario after --demo, else a number or path
            word = "healthy" if words[-1:] == ["--demo"] else "4242"
        words.append(word)
    said = parse(words)
    # Prose names a command or an option on its own (`gputop capture`, `gputop --hosts`): the
    # words must exist; the values they take are for the examples to show.
    if inline and said and ("required" in said or "expected one argument" in said):
        said = None
    assert said is None, f"{page}: `{command}`: {said}"


REPO_PATH = re.compile(r"`((?:gputop|tests|benchmarks|deploy|scripts|docs)/[\w./-]+\.\w+)`")


def test_every_file_named_in_code_exists():
    """A file named in backticks (`gputop/sim/nvml.py`) is one the reader can open: a module
    that moved is renamed in the pages too."""
    missing = []
    for page in PAGES:
        prose, _ = _text_and_code(page)
        for path in REPO_PATH.findall("\n".join(prose)):
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(missing)


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: every page in the nav, every link inside the site resolved."""
    import subprocess
    import sys

    pytest.importorskip("mkdocs", reason="mkdocs-material is in the test extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-d", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "index.html").exists()
    # Every image and every link inside the site, on every built page, leads to a file of it
    # (the screenshots and the licence live beside docs/: the hooks bring them in).
    broken, images = [], 0
    for html in sorted(site.rglob("*.html")):
        if html.parent.name in ("search", "assets") or html.name == "404.html":
            continue
        text = html.read_text(errors="replace")
        for attr, target in re.findall(r'<(?:img|a)\b[^>]*?\b(src|href)="([^"#]*)', text):
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue  # an anchor, another site, mailto:
            images += attr == "src"
            resolved = (html.parent / target.split("?")[0]).resolve()
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.is_file() or site.resolve() not in resolved.parents:
                broken.append(f"{html.relative_to(site)}: {attr}={target}")
    assert images >= 8, images  # the screenshots are on the pages
    assert not broken, "\n".join(broken[:20])
