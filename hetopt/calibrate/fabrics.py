"""Fabrics: what fraction of its nominal bandwidth each interconnect delivers, and its per-step
latency.

A fabric f has two numbers, both fitted on nccl-tests results (data/calibration/public/
collectives_achieved.csv) through hetopt's own collective functions (hetopt.cost.comm):

- η_f: achieved fraction of the nominal per-direction bandwidth (the catalog's ``intra_node_gbps``
  inside a
  node, the instance's ``nic_gbps`` / link ``gbps`` outside) for large messages;
- α_f: latency per collective step, seconds (a ring all-reduce of n ranks has 2(n − 1) steps).

A collective of B bytes on fabric f then takes bytes(B) / (η_f · nominal) + steps · α_f, with bytes
and steps from comm.py (ring all-reduce 2(n − 1)/n · B in 2(n − 1) steps; hierarchical across
nodes). nccl-tests reports bus bandwidth busbw = algbw · 2(n − 1)/n for all-reduce ((n − 1)/n for
reduce-scatter and all-gather), so a row's time is T = factor · B / busbw and at large B the model's
busbw → η_f · nominal.

How each fabric gets its numbers (``source`` in the table says which, per fabric):
- message-size sweeps (nvlink5, efa, tcpxo): η and α by least squares on log(T_model / T_measured)
  over the
  rows of ≥ 64 MiB (FIT_BYTES; smaller messages run NCCL protocols one α cannot follow; α is
  identified by the rows between 64 MiB and 1 GiB);
- large-message values only: η by the same fit with α held at a rule's value (α_f is not
  identifiable):
  intra-node fabrics take nvlink5's α (the only intra-node sweep), RDMA NICs (infiniband, roce,
  omnipath) take efa's α (the only RDMA sweep), tcp takes tcpxo's (the only TCP-transport sweep);
- no data at all: a stated rule (pcie5_host: pcie5's η × the host/switch ratio of PCIe Gen3 and
  Gen4). Rows the model cannot represent are left out with the reason (NVLink SHARP, copy-engine
  copies, setups whose bottleneck is not the fabric); `hetopt calibrate --fabrics CSV` lists them.

Regenerate the shipped table:  ``hetopt calibrate --fabrics
data/calibration/public/collectives_achieved.csv --out hetopt/cost/profiles/fabrics.json``
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from hetopt.calibrate.columns import FABRICS_CSV
from hetopt.cost import comm
from hetopt.cost.terms import LAT, LINK, NET, zeros
from hetopt.csvfile import bytes_of, read_csv
from hetopt.errors import InputError, Problem
from hetopt.outputs import check_output, write_json
from hetopt.spec.cluster import Route
from hetopt.spec.fabrics import IDEAL, NAMES, Fabric

# -- the CSV rows
# -----------------------------------------------------------------------------------------

LARGE_BYTES = 2**30
"""Size at which rows that state none ('large messages', vendor slides, maintainers' figures) are
priced."""
NOMINAL_GBPS = {
    "nvlink2": 1200,
    "nvlink3": 2400,
    "nvlink4": 3600,
    "nvlink5": 7200,
    "xgmi": 3584,
    "pcie3": 128,
    "pcie4": 256,
    "pcie5": 512,
    "pcie3_host": 128,
    "pcie4_host": 256,
}
"""Per-GPU per-direction Gbit/s of the intra-node fabrics, as the GPU catalog states them (V100's
NVLink 2 150 GB/s — the CSV's 2400 is the bidirectional figure —, A100 300, H100/H200 450, MI300X 7
× 64 GB/s, PCIe x16 16/32/64 GB/s); nvlink5: B200's 900 GB/s per direction (the CSV's figure; B200
is not in the catalog)."""

# CSV `fabric` column → (hetopt fabric, intra-node fabric of the nodes for rows spanning nodes).
FABRIC_OF = {
    "NVLink4+NVSwitch": ("nvlink4", None),
    "NVLink4": ("nvlink4", None),
    "NVLink5+NVSwitch": ("nvlink5", None),
    "NVLink5 NVL72": ("nvlink5", None),
    "NVLink3+NVSwitch": ("nvlink3", None),
    "NVLink2": ("nvlink2", None),
    "NVLink2 (4-GPU node)": ("nvlink2", None),
    "AMD Infinity Fabric (xGMI) full mesh": ("xgmi", None),
    "PCIe Gen4": ("pcie4", None),
    "PCIe Gen5": ("pcie5", None),
    "PCIe Gen3 switch": ("pcie3", None),
    "PCIe Gen3 via CPU": ("pcie3_host", None),
    "AWS EFA v4": ("efa", "nvlink5"),
    "AWS EFA v1": ("efa", "nvlink3"),
    "AWS EFA (100 Gbps, p3dn)": ("efa", "nvlink2"),
    "GCP GPUDirect-TCPXO": ("tcpxo", "nvlink4"),
    "Intel Omni-Path (OPA 100Gb links)": ("omnipath", "nvlink2"),
    "IB EDR 100G (1 HCA/node)": ("infiniband", "nvlink2"),
    "IB EDR 4x100G (DGX-1)": ("infiniband", "nvlink2"),
    "RDMA NIC rule of thumb": ("infiniband", "nvlink3"),
    "200Gb RDMA (IB/RoCE)": ("infiniband", "nvlink3"),
    "400Gb RDMA (IB/RoCE)": ("infiniband", "nvlink4"),
    "NVLink3 + 8x200Gb RDMA": ("infiniband", "nvlink3"),
    "NVLink4 + 8x400Gb RDMA": ("infiniband", "nvlink4"),
    "100GbE TCP/IP sockets": ("tcp", "nvlink3"),
    "100GbE TCP (NCCL sockets)": ("tcp", "nvlink3"),
}
ALSO_ROCE = ("200Gb RDMA (IB/RoCE)", "400Gb RDMA (IB/RoCE)")
"""The vendor slide's RDMA rows state IB or RoCE: they are data for both fabrics."""
LEFT_OUT = {
    "NVLink4+NVSwitch SHARP (NVLS)": (
        "NVLink SHARP reduces in the switch; hetopt models ring collectives"
    ),
    "NVLink4 + 8x400Gb RDMA + SHARP": (
        "in-network reduction (SHARP); hetopt models ring collectives"
    ),
    "PCIe Gen5 x16 (host<->device)": "host-device copy, not GPU-GPU",
    "RoCE 400G": "sendrecv of GPUs whose type and PCIe path the source does not state: bounded "
    "by the host path (15.5 GB/s with one GPU, 5.8 with four), not by the 50 GB/s NIC",
    "multi-NIC RDMA (4 NICs)": (
        "one GPU per node drives four NICs: bounded by the GPU's PCIe link"
    ),
}


PER_NIC = ("IB EDR 100G (1 HCA/node)", "IB EDR 4x100G (DGX-1)")
"""Rows that state a card's ceiling rather than one run ('12.2 GB/s (for a 100Gbps card) is as good
as you can get'): priced like the other per-NIC figures, as two nodes of one GPU (busbw = η ·
nominal)."""


@dataclass(frozen=True)
class Row:
    fabric: str
    intra: str | None
    """Intra-node fabric of the nodes (rows spanning nodes)."""
    kind: str
    """all_reduce, reduce_scatter or all_gather."""
    nbytes: float
    ranks: int
    nodes: int
    nominal_gbps: float
    busbw: float
    """Measured bus bandwidth, GB/s."""
    source: str
    label: str

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes


def _range(text: str) -> tuple[float, float] | None:
    """'12 to 24' → (12, 24); 'up to 340' → (340, 340); '24' → (24, 24); '' → None."""
    text = text.replace("up to", "").strip()
    if not text:
        return None
    parts = [float(p) for p in text.replace(" to ", "-").split("-")]
    return parts[0], parts[-1]


def _size(text: str) -> float:
    """'8M-128M' → geometric mean; '' → LARGE_BYTES."""
    return bytes_of(text) if text else LARGE_BYTES


def _nvls(r: dict) -> bool:
    alg = r["algorithm_or_env"]
    if "NVLS" in alg and "ENABLE=0" not in alg and "Ring" not in alg.split("(")[-1]:
        return True
    # The B200 sweep states no algorithm; at 8 GiB the source's own table shows that the default on
    # 8 GPUs is NVLS (838 GB/s vs 682 with NVLS disabled), so the sweep's rows from 8 GiB on are
    # NVLS.
    return (
        r["fabric"] == "NVLink5+NVSwitch"
        and not alg
        and bool(r["message_size_bytes"])
        and _size(r["message_size_bytes"]) >= 2**33
    )


def read_rows(path: str | Path) -> tuple[list[Row], list[tuple[str, str]]]:
    """Usable rows and (row label, why left out) for the others."""
    rows, skipped = [], []
    for i, r in enumerate(read_csv(path, FABRICS_CSV), start=2):
        label = f"line {i}: {r['fabric']} {r['collective']} {r['message_size_bytes'] or 'large'}"
        name = r["fabric"]
        why = LEFT_OUT.get(name)
        if why is None and r["collective"] not in (
            "all_reduce",
            "reduce_scatter",
            "all_gather",
            "intra-node NCCL bandwidth",
        ):
            why = f"{r['collective']} is not an NCCL collective"
        if why is None and _nvls(r):
            why = "NVLink SHARP (NVLS) algorithm; hetopt models ring collectives"
        if why is None and name not in FABRIC_OF:
            why = "fabric not mapped"
        if why is None and not r["nominal_gbit_s"]:
            why = "no nominal bandwidth stated"
        if why:
            skipped.append((label, why))
            continue
        try:
            rows += _rows_of(r, label)
        except (ValueError, IndexError, TypeError):
            raise InputError(
                str(path),
                [
                    Problem(
                        "busbw_GBps",
                        "no bandwidth hetopt can read: give busbw_GBps or algbw_GBps in GB/s",
                        r["busbw_GBps"] or r["other_metric"],
                        True,
                        line=i,
                    )
                ],
            ) from None
    return rows, skipped


def _rows_of(r: dict, label: str) -> list[Row]:
    fabric, intra = FABRIC_OF[r["fabric"]]
    kind = "all_reduce" if r["collective"].startswith("intra-node") else r["collective"]
    per_nic = r["fabric"] in PER_NIC
    nodes = (
        int(r["num_nodes"])
        if r["num_nodes"].isdigit() and not per_nic
        else (1 if intra is None else 2)
    )
    ranks = (
        int(r["num_gpus"])
        if r["num_gpus"].isdigit() and not per_nic
        else (8 if intra is None else nodes)
    )
    if (
        not r["num_gpus"]
        and r["gpus_per_node"].isdigit()
        and r["num_nodes"].isdigit()
        and not per_nic
    ):
        ranks = nodes * int(r["gpus_per_node"])
    nbytes = _size(r["message_size_bytes"])
    factor = 2 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    busbw = _range(r["busbw_GBps"])
    if busbw is None and r["algbw_GBps"]:
        busbw = (float(r["algbw_GBps"]) * factor,) * 2
    if busbw is None:  # 'effective 340Gbps' or 'a to b Gbps algo throughput (=2*bytes*8/time)'
        text = r["other_metric"].split("Gbps")[0].replace("'effective", "").strip()
        lo, hi = _range(text)
        # Gbit/s of 2·B → algbw GB/s
        scale = factor / 16 if "algo throughput" in r["other_metric"] else 1 / 8
        busbw = (lo * scale, hi * scale)
    nominal = NOMINAL_GBPS.get(fabric, float(r["nominal_gbit_s"]))
    out = []
    if fabric == "pcie4" and busbw[0] != busbw[1]:
        # The maintainer's Gen4 range 12–24 GB/s: by the same comment's Gen3 figures (via CPU 6,
        # switch 12) its low end is the host-routed path and its high end the switch.
        out.append(
            Row(
                "pcie4_host",
                None,
                kind,
                nbytes,
                ranks,
                nodes,
                nominal,
                busbw[0],
                r["source"],
                label,
            )
        )
        busbw = (busbw[1], busbw[1])
    mid = math.sqrt(busbw[0] * busbw[1])
    out.append(Row(fabric, intra, kind, nbytes, ranks, nodes, nominal, mid, r["source"], label))
    if r["fabric"] in ALSO_ROCE:
        out.append(Row("roce", intra, kind, nbytes, ranks, nodes, nominal, mid, r["source"], label))
    return out


# -- the model of a row, through comm.py
# ------------------------------------------------------------------


def _bare():
    """Weights of a bare NCCL run: LINK = NET = LAT = 1, no framework step overhead (STEP = 0)."""
    w = zeros()
    w[[LINK, NET, LAT]] = 1.0
    return w


def row_seconds(row: Row, fab: dict[str, Fabric]) -> float:
    """The model's time for a row: one collective inside a node, or hierarchical across nodes."""
    f = fab[row.fabric]
    if row.nodes == 1:
        peers = 7 if f.mesh else 0  # the MI300X rows: nodes of 8 GPUs
        path = Route(row.nominal_gbps, 0.0, (), alpha_s=f.alpha_s, eta=f.eta, mesh_peers=peers)
        v = comm.collective(row.kind, row.nbytes, row.ranks, path)
    else:
        i = fab[row.intra]
        intra = Route(NOMINAL_GBPS[row.intra], 0.0, (), alpha_s=i.alpha_s, eta=i.eta)
        v = comm.hierarchical_all_reduce(
            row.nbytes,
            row.per_node,
            row.nodes,
            intra,
            row.nominal_gbps * f.eta,
            inter_alpha_s=f.alpha_s,
        )
    return float(v @ _bare())


def row_busbw(row: Row, fab: dict[str, Fabric]) -> float:
    factor = (
        2 * (row.ranks - 1) / row.ranks if row.kind == "all_reduce" else (row.ranks - 1) / row.ranks
    )
    return factor * row.nbytes / row_seconds(row, fab) / 1e9


# -- fitting
# ----------------------------------------------------------------------------------------------

SMALL_BYTES = 64 * 2**20
"""The acceptance check (within 15% of measured busbw) is on rows from this size on."""
ALPHA_RULE = {
    "nvlink2": "nvlink5",
    "nvlink3": "nvlink5",
    "nvlink4": "nvlink5",
    "xgmi": "nvlink5",
    "pcie3": "nvlink5",
    "pcie4": "nvlink5",
    "pcie5": "nvlink5",
    "pcie3_host": "nvlink5",
    "pcie4_host": "nvlink5",
    "pcie5_host": "nvlink5",
    "infiniband": "efa",
    "roce": "efa",
    "omnipath": "efa",
    "tcp": "tcpxo",
}
ORDER = (
    "nvlink5",
    "nvlink4",
    "nvlink3",
    "nvlink2",
    "xgmi",
    "pcie3",
    "pcie4",
    "pcie5",
    "pcie3_host",
    "pcie4_host",
    "efa",
    "tcpxo",
    "infiniband",
    "roce",
    "omnipath",
    "tcp",
)
"""Intra-node fabrics first (the multi-node rows need them), and each α rule's donor before its
takers."""


FIT_BYTES = 64 * 2**20
"""Rows below this size are not fitted: there NCCL switches protocols (LL, LL128, Simple) and
channel counts by size, which one α per step cannot follow; from it on the α–β line holds (see the
report's errors)."""


def _fit_one(name: str, rows: list[Row], fab: dict[str, Fabric]) -> tuple[float, float, bool]:
    sweep = any(FIT_BYTES <= r.nbytes < LARGE_BYTES for r in rows)
    # LOSO: own α when rest has no sweep
    alpha0 = fab[ALPHA_RULE.get(name, name)].alpha_s if not sweep else 1e-5

    def residuals(x):
        trial = dict(fab)
        trial[name] = Fabric(name, x[0], x[1] * 1e-6 if sweep else alpha0)
        return np.log([row_busbw(r, trial) for r in used]) - np.log([r.busbw for r in used])

    used = [r for r in rows if r.nbytes >= FIT_BYTES]

    x0 = [0.8, alpha0 * 1e6 if sweep else 0.0]
    res = least_squares(residuals, x0, bounds=([0.01, 0.0], [1.0, 1e4]), method="trf")
    return float(res.x[0]), (float(res.x[1]) * 1e-6 if sweep else alpha0), sweep


CAVEAT = {
    "omnipath": "; caveat: measured on Jean Zay's shared Omni-Path, whose own README says NCCL "
    "did not reach the 400 Gbit/s the nodes have: a property of that deployment more than of the "
    "link"
}
"""What a fabric's only data says about itself, carried into its source."""


def fit(path: str | Path) -> tuple[dict[str, Fabric], dict]:
    """Fit every fabric with data; returns the table and a report (per fabric: rows, errors,
    LOSO)."""
    rows, skipped = read_rows(path)
    by = {n: [r for r in rows if r.fabric == n] for n in NAMES}
    fab: dict[str, Fabric] = {"ideal": IDEAL}
    report: dict = {
        "csv": str(path),
        "left_out": [f"{lab}: {why}" for lab, why in skipped],
        "fabrics": {},
    }
    for name in ORDER:
        eta, alpha, sweep = _fit_one(name, by[name], fab)
        how = (
            "η and α by least squares on the rows' message sizes"
            if sweep
            else f"η by least squares on large-message rows; α = {ALPHA_RULE[name]}'s (rule)"
        )
        sources = sorted({r.source for r in by[name]})
        fab[name] = Fabric(
            name,
            eta,
            alpha,
            f"{how}; {len(by[name])} rows from: " + " | ".join(sources) + CAVEAT.get(name, ""),
        )
    # no data: host-routed PCIe 5 takes PCIe 5's η times the host/switch ratio measured for Gen3 and
    # Gen4
    ratio = np.mean(
        [fab["pcie3_host"].eta / fab["pcie3"].eta, fab["pcie4_host"].eta / fab["pcie4"].eta]
    )
    fab["pcie5_host"] = Fabric(
        "pcie5_host",
        fab["pcie5"].eta * ratio,
        fab["pcie5"].alpha_s,
        f"no data; rule: pcie5's η × {ratio:.3f} (mean host/switch η ratio of pcie3, pcie4); "
        "pcie5's α",
    )
    for name in ORDER:
        report["fabrics"][name] = _report(name, by[name], fab)
    report["fabrics"]["pcie5_host"] = {
        "rows": 0,
        "eta": fab["pcie5_host"].eta,
        "alpha_us": fab["pcie5_host"].alpha_s * 1e6,
        "source": fab["pcie5_host"].source,
    }
    return fab, report


def _report(name: str, rows: list[Row], fab: dict[str, Fabric]) -> dict:
    def errors(table, subset):
        return [row_busbw(r, table) / r.busbw - 1 for r in subset]

    large = [r for r in rows if r.nbytes >= SMALL_BYTES]
    err = errors(fab, large)
    out = {
        "rows": len(rows),
        "rows_ge_64MiB": len(large),
        "eta": fab[name].eta,
        "alpha_us": fab[name].alpha_s * 1e6,
        "mean_abs_error_ge_64MiB": float(np.mean(np.abs(err))) if err else None,
        "max_abs_error_ge_64MiB": float(np.max(np.abs(err))) if err else None,
        "source": fab[name].source,
    }
    sources = sorted({r.source for r in rows})
    if len(sources) >= 2:  # leave one source out: refit on the others, error on the one left out
        loso = []
        for s in sources:
            rest = [r for r in rows if r.source != s]
            held = [r for r in large if r.source == s] or [r for r in rows if r.source == s]
            eta, alpha, _ = _fit_one(name, rest, fab)
            trial = {**fab, name: Fabric(name, eta, alpha)}
            loso += [abs(e) for e in errors(trial, held)]
        out["loso_mean_abs_error"] = float(np.mean(loso))
        out["loso_max_abs_error"] = float(np.max(loso))
    return out


def save(fab: dict[str, Fabric], report: dict, path: str | Path) -> None:
    data = {
        "method": "hetopt.calibrate.fabrics.fit (see its docstring)",
        "csv": report["csv"],
        "fabrics": {
            n: {"eta": f.eta, "alpha_s": f.alpha_s, "source": f.source}
            for n, f in fab.items()
            if n != "ideal"
        },
        "report": report["fabrics"],
        "left_out": report["left_out"],
    }
    write_json(path, data, "fabric table")


def calibrate_cli(csv_path: str, out_path: str | None, force: bool, as_json: bool, console) -> None:
    """`hetopt calibrate --fabrics CSV [--out FILE]`: fit, print the per-fabric report, write the
    table."""
    if out_path:
        check_output(out_path, "--out", force)
    try:
        fab, report = fit(csv_path)
    except KeyError as exc:  # a fabric whose α is borrowed from one the file has no rows for
        raise InputError(
            csv_path,
            [
                Problem(
                    "fabric",
                    f"no usable rows for fabric {exc}, which the fit needs (its α lends to "
                    "others); add its rows or use the full file",
                    str(exc),
                    True,
                )
            ],
        ) from None
    if out_path:
        save(fab, report, out_path)
    if as_json:
        print(json.dumps(report))
        return
    console.print(
        f"{'fabric':11} {'rows':>4} {'≥64MiB':>6} {'η':>6} {'α µs':>8} {'mean err':>8} "
        f"{'max err':>8} {'LOSO':>6}"
    )
    for name, r in report["fabrics"].items():

        def pct(x):
            return "-" if x is None else f"{100 * x:.1f}%"

        console.print(
            f"{name:11} {r['rows']:>4} {r.get('rows_ge_64MiB', 0):>6} {r['eta']:>6.3f} "
            f"{r['alpha_us']:>8.2f} {pct(r.get('mean_abs_error_ge_64MiB')):>8} "
            f"{pct(r.get('max_abs_error_ge_64MiB')):>8} {pct(r.get('loso_mean_abs_error')):>6}"
        )
    console.print(
        f"{len(report['left_out'])} rows left out: " + "; ".join(report["left_out"]), soft_wrap=True
    )
    if out_path:
        console.print(f"fabric table written to {out_path}")
