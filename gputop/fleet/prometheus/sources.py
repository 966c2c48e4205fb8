"""What is read from Prometheus, in a few batched queries whatever the number of nodes, and
how it maps onto the project's model.

Two sources, one shape. Nodes that run ``gputop exporter`` (``gputop_gpu_*`` series, their
findings in ``gputop_finding_active``, the agents' ``gputop_job_*`` series) and nodes that run
only NVIDIA's dcgm-exporter (``DCGM_FI_*`` fields with its ``Hostname``/``hostname``, ``pod``,
``namespace``, ``container`` and ``hpc_job`` labels). A node is its scrape target
(``instance``); its name is the exporter's host name where one is given.

Per refresh (nine queries, sent together):
1. one range query per source for every GPU field (each metric aggregated to its
   ``(__name__, instance, gpu)``): the bytes stay ~100 per GPU per field per sample, whatever
   labels the exporters add;
2. the inventory (two instant queries, one per source): each GPU's owner labels, model, UUID;
3. the exporters' host names, the active findings and the job series (three instant queries);
4. each GPU's utilization over the last hour and how much of the hour it was seen (one query),
   for the wasted GPU-hours.
Every label value is untrusted: it is escaped before it is shown (``one_line``) and never used
as query text (filters are quoted by ``client.quote``).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from array import array
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from gputop.fleet.prometheus import dcgm_names
from gputop.fleet.prometheus.client import (
    LABEL_NAME,
    PromClient,
    PromError,
    RangeSeries,
    number,
    quote,
)
from gputop.fleet.wire import one_line

MIB = 1048576.0
WASTE_WINDOW_S = 3600.0  # wasted GPU-hours are counted over the last hour
MAX_GPU_INDEX = 4096
OWNER = ("pod", "namespace", "container", "hpc_job")
EXTRA = ("user", "partition")  # labels some sites add (Slurm's job user and partition)
# NVML's clock-event reason bits (as gputop.exporter.metrics names them; dcgm-exporter's
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / CLOCKS_EVENT_REASONS are the same bitmask).
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}

# dcgm-exporter's fields, both namings (dcgm_names): accepted name -> (model field, scale).
DCGM_FIELDS: dict[str, tuple[str, float]] = dcgm_names.all_names()
DCGM_MODEL_FIELDS = tuple(dcgm_names.by_model())
# Names every dcgm GPU has in one naming or the other: the inventory is read from these.
DCGM_INVENTORY = tuple(n for model in ("mem_used", "util_gpu")
                       for n in dcgm_names.by_model()[model])
GPUTOP_FIELDS: dict[str, tuple[str, float]] = {
    "gputop_gpu_utilization_percent": ("util_gpu", 1.0),
    "gputop_gpu_memory_copy_utilization_percent": ("util_mem", 1.0),
    "gputop_gpu_memory_used_bytes": ("mem_used", 1.0),
    "gputop_gpu_memory_total_bytes": ("mem_total", 1.0),
    "gputop_gpu_power_usage_watts": ("power_w", 1.0),
    "gputop_gpu_power_limit_watts": ("power_limit_w", 1.0),
    "gputop_gpu_temperature_celsius": ("temperature_c", 1.0),
    "gputop_gpu_sm_clock_mhz": ("sm_clock_mhz", 1.0),
    "gputop_gpu_sm_active_ratio": ("sm_active", 100.0),
    "gputop_gpu_tensor_active_ratio": ("tensor_active", 100.0),
    "gputop_gpu_dram_active_ratio": ("dram_active", 100.0),
    "gputop_gpu_pcie_rx_bytes_per_second": ("pcie_rx_mbs", 1e-6),
    "gputop_gpu_pcie_tx_bytes_per_second": ("pcie_tx_mbs", 1e-6),
    "gputop_gpu_clocks_event_reasons": ("clock_events", 1.0),
    "gputop_gpu_ecc_volatile_errors": ("ecc_volatile", 1.0),
}
FIELDS = {**DCGM_FIELDS, **GPUTOP_FIELDS}
# The job series of gputop's exporter (per GPU and rank; the step time at its median).
JOB_SERIES = {
    "gputop_job_step_time_seconds": "step_time_s",
    "gputop_job_mfu_ratio": "mfu",
    "gputop_job_goodput_ratio": "goodput",
    "gputop_job_energy_per_step_joules": "j_per_step",
}


@dataclass(frozen=True)
class Filters:
    """Exact-match label filters (user, partition, namespace, any label): PromQL matchers on
    the GPU series, each value quoted."""

    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(cls, user: str | None = None, partition: str | None = None,
             namespace: str | None = None, labels: Iterable[str] = ()) -> Filters:
        pairs: list[tuple[str, str]] = []
        for name, value in (("user", user), ("partition", partition), ("namespace", namespace)):
            if value is not None:
                pairs.append((name, value))
        for item in labels:
            name, sep, value = item.partition("=")
            if not sep or not LABEL_NAME.match(name):
                raise ValueError(f"--label takes NAME=VALUE with a Prometheus label name, not "
                                 f"{one_line(item, 80)!r}")
            pairs.append((name, value))
        return cls(tuple(pairs))

    def selector(self) -> str:
        # Whole GPUs only: a MIG device's series carry GPU_I_ID.
        matchers = ['GPU_I_ID=""', *(f"{n}={quote(v)}" for n, v in self.labels)]
        return "{" + ", ".join(matchers) + "}"

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.labels)


@dataclass(slots=True)
class GpuRef:
    """One GPU of the inventory: where it is and who holds it (labels, untrusted, escaped)."""

    instance: str
    gpu: int
    source: str  # "gputop" | "dcgm"
    host: str = ""
    model: str | None = None
    uuid: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # owner and filter labels, non-empty


NAN = math.nan
# One field's values in one refresh: 200,000 GPUs x 40 samples (10 minutes caught up at a
# 15 s scrape interval), 64 MiB.
MAX_VALUES = 8_000_000


class Columns:
    """A refresh's range answers: one row per (instance, gpu), one column per field, one
    value per time of the query's grid (``start + k * step``; Prometheus answers on it), NaN
    where there is no sample. 8 bytes a value: as (t, v) tuples of Python floats it was ~110,
    and an 80,000-GPU fleet's first refresh holds some 6 million. Rows are given out under a
    lock (the answers are read on several threads). A column can be written from two threads
    (a field both exporters have): a value's place is fixed by its row and time, and growing a
    column only appends NaN, so a write never moves another. A column holds MAX_VALUES at
    most: a server that answers more (rows x times) is refused, never grown into."""

    def __init__(self, start: float, end: float, step: float) -> None:
        self.start, self.step = start, max(step, 0.001)
        self.n = max(1, int(round((end - start) / self.step)) + 1)
        self.rows: dict[tuple[str, int], int] = {}
        self.values: dict[str, array] = {}
        self._lock = threading.Lock()

    def times(self) -> list[float]:
        return [self.start + k * self.step for k in range(self.n)]

    def row(self, key: tuple[str, int]) -> int:
        found = self.rows.get(key)
        if found is None:
            with self._lock:
                found = self.rows.setdefault(key, len(self.rows))
        return found

    def slot(self, t: float) -> int | None:
        """The grid index of a sample's time, or None off the grid."""
        k = round((t - self.start) / self.step)
        return k if 0 <= k < self.n and abs(self.start + k * self.step - t) < 1e-3 else None

    def put(self, name: str, row: int, k: int, value: float) -> None:
        column = self.values.get(name)
        if column is None:
            column = self.values.setdefault(name, array("d"))
        need = (row + 1) * self.n
        if need > MAX_VALUES:
            raise PromError(f"more than {MAX_VALUES} samples of {name} in one refresh (GPUs x "
                            "times; narrow it with filters)")
        if len(column) < need:
            column.extend(repeat(NAN, need - len(column)))
        column[row * self.n + k] = value

    def get(self, row: int | None, name: str, k: int) -> float | None:
        column = self.values.get(name)
        if row is None or column is None:
            return None
        i = row * self.n + k
        if i >= len(column):
            return None
        v = column[i]
        return None if v != v else v

    def last(self, key: tuple[str, int], name: str) -> float | None:
        """The newest value of a GPU's field, or None."""
        found = self.points(key, name)
        return found[-1][1] if found else None

    def points(self, key: tuple[str, int], name: str) -> list[tuple[float, float]]:
        """[(t, value)] of a GPU's field, in time order."""
        row = self.rows.get(key)
        got = ((t, self.get(row, name, k)) for k, t in enumerate(self.times()))
        return [(t, v) for t, v in got if v is not None]

    def has(self, rows: Iterable[int | None], k: int) -> bool:
        """Whether any of ``rows`` has a sample at grid index ``k``."""
        return any(self.get(row, name, k) is not None for name in self.values for row in rows)


@dataclass
class FleetData:
    """One refresh's answers, parsed."""

    end: float
    sample_s: float = 15.0  # the store's sample interval: a sample stands for this long
    gpus: dict[tuple[str, int], GpuRef] = field(default_factory=dict)
    # Every GPU field over the refresh's range (``Columns``): (instance, gpu) x field x time.
    series: Columns = field(default_factory=lambda: Columns(0.0, 0.0, 1.0))
    findings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # instance -> list
    job_series: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    ranks: dict[tuple[str, int], str] = field(default_factory=dict)  # (instance, gpu) -> rank
    util_hour: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    namings: dict[str, str] = field(default_factory=dict)  # dcgm instance -> its naming
    queries: int = 0
    bytes: int = 0


def fields_query(names: dict[str, tuple[str, float]], sel: str) -> str:
    """Every field of one source in one query: each metric aggregated to its GPU (its name
    kept), so an answer carries ~60 bytes of labels per GPU and field whatever the exporter
    adds. The names are ours (constants), the selector's values quoted."""
    pattern = "|".join(names)
    return f'max by (__name__, instance, gpu) ({{__name__=~"{pattern}", {sel[1:]})'


def inventory_query(metrics: tuple[str, ...], sel: str, extra: tuple[str, ...]) -> str:
    # modelName: dcgm-exporter's label; model_name: gputop exporter's (snake_case, as promtool
    # asks).
    labels = ", ".join(dict.fromkeys(("instance", "gpu", "Hostname", "hostname", "modelName",
                                      "model_name", "UUID", *OWNER, *EXTRA, *extra)))
    return f'group by ({labels}) ({{__name__=~"{"|".join(metrics)}", {sel[1:]})'


def waste_query(sel: str, what: str) -> str:
    """Each GPU's utilization over the window (``avg_over_time``, in %) or how many samples
    it has there (``count_over_time``), whichever exporter and naming it has."""
    window = f"[{int(WASTE_WINDOW_S)}s]"
    names = {**dcgm_names.by_model()["util_gpu"], "gputop_gpu_utilization_percent": 1.0}
    terms = []
    for name, s in names.items():
        term = f"max by (instance, gpu) ({what}({name}{sel}{window}))"
        terms.append(term if s == 1.0 or what != "avg_over_time" else f"{term} * {s!r}")
    return " or ".join(terms)


def naming_query(sel: str) -> str:
    """Which of the marking names each node has now (one series per node and name)."""
    names = "|".join(dcgm_names.NAMING_MARKS)
    return f'group by (instance, __name__) ({{__name__=~"{names}", {sel[1:]})'


def _gpu_index(metric: dict) -> int | None:
    return _index(str(metric.get("gpu", "")))


def _index(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value < MAX_GPU_INDEX else None


def _label(metric: dict, name: str, limit: int = 120) -> str:
    value = metric.get(name)
    return _shown(value, limit) if isinstance(value, str) and value else ""


@functools.lru_cache(maxsize=1 << 16)
def _shown(value: str, limit: int) -> str:
    """A label value escaped for the screen; the same instance and GPU labels come back in
    every answer, so each is escaped once."""
    return one_line(value, limit)


PARALLEL = 4  # queries in flight at once: the server evaluates them side by side


def fetch(client: PromClient, start: float, end: float, step: float,
          filters: Filters | None = None) -> FleetData:
    """Every answer of one refresh (raises PromError, one line). The queries go out together
    (they do not depend on each other) and are read in order."""
    filters = filters or Filters()
    sel = filters.selector()
    queries, received = client.queries, client.bytes
    data = FleetData(end=end, sample_s=step, series=Columns(start, end, step))
    columns = data.series
    extra = filters.names()
    asks: dict[str, tuple] = {
        "dcgm": (client.query, inventory_query(DCGM_INVENTORY, sel, extra), end),
        "gputop": (client.query, inventory_query(("gputop_gpu_memory_total_bytes",), sel,
                                                 extra), end),
        "hosts": (client.query, "group by (instance, hostname) (gputop_info)", end),
        "naming": (client.query, naming_query(sel), end),
        "gputop_fields": (client.query_range_series, fields_query(GPUTOP_FIELDS, sel), start,
                          end, step),
        "findings": (client.query, "gputop_finding_active == 1", end),
        "jobs": (client.query, job_query(), end),
        "avg": (client.query, waste_query(sel, "avg_over_time"), end),
        "count": (client.query, waste_query(sel, "count_over_time"), end),
    }
    # dcgm-exporter: one query per field (one series per GPU, in the model's unit, whichever
    # naming), so an answer grows with the GPUs, never with fields x GPUs.
    present = client.names_present("DCGM_FI_.*", end)
    fields = [m for m in DCGM_MODEL_FIELDS
              if present is None or present & set(dcgm_names.by_model()[m])]
    for model in fields:
        asks[f"dcgm:{model}"] = (client.query_range_series, dcgm_names.field_query(model, sel),
                                 start, end, step)
    # The range answers go into the columns in their own thread, as soon as they arrive: one
    # series' samples are Python objects at a time.

    def ask(name: str, call, *args):
        # One deadline per query, from when it is sent: reads included.
        answer = call(*args, deadline=time.monotonic() + client.timeout,
                      what=f"the {name} query")
        if name == "gputop_fields":
            _put_series(columns, answer, None)
            return None
        if name.startswith("dcgm:"):
            _put_series(columns, answer, name[5:])
            return None
        return answer

    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="gputop-prom") as pool:
        pending = {name: pool.submit(ask, name, call, *args)
                   for name, (call, *args) in asks.items()}
        try:
            answers = {name: future.result() for name, future in pending.items()}
        finally:
            for future in pending.values():
                future.cancel()
    # The inventory first: a GPU not in it (filtered out, or gone) is not shown.
    for source in ("dcgm", "gputop"):
        for item in answers[source]:
            m = item.get("metric") if isinstance(item, dict) else None
            if not isinstance(m, dict):
                continue
            index, instance = _gpu_index(m), _label(m, "instance", 200)
            if index is None or not instance:
                continue
            labels = {n: _label(m, n) for n in (*OWNER, *EXTRA, *extra) if _label(m, n)}
            data.gpus[(instance, index)] = GpuRef(
                instance, index, source,
                host=_label(m, "Hostname") or _label(m, "hostname"),
                model=_label(m, "modelName") or _label(m, "model_name") or None,
                uuid=_label(m, "UUID") or None,
                labels=labels)
    by_instance: dict[str, list[GpuRef]] = {}
    for ref in data.gpus.values():
        by_instance.setdefault(ref.instance, []).append(ref)
    instances = set(by_instance)
    for item in answers["hosts"]:
        m = item.get("metric") if isinstance(item, dict) else None
        host = _label(m, "hostname") if isinstance(m, dict) else ""
        if not host or not isinstance(m, dict):
            continue
        for ref in by_instance.get(_label(m, "instance", 200), ()):
            ref.host = host
    names_of: dict[str, set[str]] = {}
    for item in answers["naming"]:
        m = item.get("metric") if isinstance(item, dict) else None
        if isinstance(m, dict):
            names_of.setdefault(_label(m, "instance", 200), set()).add(str(m.get("__name__")))
    for instance, names in names_of.items():
        naming = dcgm_names.naming_of(names)
        if naming:
            data.namings[instance] = naming
    if data.gpus:
        _totals(columns)
        _findings(answers["findings"], data, instances)
        _jobs(answers["jobs"], data)
        avg = {(_label(i["metric"], "instance", 200), _gpu_index(i["metric"])): number(
            i["value"][1]) for i in answers["avg"] if _ok_instant(i)}
        count = {(_label(i["metric"], "instance", 200), _gpu_index(i["metric"])): number(
            i["value"][1]) for i in answers["count"] if _ok_instant(i)}
        for key, util in avg.items():
            seen = count.get(key)
            if key in data.gpus and util is not None and seen is not None:
                data.util_hour[key] = (util, seen)  # type: ignore[index]
    data.queries = client.queries - queries
    data.bytes = client.bytes - received
    return data


def _put_series(columns: Columns, result: list[RangeSeries], name: str | None) -> None:
    """One range answer into the columns: a dcgm field's (``name``, in the model's unit
    already: the server converted it) or the gputop exporter's fields (named by each series'
    metric, scaled here)."""
    for series in result:
        m = series.metric
        index = _index(m.gpu)
        if index is None or not m.instance:
            continue
        found = (name, 1.0) if name is not None else GPUTOP_FIELDS.get(m.name)
        if found is None:
            continue
        field_name, scale = found
        row = columns.row((_shown(m.instance, 200), index))
        for t, v in series.points():
            k = columns.slot(t)
            value = number(v)
            if k is not None and value is not None:
                columns.put(field_name, row, k, value * scale)


def _totals(columns: Columns) -> None:
    """dcgm: the total is used + free, where a GPU has no total of its own."""
    free, used = columns.values.pop("fb_free", None), columns.values.get("mem_used")
    if free is None or used is None:
        return
    total = columns.values.get("mem_total")
    n = columns.n
    for i in range(min(len(free), len(used))):
        f, u = free[i], used[i]
        if f == f and u == u and (total is None or i >= len(total) or total[i] != total[i]):
            columns.put("mem_total", i // n, i % n, u + f)
            total = columns.values["mem_total"]


def _ok_instant(item: Any) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("metric"), dict)
            and isinstance(item.get("value"), list) and len(item["value"]) == 2)


def _findings(result: list[dict], data: FleetData, instances: set[str]) -> None:
    for item in result:
        if not _ok_instant(item):
            continue
        m = item["metric"]
        instance = _label(m, "instance", 200)
        if instance not in instances:
            continue
        gpu = _gpu_index(m) if m.get("gpu") else None
        data.findings.setdefault(instance, []).append({
            "id": _label(m, "id", 40), "severity": _label(m, "severity", 20) or "warning",
            "gpu": gpu})
        if len(data.findings[instance]) > 256:  # a node's findings, bounded
            data.findings[instance].pop()


def job_query() -> str:
    names = "|".join(JOB_SERIES)
    return f'{{__name__=~"{names}", quantile=~"0.5|"}}'


def _jobs(result: list[dict], data: FleetData) -> None:
    for item in result:
        if not _ok_instant(item):
            continue
        m = item["metric"]
        key = (_label(m, "instance", 200), _gpu_index(m))
        field_name = JOB_SERIES.get(str(m.get("__name__")))
        value = number(item["value"][1])
        if key not in data.gpus or field_name is None or value is None:
            continue
        data.job_series.setdefault(key, {})[field_name] = value  # type: ignore[index]
        rank = _label(m, "rank", 12)
        if rank:
            data.ranks[key] = rank  # type: ignore[index]


__all__ = ["FIELDS", "FleetData", "Filters", "GpuRef", "PromError", "fetch"]
