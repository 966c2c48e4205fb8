"""The live rules over a node's series from Prometheus (dcgm-exporter's, or any node without
gputop's own findings), as replay runs them over a recording.

Each (instance, gpu)'s samples become ``GpuSample``s of one ``Snapshot`` per time, fed in
order to the node's ``LiveDiagnosis``. What DCGM does not give stays None and the rules say
what they could not assess (``coverage`` plus the lines below). Two adaptations, both because
a store holds one sample per scrape interval where the rules expect about one a second:

* a sample stands for the interval up to it (as a sample does for the rules, ``hysteresis``),
  so when samples are further apart than the rules' window allows, the sample is also given at
  two earlier instants inside its interval (``FILL_S`` apart) for the window to hold the three
  samples it needs; the rules run once per real sample;
* DCGM names no process, only the workload that holds the GPU (``pod``, ``hpc_job``): it is
  given as one process the host cannot see (pid 0), and a finding about it is rewritten to name
  the workload (and a next step that reaches it) instead of a pid.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from gputop.core.model import DriverInfo, GpuSample, HostSample, Owner, ProcSample, Snapshot
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live import LiveDiagnosis
from gputop.diagnostics.live.common import MIN_SAMPLES, WINDOW_S
from gputop.diagnostics.live.coverage import Coverage
from gputop.fleet.prometheus.sources import CLOCK_EVENT_BITS, Columns, GpuRef

FILL_S = WINDOW_S / MIN_SAMPLES  # 3 samples in the rules' window
HELD_SHARE = 0.05  # memory used that counts as a GPU held (as gpu-idle's own threshold)
XID_LOST = 79  # fallen off the bus
DRIVER = DriverInfo(available=True)

DCGM_NOTES = (
    "DCGM names no process: dataloader-stall, host-bound, host-sync and contention not assessed "
    "(they need a process's CPU, states or threads)",
    "no agent step times (gputop run): hung judged from GPU work alone; no step time, MFU or "
    "goodput; imbalance from utilization only",
)


def owner_text(labels: dict[str, str]) -> str:
    """Who holds a GPU, from its labels (escaped already): "Slurm job 4242", "pod ns/name"."""
    if labels.get("hpc_job"):
        return f"Slurm job {labels['hpc_job']}"
    if labels.get("pod"):
        ns = labels.get("namespace")
        return f"pod {ns}/{labels['pod']}" if ns else f"pod {labels['pod']}"
    return ""


def owner_step(labels: dict[str, str], host: str) -> str:
    """A command that reaches the workload (every value quoted)."""
    if labels.get("hpc_job"):
        return (f"srun --jobid={shlex.quote(labels['hpc_job'])} --overlap -w {shlex.quote(host)}"
                " py-spy dump --pid $(pgrep -n python)")
    if labels.get("pod"):
        ns = f" -n {shlex.quote(labels['namespace'])}" if labels.get("namespace") else ""
        return f"kubectl{ns} exec {shlex.quote(labels['pod'])} -- py-spy dump --pid 1"
    return f"ssh {shlex.quote(host)} nvidia-smi"


def _events(mask: float | None) -> tuple[str, ...]:
    if mask is None:
        return ()
    bits = int(mask)
    return tuple(name for name, bit in CLOCK_EVENT_BITS.items() if bits & bit)


class NodeDiagnosis:
    """One node's live rules, fed the samples Prometheus holds, newest last."""

    def __init__(self, instance: str, host: str) -> None:
        self.instance = instance
        self.host = host
        self._host = HostSample(hostname=host)  # every snapshot's: DCGM gives no host sample
        self.diagnosis = LiveDiagnosis(own_pid=-1)
        self.coverage = Coverage()
        self.last_time: float | None = None
        self.refs: dict[int, GpuRef] = {}
        self.xid: dict[int, int] = {}  # GPU -> its last XID (non-zero)
        self._procs: dict[int, tuple[tuple, tuple[ProcSample, ...]]] = {}

    def feed(self, refs: dict[int, GpuRef], rows: dict[int, int | None],
             columns: Columns) -> None:
        """Take every sample newer than the last one fed, in time order: ``rows`` are the
        node's GPUs' rows (index -> row, None: no series) of the refresh's ``columns``."""
        self.refs = refs
        node_rows = list(rows.values())
        for k, t in enumerate(columns.times()):
            if self.last_time is not None and t <= self.last_time:
                continue
            if not columns.has(node_rows, k):
                continue
            snap = self._snapshot(t, k, refs, rows, columns)
            gap = None if self.last_time is None else t - self.last_time
            # Fill the rules' window when the store's samples are further apart than it needs.
            for j in (2, 1):
                filler = t - j * FILL_S
                if gap is None or gap > j * FILL_S + 0.5:
                    if self.last_time is None or filler > self.last_time:
                        self.diagnosis.update(replace(snap, time=filler), evaluate=False)
            self.diagnosis.update(snap)
            self.coverage.add(snap)
            self.last_time = t

    def _snapshot(self, t: float, k: int, refs: dict[int, GpuRef], rows: dict[int, int | None],
                  columns: Columns) -> Snapshot:
        gpus = []
        for index in sorted(refs):
            row = rows.get(index)

            def get(name: str, _row=row) -> float | None:
                return columns.get(_row, name, k)

            ref = refs[index]
            used, total = get("mem_used"), get("mem_total")
            xid = get("xid")
            if xid:
                self.xid[index] = int(xid)
            elif xid is not None:
                self.xid.pop(index, None)
            procs: tuple[ProcSample, ...] = ()
            held = owner_text(ref.labels)
            if held or (used and total and used >= HELD_SHARE * total):
                procs = self._held(index, ref, held, used)
            ecc = get("ecc_volatile")
            gpus.append(GpuSample(
                index=index, uuid=ref.uuid, name=ref.model,
                lost=xid == XID_LOST,
                util_gpu=get("util_gpu"), util_mem=get("util_mem"),
                mem_used=int(used) if used is not None else None,
                mem_total=int(total) if total is not None else None,
                power_w=get("power_w"), power_limit_w=get("power_limit_w"),
                energy_j=get("energy_j"),
                temperature_c=get("temperature_c"), sm_clock_mhz=get("sm_clock_mhz"),
                sm_clock_max_mhz=get("sm_clock_max_mhz"),
                pcie_rx_mbs=get("pcie_rx_mbs"), pcie_tx_mbs=get("pcie_tx_mbs"),
                clock_events=_events(get("clock_events")),
                ecc_volatile=int(ecc) if ecc is not None else None,
                sm_active=get("sm_active"), tensor_active=get("tensor_active"),
                dram_active=get("dram_active"), processes=procs))
        return Snapshot(time=t, host=self._host, driver=DRIVER, gpus=tuple(gpus))

    def _held(self, index: int, ref: GpuRef, held: str, used: float | None
              ) -> tuple[ProcSample, ...]:
        """The workload as one process the host cannot see; the same object while nothing
        about it changes (a window holds many samples of a GPU: they share it)."""
        gpu_mem = int(used) if used is not None else None
        key = (held, gpu_mem, tuple(sorted(ref.labels.items())))
        cached = self._procs.get(index)
        if cached is not None and cached[0] == key:
            return cached[1]
        procs = (ProcSample(
            pid=0, name=held or "unknown workload", visible=False, gpu_mem=gpu_mem,
            owner=Owner(pod=ref.labels.get("pod"), namespace=ref.labels.get("namespace"),
                        container=ref.labels.get("container"),
                        slurm_job=ref.labels.get("hpc_job")),
            hidden="DCGM names the workload, not its processes"),)
        self._procs[index] = (key, procs)
        return procs

    def findings(self) -> list[Finding]:
        """The active findings, each naming the workload that holds its GPU."""
        out = []
        for f in self.diagnosis.findings():
            ref = self.refs.get(f.gpu) if f.gpu is not None else None
            labels = ref.labels if ref is not None else {}
            held = owner_text(labels)
            if f.pid == 0:
                who = held or "a workload DCGM does not name"
                f = replace(f, title=f.title.replace("pid 0", who),
                            evidence=f.evidence.replace("pid 0", who),
                            next_step=owner_step(labels, self.host), pid=None)
            elif held and held not in f.evidence:
                f = replace(f, evidence=f"{f.evidence} (held by {held})")
            out.append(f)
        for index, code in sorted(self.xid.items()):
            if code == XID_LOST:
                continue  # the rules' own "fell off the bus"
            out.append(Finding(
                id="hardware-errors", severity="critical" if code in (48, 63, 64, 74, 94, 95)
                else "warning",
                title=f"GPU {index} reported Xid {code}",
                evidence=f"DCGM's XID field = {code} on GPU {index} of {self.host}",
                fix=("Look up the Xid in NVIDIA's Xid catalogue; memory (48, 63, 64, 94, 95) and "
                     "NVLink (74) errors mean draining the node and checking the GPU"),
                next_step=f"ssh {shlex.quote(self.host)} dmesg -T | grep -i xid",
                gpu=index))
        return out

    def notes(self) -> list[str]:
        return [*self.coverage.notes(), *DCGM_NOTES]
