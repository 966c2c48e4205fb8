"""dcgm-exporter's field names, legacy and current, and their units, derived from how DCGM
names fields rather than listed name by name.

DCGM 4.6 deprecates its old names (``#define LEGACY NEW`` in ``dcgm_fields.h``) for ones built
by its naming standard, ``DCGM_FI_<domain>_<subsystem>_<property>[_<unit>][_<suffix>]``: the
unit tokens ``BYTES``, ``CELSIUS``, ``HERTZ``, ``JOULES``, ``SECONDS``, ``WATTS`` (and
``BYTES_PER_SECOND`` for rates), the suffixes ``RATIO`` (0-1) and ``TOTAL`` (a counter).
dcgm-exporter 4.9 switched its default fields to the new names and units (utilization as a
ratio, memory in bytes, clocks in Hz, energy in J), 4.10 its PCIe and NVLink rates. A current
name says its unit; a legacy one has the unit its documentation gives.

So each field gputop reads is given by its legacy name and unit and by the stems (name less
the unit token) it has in the current naming; the accepted names and the scale of each to the
model's unit follow. Clusters upgrade node by node: both namings are asked for in the same
query, each converted on the server (``or`` of one term per unit), and which one a node uses is
seen from the series it has.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "DCGM_FI_"
# Unit tokens of the naming standard, longest first (BYTES_PER_SECOND before BYTES).
UNIT_TOKENS = (("BYTES_PER_SECOND", "B/s"), ("BYTES", "B"), ("CELSIUS", "C"), ("HERTZ", "Hz"),
               ("JOULES", "J"), ("SECONDS", "s"), ("WATTS", "W"), ("RATIO", "ratio"))
COUNTER_SUFFIX = "TOTAL"

# One unit to another: how many of the target a unit is (model units: %, bytes, MHz, W, J,
# MB/s, C; activities 0-100 like utilization).
_SCALES: dict[tuple[str, str], float] = {
    ("ratio", "%"): 100.0, ("%", "%"): 1.0,
    ("B", "B"): 1.0, ("MiB", "B"): 1048576.0,
    ("Hz", "MHz"): 1e-6, ("MHz", "MHz"): 1.0,
    ("J", "J"): 1.0, ("mJ", "J"): 1e-3,
    ("B/s", "MB/s"): 1e-6, ("MB/s", "MB/s"): 1.0,
    ("W", "W"): 1.0, ("C", "C"): 1.0, ("count", "count"): 1.0, ("mask", "mask"): 1.0,
}


def split_unit(name: str) -> tuple[str, str | None, bool]:
    """(stem, unit or None, is a counter) of a field name: ``DCGM_FI_DEV_GPU_UTIL_RATIO`` ->
    (``DCGM_FI_DEV_GPU_UTIL``, "ratio", False); ``..._JOULES_TOTAL`` -> (..., "J", True)."""
    stem, counter = name, False
    if stem.endswith("_" + COUNTER_SUFFIX):
        stem, counter = stem[: -len(COUNTER_SUFFIX) - 1], True
    for token, unit in UNIT_TOKENS:
        if stem.endswith("_" + token):
            return stem[: -len(token) - 1], unit, counter
    return stem, None, counter


def scale(unit: str, target: str) -> float:
    return _SCALES[(unit, target)]


@dataclass(frozen=True)
class Field:
    """A field gputop reads: the model's field and unit, the legacy name and its unit, and the
    stems of its current names (their unit comes from the token the name carries)."""

    model: str
    unit: str  # the model's unit
    legacy: str  # as dcgm-exporter <= 4.8 names it
    legacy_unit: str
    stems: tuple[str, ...] = ()  # current names without their unit token
    current_unit: str | None = None  # the token current names carry (None: unitless)
    counter: bool = False  # a current name ends in _TOTAL

    def names(self) -> dict[str, float]:
        """Every accepted name -> the scale of its values to the model's unit."""
        out = {PREFIX + self.legacy: scale(self.legacy_unit, self.unit)}
        for stem in self.stems:
            unit = self.current_unit or self.legacy_unit
            token = next((t for t, u in UNIT_TOKENS if u == self.current_unit), None)
            name = PREFIX + stem + (f"_{token}" if token else "")
            out[name] = scale(unit, self.unit)
            if self.counter:  # a counter's current name ends in _TOTAL; some drop it
                out[name + "_" + COUNTER_SUFFIX] = scale(unit, self.unit)
        return out


# The stems of the current naming: domain, subsystem and property as DCGM 4.6+ spells them.
FIELDS: tuple[Field, ...] = (
    Field("util_gpu", "%", "DEV_GPU_UTIL", "%", ("DEV_GPU_UTIL",), "ratio"),
    Field("util_mem", "%", "DEV_MEM_COPY_UTIL", "%", ("DEV_MEM_COPY_UTIL",), "ratio"),
    Field("mem_used", "B", "DEV_FB_USED", "MiB", ("DEV_FB_USED",), "B"),
    Field("fb_free", "B", "DEV_FB_FREE", "MiB", ("DEV_FB_FREE",), "B"),
    Field("mem_total", "B", "DEV_FB_TOTAL", "MiB", ("DEV_FB_TOTAL", "DEV_FB_CAPACITY"), "B"),
    Field("power_w", "W", "DEV_POWER_USAGE", "W", ("DEV_BOARD_POWER",), "W"),
    Field("power_limit_w", "W", "DEV_POWER_MGMT_LIMIT", "W",
          ("DEV_BOARD_POWER_LIMIT_ENFORCED", "DEV_BOARD_POWER_LIMIT_REQUESTED"), "W"),
    Field("energy_j", "J", "DEV_TOTAL_ENERGY_CONSUMPTION", "mJ",
          ("DEV_TOTAL_ENERGY_CONSUMPTION", "DEV_BOARD_ENERGY"), "J", counter=True),
    Field("temperature_c", "C", "DEV_GPU_TEMP", "C", ("DEV_GPU_TEMP",), "C"),
    Field("sm_clock_mhz", "MHz", "DEV_SM_CLOCK", "MHz", ("DEV_SM_CLOCK", "DEV_CLOCKS_SM"), "Hz"),
    Field("sm_clock_max_mhz", "MHz", "DEV_MAX_SM_CLOCK", "MHz",
          ("DEV_MAX_SM_CLOCK", "DEV_CLOCKS_SM_MAX"), "Hz"),
    Field("sm_active", "%", "PROF_SM_ACTIVE", "ratio", ("PROF_SM_UTIL",), "ratio"),
    Field("tensor_active", "%", "PROF_PIPE_TENSOR_ACTIVE", "ratio", ("PROF_TENSOR_UTIL",),
          "ratio"),
    Field("dram_active", "%", "PROF_DRAM_ACTIVE", "ratio", ("PROF_DRAM_UTIL",), "ratio"),
    Field("pcie_rx_mbs", "MB/s", "PROF_PCIE_RX_BYTES", "B/s", ("PROF_PCIE_RX",), "B/s"),
    Field("pcie_tx_mbs", "MB/s", "PROF_PCIE_TX_BYTES", "B/s", ("PROF_PCIE_TX",), "B/s"),
    Field("nvlink_rx_mbs", "MB/s", "PROF_NVLINK_RX_BYTES", "B/s", ("PROF_NVLINK_RX",), "B/s"),
    Field("nvlink_tx_mbs", "MB/s", "PROF_NVLINK_TX_BYTES", "B/s", ("PROF_NVLINK_TX",), "B/s"),
    Field("clock_events", "mask", "DEV_CLOCK_THROTTLE_REASONS", "mask",
          ("DEV_CLOCKS_EVENT_REASONS", "DEV_CLOCK_EVENT_REASONS"), None),
    Field("ecc_volatile", "count", "DEV_ECC_DBE_VOL_TOTAL", "count",
          ("DEV_ECC_DBE_VOL",), None, counter=True),
    Field("xid", "count", "DEV_XID_ERRORS", "count", ("DEV_XID_ERROR",), None),
)

# The names a node's naming is told by: current names of fields every dcgm-exporter exports
# by default. 4.10 renamed the profiling rates after 4.9 renamed the rest.
NAMING_MARKS = {"DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": "dcgm-exporter >= 4.10",
                "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": "dcgm-exporter >= 4.10",
                "DCGM_FI_DEV_GPU_UTIL_RATIO": "dcgm-exporter >= 4.9",
                "DCGM_FI_DEV_GPU_UTIL": "dcgm-exporter <= 4.8 names",
                "DCGM_FI_DEV_FB_USED": "dcgm-exporter <= 4.8 names"}
_NAMING_RANK = {"dcgm-exporter >= 4.10": 3, "dcgm-exporter >= 4.9": 2,
                "dcgm-exporter <= 4.8 names": 1}


def by_model() -> dict[str, dict[str, float]]:
    """model field -> {accepted name: scale to the model's unit}."""
    out: dict[str, dict[str, float]] = {}
    for f in FIELDS:
        out.setdefault(f.model, {}).update(f.names())
    return out


def all_names() -> dict[str, tuple[str, float]]:
    """Every accepted name -> (model field, scale)."""
    return {name: (model, s) for model, names in by_model().items() for name, s in names.items()}


def field_query(model: str, sel: str) -> str:
    """One field of every GPU, whichever naming each node has, in the model's unit: one
    ``max by (instance, gpu)`` term per scale (the server converts), joined by ``or``. The
    names are ours (constants); ``sel`` holds the quoted filter matchers."""
    groups: dict[float, list[str]] = {}
    for name, s in by_model()[model].items():
        groups.setdefault(s, []).append(name)
    inner = sel[1:-1]
    terms = []
    for s, names in groups.items():
        term = f'max by (instance, gpu) ({{__name__=~"{"|".join(names)}", {inner}}})'
        terms.append(term if s == 1.0 else f"{term} * {s!r}")
    return " or ".join(terms)


def naming_of(names: set[str]) -> str | None:
    """A node's naming, from the marks among its series' names (the newest wins: a node seen
    in both during an upgrade is on the new one now)."""
    found = [NAMING_MARKS[n] for n in names if n in NAMING_MARKS]
    return max(found, key=_NAMING_RANK.__getitem__) if found else None
