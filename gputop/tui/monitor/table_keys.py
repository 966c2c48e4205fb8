"""The monitor's keys on the process table's rows: space tags (a recording: pauses), `J` tags
a job's ranks, `a` shows every process with an agent, GPU or not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputop.tui.monitor.replay_feed import ReplayFeed


class TableKeys:
    """Mixed into GputopApp: the key actions only; the App owns the table they act on."""

    feed: Any
    frame: Any
    table: Any

    if TYPE_CHECKING:
        def notify(self, *args: Any, **kwargs: Any) -> None: ...
        def action_toggle_pause(self) -> None: ...

    def action_space(self) -> None:
        """Space: tags the selected process (live); pauses a recording played back."""
        if isinstance(self.feed, ReplayFeed):
            self.action_toggle_pause()
            return
        n = self.table.toggle_tag()
        self.notify(f"{n} tagged: k signals them all, space again untags" if n
                    else "no process tagged", timeout=2)

    def action_tag_job(self) -> None:
        """`J`: tag every rank of the selected job (its job row, or one of its ranks)."""
        from gputop.core.job_groups import jobs_in

        row = self.table.selected_row()
        if row is None or self.frame is None:
            return
        jobs = jobs_in(self.frame.snapshot)
        job = next((j for j in jobs if j.job_id == row.job or row.pid in j.pids), None)
        if job is None:
            self.notify("the selected process is no rank of a job", severity="warning",
                        timeout=3)
            return
        n = self.table.toggle_tag([str(pid) for pid in sorted(job.pids)])
        self.notify(f"{n} tagged: the ranks of {job.job_id[:40]}", timeout=3, markup=False)

    def action_toggle_everyone(self) -> None:
        shown = self.table.toggle_everyone()
        self.notify("every process with an agent, GPU or not" if shown
                    else "GPU processes and their jobs only", timeout=2)
