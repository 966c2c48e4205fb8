"""dcgm-exporter's two namings as gputop derives them (gputop/fleet/prometheus/dcgm_names), checked
against DCGM's own legacy-to-new map (``../shared/dcgm/field-renames.tsv``, from
``dcgm_fields.h``) when it is there."""

from __future__ import annotations

import csv

import pytest

from gputop.fleet.prometheus import dcgm_names
from gputop.fleet.prometheus.dcgm_names import (
    FIELDS,
    PREFIX,
    all_names,
    field_query,
    naming_of,
    split_unit,
)
from tests.conftest import SHARED

RENAMES = SHARED / "dcgm" / "field-renames.tsv"


@pytest.fixture(scope="module")
def renames() -> list[dict[str, str]]:
    if not RENAMES.exists():
        pytest.skip("../shared/dcgm is not here")
    with RENAMES.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_every_renamed_field_gputop_reads_is_read_under_its_new_name_in_its_unit(renames):
    names = all_names()
    ours = {PREFIX + f.legacy: f for f in FIELDS}
    checked = 0
    for row in renames:
        spec = ours.get(row["legacy_name"])
        if spec is None:
            continue
        new = row["new_name"]
        assert new in names, f"{row['legacy_name']} -> {new} is not read"
        model, scale = names[new]
        assert model == spec.model
        _, unit, _ = split_unit(new)
        assert scale == dcgm_names.scale(unit or spec.legacy_unit, spec.unit), new
        checked += 1
    # utilization, SM/tensor/DRAM activity, power, its limit, temperature, Xid at least
    assert checked >= 8, checked


def test_the_unit_of_every_new_name_is_read_from_its_token(renames):
    units = {}
    for row in renames:
        _, unit, counter = split_unit(row["new_name"])
        units[row["new_name"]] = unit
        assert counter == row["new_name"].endswith("_TOTAL")
    assert units["DCGM_FI_DEV_GPU_UTIL_RATIO"] == "ratio"
    assert units["DCGM_FI_DEV_BOARD_POWER_WATTS"] == "W"
    assert units["DCGM_FI_DEV_GPU_TEMP_CELSIUS"] == "C"
    assert units["DCGM_FI_DEV_NVLINK_TX_BYTES_TOTAL"] == "B"
    assert units["DCGM_FI_DEV_XID_ERROR"] is None


def test_units_convert_to_the_models():
    names = all_names()
    assert names["DCGM_FI_DEV_GPU_UTIL"] == ("util_gpu", 1.0)
    assert names["DCGM_FI_DEV_GPU_UTIL_RATIO"] == ("util_gpu", 100.0)  # ratio -> %
    assert names["DCGM_FI_DEV_FB_USED"] == ("mem_used", 1048576.0)  # MiB -> bytes
    assert names["DCGM_FI_DEV_FB_USED_BYTES"] == ("mem_used", 1.0)
    assert names["DCGM_FI_DEV_SM_CLOCK_HERTZ"] == ("sm_clock_mhz", 1e-6)  # Hz -> MHz
    assert names["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ("energy_j", 1e-3)  # mJ -> J
    assert names["DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"] == ("pcie_tx_mbs", 1e-6)
    assert names["DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND"] == ("nvlink_rx_mbs", 1e-6)
    assert names["DCGM_FI_PROF_SM_UTIL_RATIO"] == names["DCGM_FI_PROF_SM_ACTIVE"]


def test_one_query_per_field_converts_each_naming_on_the_server():
    query = field_query("util_gpu", '{GPU_I_ID="", namespace="ml"}')
    legacy, current = query.split(" or ")
    assert legacy == ('max by (instance, gpu) ({__name__=~"DCGM_FI_DEV_GPU_UTIL", '
                      'GPU_I_ID="", namespace="ml"})')
    assert current.endswith(' * 100.0') and "DCGM_FI_DEV_GPU_UTIL_RATIO" in current


def test_a_nodes_naming_is_seen_from_its_series_the_newest_winning():
    assert naming_of({"DCGM_FI_DEV_GPU_UTIL"}) == "dcgm-exporter <= 4.8 names"
    assert naming_of({"DCGM_FI_DEV_GPU_UTIL_RATIO",
                      "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"}) == "dcgm-exporter >= 4.10"
    assert naming_of({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"}) == \
        "dcgm-exporter >= 4.9"
    assert naming_of({"up"}) is None
