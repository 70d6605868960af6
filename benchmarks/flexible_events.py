"""Arrivals and departures of ``flexible_participation.py --experiment arrival|departure`` (Ruan et al. 2021, §5.3-5.4).

One device (the last) arrives at, or departs at, round ``tau0``; every other device is present
from round 0. Scheme C, the first 5 traces (no inactivity) and equal device sizes, as the paper.
The global model is evaluated on the held-out data of the devices in the objective at each
round (``holdout_fraction``), so the test set grows with an arrival and, under ``"exclude"``,
shrinks with a departure, as the paper's. Table 4 counts the rounds until the test accuracy is
back to its value before the arrival (fast-reboot vs vanilla reboot; both restart the learning
rate), Table 5 the rounds until the "exclude" test loss comes down to the "include" one
(:mod:`fl_lightning.participation.recovery`); Table 5 also lists each seed's crossing and area per
tau0 and tests the tau0 trend as the paired difference of each later tau0 minus the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reporting import mean_std, significance

#: Each device's held-out fraction of its training split (the server's test set of the objective).
HOLDOUT = 0.1
#: The arrival and departure runs use only the first 5 traces (no inactivity) and scheme C (§5.3).
EVENT_TRACES, EVENT_SCHEME = 5, "C"
#: Equal device sizes (§5.3: "the same number of samples"; the number is not stated).
EVENT_SAMPLES = 200
VARIANTS = {"arrival": ("fast", "vanilla"), "departure": ("exclude", "include")}
#: Table 4, SYNTHETIC row: rounds to recover, (fast-reboot, vanilla), by tau0.
PAPER_TABLE4 = {10: (1, 1), 30: (4, 6), 50: (7, 12), 70: (3, 8)}
#: Table 5: rounds until the include and exclude test losses coincide, by (alpha, beta) and tau0.
PAPER_TABLE5 = {
    (0.1, 0.1): dict(zip(range(10, 55, 5), (2, 5, 3, 3, 9, 3, 10, 26, 40))),
    (0.5, 0.5): dict(zip(range(10, 55, 5), (1, 3, 9, 14, 13, 7, 12, 36, 34))),
    (1.0, 1.0): dict(zip(range(10, 55, 5), (10, 9, 27, 18, 34, 17, 28, 62, 77))),
}


@dataclass(frozen=True)
class Event:
    """The last device arrives (``variant`` ``"fast"`` or ``"vanilla"`` reboot) or departs
    (``"exclude"`` or ``"include"``) at round ``round`` = tau0."""

    kind: Literal["arrival", "departure"]
    round: int
    variant: str

    def algorithm_kwargs(self, devices: int) -> dict[str, Any]:
        """``FlexibleParticipation`` arguments for this event."""
        from fl_lightning.participation import Arrival, Departure

        if self.kind == "arrival":
            return {"arrivals": [Arrival(client=devices - 1, round=self.round)], "fast_reboot": self.variant == "fast"}
        return {"departures": [Departure(client=devices - 1, round=self.round, policy=self.variant)]}  # type: ignore[arg-type]


def _cells(values: list[int | None], horizon: int) -> tuple[str, str]:
    """(mean ± std over the seeds that recovered, per-seed values with ``>H`` for the others)."""
    done = [v for v in values if v is not None]
    summary = mean_std(done, 1) if done else "-"
    if len(done) < len(values):
        summary += f" ({len(done)}/{len(values)} seeds)"
    return summary, ", ".join(str(v) if v is not None else f">{horizon}" for v in values)


def _paired(a: list[int | None], b: list[int | None], horizon: int) -> str:
    """Seeds where ``a`` recovers sooner / at the same round / later than ``b`` (``None``: after the horizon)."""
    sa = [horizon + 1 if v is None else v for v in a]
    sb = [horizon + 1 if v is None else v for v in b]
    return f"{sum(x < y for x, y in zip(sa, sb))} / {sum(x == y for x, y in zip(sa, sb))} / {sum(x > y for x, y in zip(sa, sb))}"


def area_between(a: list[float], b: list[float]) -> float:
    """The smoothed measure of Tables 4-5: the sum over the rounds from tau0 on of ``a - b`` (entry 0
    of a curve is round tau0 - 1, before the event), i.e. the area between the two curves."""
    return sum(x - y for x, y in zip(a[1:], b[1:]))


def arrival_table(results: list[Any], horizon: int) -> list[str]:
    """Table 4: rounds to recover the pre-arrival test accuracy, fast-reboot vs vanilla, per tau0."""
    from fl_lightning.participation import recovery_rounds

    # Entry 0 of a run's curves is round tau0 - 1, so tau0 is 1 in the curve's own indexing.
    by = {(r.spec.event.round, r.spec.event.variant, r.spec.seed): r for r in results}
    seeds = sorted({r.spec.seed for r in results})
    lines = [
        "| tau0 | fast-reboot: rounds to recover | per seed | vanilla: rounds to recover | per seed | fast sooner / same / later "
        "| acc at tau0 - 1 | acc after round tau0 (fast / vanilla) | area fast − vanilla (acc x rounds) | 95 % CI, significant "
        "| paper (fast / vanilla) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tau0 in sorted({r.spec.event.round for r in results}):
        runs = {v: [by[(tau0, v, s)] for s in seeds] for v in VARIANTS["arrival"]}
        rec = {v: [recovery_rounds(r.accs, 1) for r in rs] for v, rs in runs.items()}
        fast, vanilla = _cells(rec["fast"], horizon), _cells(rec["vanilla"], horizon)
        paper = PAPER_TABLE4.get(tau0)
        area = [area_between(f.accs, v.accs) for f, v in zip(runs["fast"], runs["vanilla"])]
        lines.append(
            f"| {tau0} | {fast[0]} | {fast[1]} | {vanilla[0]} | {vanilla[1]} | {_paired(rec['fast'], rec['vanilla'], horizon)} "
            f"| {mean_std([r.accs[0] for r in runs['fast']])} "
            f"| {mean_std([r.accs[1] for r in runs['fast']])} / {mean_std([r.accs[1] for r in runs['vanilla']])} "
            f"| {mean_std(area, 2)} | {significance(area)} | {f'{paper[0]} / {paper[1]}' if paper else '-'} |"
        )
    return lines


def departure_table(results: list[Any], horizon: int) -> list[str]:
    """Table 5: rounds until the exclude test loss comes down to the include one, per (alpha, beta) and tau0."""
    from fl_lightning.participation import crossing_rounds

    by = {
        (r.spec.settings.alpha, r.spec.settings.beta, r.spec.event.round, r.spec.event.variant, r.spec.seed): r
        for r in results
    }
    seeds = sorted({r.spec.seed for r in results})
    lines = [
        "| (alpha, beta) | tau0 | rounds until exclude <= include | per seed | loss at tau0 - 1 "
        "| loss after round tau0 (exclude / include) | final loss (exclude / include) | area exclude − include (loss x rounds) "
        "| 95 % CI, significant | paper |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for alpha, beta, tau0 in sorted({(k[0], k[1], k[2]) for k in by}):
        ex = [by[(alpha, beta, tau0, "exclude", s)] for s in seeds]
        inc = [by[(alpha, beta, tau0, "include", s)] for s in seeds]
        cross = _cells([crossing_rounds(e.losses, i.losses, 1) for e, i in zip(ex, inc)], horizon)
        paper = PAPER_TABLE5.get((alpha, beta), {}).get(tau0, "-")
        area = [area_between(e.losses, i.losses) for e, i in zip(ex, inc)]
        lines.append(
            f"| ({alpha:g}, {beta:g}) | {tau0} | {cross[0]} | {cross[1]} | {mean_std([r.losses[0] for r in inc])} "
            f"| {mean_std([r.losses[1] for r in ex])} / {mean_std([r.losses[1] for r in inc])} "
            f"| {mean_std([r.losses[-1] for r in ex])} / {mean_std([r.losses[-1] for r in inc])} | {mean_std(area, 2)} "
            f"| {significance(area)} | {paper} |"
        )
    return [*lines, "", *departure_trend(by, seeds, horizon)]


def departure_trend(by: dict[tuple[Any, ...], Any], seeds: list[int], horizon: int) -> list[str]:
    """Table 5's tau0 trend: each seed's crossing round and area per tau0, and the paired difference
    (same seed: same data, traces and init) of each later tau0 minus the first, with the one rule."""
    from fl_lightning.participation import crossing_rounds

    lines = [
        "Per seed (seeds " + ", ".join(map(str, seeds)) + "):",
        "",
        "| (alpha, beta) | tau0 | rounds until exclude <= include | area exclude − include |",
        "|---|---|---|---|",
    ]
    diffs = [
        "Paired differences over seeds, each tau0 minus the first (crossing: the seeds that cross at both):",
        "",
        "| (alpha, beta) | tau0 pair | crossing difference (rounds) | 95 % CI, significant | seeds "
        "| area difference (loss x rounds) | 95 % CI, significant |",
        "|---|---|---|---|---|---|---|",
    ]
    for alpha, beta in sorted({k[:2] for k in by}):
        cross: dict[int, list[int | None]] = {}
        area: dict[int, list[float]] = {}
        for tau0 in sorted({k[2] for k in by if k[:2] == (alpha, beta)}):
            pairs = [(by[(alpha, beta, tau0, "exclude", s)], by[(alpha, beta, tau0, "include", s)]) for s in seeds]
            cross[tau0] = [crossing_rounds(e.losses, i.losses, 1) for e, i in pairs]
            area[tau0] = [area_between(e.losses, i.losses) for e, i in pairs]
            lines.append(
                f"| ({alpha:g}, {beta:g}) | {tau0} | {_cells(cross[tau0], horizon)[1]} | {', '.join(f'{a:.2f}' for a in area[tau0])} |"
            )
        first, *later = sorted(cross)
        for tau0 in later:
            both = [b - a for a, b in zip(cross[first], cross[tau0]) if a is not None and b is not None]
            darea = [b - a for a, b in zip(area[first], area[tau0])]
            crossing = f"{mean_std(both, 1)} | {significance(both)}" if both else "- | -"
            diffs.append(
                f"| ({alpha:g}, {beta:g}) | {tau0} − {first} | {crossing} | {len(both)}/{len(seeds)} "
                f"| {mean_std(darea, 2)} | {significance(darea)} |"
            )
    return [*lines, "", *diffs]

