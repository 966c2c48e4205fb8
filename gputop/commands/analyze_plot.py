"""`gputop analyze TRACE --plot FILE.svg`: each trace's roofline written as an SVG."""

from __future__ import annotations

import os
import sys
import tempfile


def plot_path(base: str, i: int) -> str:
    """FILE.svg for the first trace, FILE-2.svg, FILE-3.svg ... for the next."""
    if i == 0:
        return base
    stem, ext = os.path.splitext(base)
    return f"{stem}-{i + 1}{ext or '.svg'}"


def write_plots(analyses, base: str) -> bool:
    """Write one SVG per analysis, each whole or not at all; True if any failed (said on
    stderr in one line)."""
    from gputop.diagnostics.trace.reporting.roofline_plot import roofline_svg

    failed = False
    for i, a in enumerate(analyses):
        path = plot_path(base, i)
        if a.roofline is None:
            print(f"gputop: error: {a.file}: no GPU kernels, no roofline to plot ({path} not "
                  "written)", file=sys.stderr)
            failed = True
            continue
        svg = roofline_svg(a.roofline.to_json(), title=f"Roofline of {os.path.basename(a.file)}")
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".roofline-", suffix=".svg", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(svg)
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            print(f"gputop: error: {path}: cannot write the plot ({exc.strerror or exc})",
                  file=sys.stderr)
            failed = True
    return failed
