"""`hetopt simulate`: replay a plan under each scenario (in parallel processes) and summarise;
with the adaptive policy (hetopt.replan.policy) the replay re-plans as the network changes.

By default a replay covers the instance's horizon H (`search.horizon_s`,
hetopt.spec.scenarios.horizon_of): iterations back to back from t = 0 for as long as the next one
starts before H, under the traces generated to H — the very traces the robust objectives price
(hetopt.search.robust). A scenario whose bandwidth never changes after t = 0 replays one iteration:
every other would be the same. `iterations` replays exactly that many instead, under traces
generated far enough to cover them.

Every replay is bounded (hetopt.sim.engine): an iteration of more than SAMPLE_PASSES passes is
replayed as two smaller samples and extrapolated (the scenario's `sampled` gives their
micro-batches); no iteration starts after REPLAY_PASSES passes, past the deadline, or past the
longest trace the generators may make (`longest_trace_s`; the scenario's `cut` says which).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import as_completed
from typing import Any

from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.lifeline import worker_pool
from hetopt.plan import Plan
from hetopt.replan.policy import PolicyOptions, check_policy, replay_adaptive, run_tokens, summary
from hetopt.sim.engine import Simulation
from hetopt.sim.replay import SimResult
from hetopt.sim.summary import summarise
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import (
    BandwidthScenario,
    varies,
)


def select_scenarios(inst: Instance, name: str, horizon_s: float) -> list[BandwidthScenario]:
    every = inst.scenarios(horizon_s)
    if name == "all":
        return every
    chosen = [s for s in every if s.name == name]
    if not chosen:
        names = [s.name for s in every]
        raise InputError(
            "--scenario",
            [
                Problem(
                    "--scenario",
                    f"no such scenario{did_you_mean(name, names)}; the instance has: "
                    f"{', '.join(names)} (or all)",
                    name,
                    True,
                )
            ],
        )
    return chosen


def _one(args) -> tuple[dict[str, Any], SimResult | None]:
    (
        inst,
        plan,
        profiles,
        scenario,
        iterations,
        until_s,
        keep,
        peak_memory_gib,
        deadline,
        stop_s,
        horizon_s,
        adaptive,
    ) = args
    if adaptive is not None:  # the adaptive policy's replay, with these options, over the horizon
        run = replay_adaptive(inst, plan, scenario, horizon_s, adaptive, profiles, keep, deadline)
        return summary(inst, run, scenario, horizon_s, profiles), (run.merged if keep else None)
    sim = Simulation(inst, plan, profiles)
    result = sim.run(
        scenario, iterations, record=keep, until_s=until_s, deadline=deadline, stop_s=stop_s
    )
    entry = summarise(inst, sim, scenario, result, peak_memory_gib, horizon_s)
    if until_s is not None and result.sampled:
        # one sampled iteration stood for the horizon: its tokens by the segments of the adaptive
        # policy's replay, a sample per bandwidth phase, not one iteration's rate throughout (a
        # replay cut short keeps the count of what it replayed, the rest at its last rate)
        static = replay_adaptive(
            inst,
            plan,
            scenario,
            horizon_s,
            PolicyOptions(),
            profiles,
            deadline=deadline,
            adapt=False,
        )
        entry["tokens"] = run_tokens(inst, static, horizon_s)
    return entry, (result if keep else None)


def simulate(
    inst: Instance,
    plan: Plan,
    scenario: str = "all",
    iterations: int | None = None,
    profiles: Profiles | None = None,
    keep_records: bool = False,
    workers: int | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    policy: str = "static",
    policy_options: PolicyOptions | None = None,
):
    """Simulate every chosen scenario.

    Parameters:
        inst: the instance; plan: the plan (placed here if it has no placement).
        scenario: a scenario name, or "all".
        iterations: iterations back to back per scenario; None (default) replays the horizon (module
            docstring).
        profiles: calibration profiles. keep_records: keep the first scenario's records (for a trace
        or a plot). workers: processes for the scenarios; default one per scenario up to the CPU
        count. deadline: a `time.time()` after which no replay starts another iteration (each
        scenario replays
            at least one; its `cut` says where it stopped).
        progress: progress(scenarios replayed, scenarios) after each one. policy: static (the plan
        throughout) or replan (the adaptive policy, hetopt.replan.policy: it
            re-plans at the changes it sees and pays each switch; over the horizon only).
        policy_options: the adaptive policy's settings (default: the instance's `replan:` section).
    Returns: (the JSON-ready `{"scenarios": [...]}`, records of the first scenario or None; with the
    adaptive policy, each scenario's switches of plans are in its entry).
    Raises: InputError for an unknown policy, or `iterations` with the adaptive policy.
    """
    if check_policy(policy) == "replan" and iterations is not None:
        raise InputError(
            "--iterations",
            [
                Problem(
                    "--iterations",
                    "the adaptive policy replays the horizon (search.horizon_s): leave "
                    "--iterations out",
                    iterations,
                    True,
                )
            ],
        )
    adaptive = (policy_options or PolicyOptions.of(inst)) if policy == "replan" else None
    profiles = profiles or Profiles()
    # the memory per stage, and the trace length for `iterations` (no second model)
    analytic = evaluate(inst, plan, profiles)
    horizon_s = inst.horizon_s
    stop_s = None
    if iterations is None:
        chosen = select_scenarios(inst, scenario, horizon_s)
        runs = [(1, horizon_s if varies(sc) else None) for sc in chosen]
    else:  # traces long enough for iterations four times slower than the analytic estimate
        trace_s = max(horizon_s, analytic.iteration_time_s * iterations * 4 + 60)
        longest_s = max(horizon_s, inst.longest_trace_s)
        if trace_s > longest_s:  # the generated traces end there, and the replays that follow them
            trace_s = stop_s = longest_s
        chosen = select_scenarios(inst, scenario, trace_s)
        runs = [(iterations, None)] * len(chosen)
    generated = inst.generated_scenarios
    # tokens count over the horizon when it is replayed, else over the iterations asked for
    tokens_s = horizon_s if iterations is None else None
    jobs = [
        (
            inst,
            plan,
            profiles,
            sc,
            n,
            until_s,
            keep_records and i == 0,
            analytic.peak_memory_gib,
            deadline,
            stop_s if sc.name in generated else None,
            tokens_s,
            adaptive,
        )
        for i, (sc, (n, until_s)) in enumerate(zip(chosen, runs, strict=True))
    ]
    workers = workers if workers is not None else min(len(jobs), os.cpu_count() or 1)
    tell = progress or (lambda done, total: None)
    tell(0, len(jobs))
    if workers > 1 and len(jobs) > 1:
        # spawned workers that end with this process (`hetopt solve` simulates after solving
        # in-process, and a fork would inherit solver threads)
        with worker_pool(workers) as pool:
            futures = [pool.submit(_one, job) for job in jobs]
            for done, _ in enumerate(as_completed(futures), 1):
                tell(done, len(jobs))
            outcomes = [f.result() for f in futures]
    else:
        outcomes = []
        for job in jobs:
            outcomes.append(_one(job))
            tell(len(outcomes), len(jobs))
    return {"scenarios": [o[0] for o in outcomes]}, outcomes[0][1]
