"""A HangReport as text: the verdict, each finding's one-line cause, the collective, the ranks
and where each named rank is. Every string from a dump is escaped (``safe_text``)."""

from __future__ import annotations

import textwrap

from gputop.core.format import safe_text
from gputop.diagnostics.findings import CATALOGUE
from gputop.diagnostics.hang.attribution import HangFinding, HangReport


def headline(report: HangReport) -> str:
    """One line: the primary finding's title, or why the job looks healthy."""
    f = report.primary
    if f is not None:
        return safe_text(f.title)
    if report.healthy_reason:
        return safe_text(report.healthy_reason)
    return safe_text(report.notes[0]) if report.notes else report.verdict


def format_report(report: HangReport, width: int = 100) -> str:
    def wrap(text: str, indent: str = "  ") -> list[str]:
        return textwrap.wrap(safe_text(text), width=width, initial_indent=indent,
                             subsequent_indent=indent + "  ") or [indent]

    out: list[str] = []
    meaning = CATALOGUE.get(report.verdict, "")
    missing = ", ".join(map(str, report.missing_ranks[:8]))
    more = report.missing_count - min(8, len(report.missing_ranks))
    out.append(f"Flight Recorder: {len(report.ranks)} rank dump(s)"
               + (f", no dump from rank(s) {missing}" if missing else "")
               + (f" and {more} more ({report.missing_count} ranks)" if more > 0 else ""))
    out.append(f"verdict: {report.verdict}" + (f" - {meaning}" if meaning else ""))
    out.append("")
    out += wrap(headline(report), indent="")
    for i, f in enumerate(report.findings):
        out.append("")
        out.append(f"[{f.severity}] {f.id}" + ("" if i else "  (the cause)"))
        if i:
            out += wrap(f.title)
        if isinstance(f, HangFinding):
            if f.collective and f.seq is None:  # from stacks alone: no group, no sequence
                out += wrap(f"collective: {f.collective}")
            elif f.collective:
                pg = f.process_group or {}
                out += wrap(f"collective: {f.collective} #{f.seq} of process group "
                            f"{pg.get('id')} ({pg.get('desc') or 'no description'}), "
                            f"state {f.state}"
                            + (f", sizes {[list(s) for s in f.sizes]}" if f.sizes else "")
                            + (f" {','.join(f.dtypes)}" if f.dtypes else ""))
            if f.ranks:
                out += wrap(f"named: rank(s) {', '.join(map(str, f.ranks))}")
            for c in f.culprits:
                out += wrap(f"rank {c['rank']}: {c['detail']}")
            if f.waiting_ranks:
                out += wrap(f"waiting: rank(s) {', '.join(map(str, f.waiting_ranks))}"
                            + (f" for {f.since_s:.0f} s" if f.since_s is not None else "")
                            + (" (by the dumps' own clock)" if f.waited_s is not None else ""))
            for s in f.symptoms[:12]:
                pg = s["process_group"]
                out += wrap(f"symptom: {pg.get('desc') or pg.get('id')} {s['collective']} "
                            f"#{s['seq']}: rank(s) {', '.join(map(str, s['waiting_ranks']))} "
                            f"wait because of rank(s) {', '.join(map(str, s['because_of']))}")
            if len(f.symptoms) > 12:
                out += wrap(f"symptom: ... {len(f.symptoms) - 12} more group(s)")
            if f.blocked_ranks:
                out += wrap(f"blocked: rank(s) {', '.join(map(str, f.blocked_ranks))} (late here "
                            "because they wait in another group's collective)")
            for c in f.calls:
                out += wrap(f"call of rank(s) {', '.join(map(str, c['ranks']))}: {c['call']}")
            named = set(f.ranks)
            for r, line in f.rank_lines:
                if r in named or len(f.rank_lines) <= 8:
                    out += wrap(f"rank {r}: {line}")
        else:
            out += wrap(f"evidence: {f.evidence}")
        out += wrap(f"fix: {f.fix}")
        out += wrap(f"next: {f.next_step}")
    if report.notes:
        out.append("")
        for note in report.notes:
            out += wrap(f"note: {note}", indent="")
    return "\n".join(out) + "\n"
