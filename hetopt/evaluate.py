"""Analytic iteration time and memory of any plan (docs/cost-model.md): the façade over hetopt.cost.

`evaluate` (hetopt.cost.pricing) checks and places a plan, builds its cost features
(hetopt.cost.features) and prices them. The whole cost model lives in hetopt.cost; this module
re-exports the names the planner, the simulator and the CLI price with, and nothing in hetopt.cost
imports it.
"""

from __future__ import annotations

from hetopt.cost.features import (  # noqa: F401 (re-exported)
    BWD,
    BWD_TP,
    DP,
    FWD,
    FWD_TP,
    GRAD_COMM_BYTES,
    N_PARTS,
    OPT,
    P2P,
    Part,
    PlanFeatures,
    cross_template_exchange,
    grad_comm_bytes,
    nic_columns,
    plan_features,
    stage_memory,
    stage_work,
)
from hetopt.cost.pricing import (  # noqa: F401 (re-exported)
    Evaluation,
    by_stage,
    cross_seconds,
    dp_finish,
    evaluate,
    host_device,
    overlap_host_device,
    pipe_times,
    price,
    price_parts,
    price_template,
    streamed_pass,
    zero_exposed,
)
from hetopt.cost.transfers import (  # noqa: F401 (re-exported)
    p2p_features,
    rank_nodes,
    reshard_sends,
    send_features,
    stage_nodes,
)
