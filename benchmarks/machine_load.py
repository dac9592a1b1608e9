"""How much of the machine other processes use while a benchmark runs (stdlib only).

The CPU counters of ``/proc/stat`` (Linux) give the time every core spent busy; subtracting this process's
own CPU time (``os.times``: its threads, and children it waited for) leaves the share of the cores that
other processes took. Timings and efficiencies measured while that share is large are low and vary.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes above this share of the cores make a run's figures unreliable (a quiet machine shows a
# few percent: daemons, the terminal).
BUSY_SHARE = 0.15


def _busy_seconds() -> tuple[float, int] | None:
    """Seconds all cores spent busy since boot, and the number of cores, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    fields = [int(v) for v in lines[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
    busy = sum(fields[:3]) + sum(fields[5:8])
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return busy / os.sysconf("SC_CLK_TCK"), cores


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Reading:
    wall: float
    busy: float
    own: float


class LoadMeter:
    """``share(since)``: the fraction of the machine's cores that other processes used since a reading."""

    def __init__(self):
        first = _busy_seconds()
        self.cores = first[1] if first else 0

    @property
    def available(self) -> bool:
        return self.cores > 0

    def read(self) -> Reading | None:
        counters = _busy_seconds()
        if counters is None:
            return None
        return Reading(time.monotonic(), counters[0], _own_seconds())

    def share(self, since: Reading | None) -> float | None:
        now = self.read()
        if since is None or now is None or now.wall <= since.wall:
            return None
        others = (now.busy - since.busy) - (now.own - since.own)
        return min(max(others / ((now.wall - since.wall) * self.cores), 0.0), 1.0)

    def idle_share(self, seconds: float = 1.0) -> float | None:
        """Others' share over ``seconds`` while this process sleeps."""
        start = self.read()
        time.sleep(seconds)
        return self.share(start)


def describe(cores: int, before: float | None, during: float | None, after: float | None) -> str:
    """One line: the share of the cores other processes used during the run (and in a second before and after
    it), and whether the machine was too busy for the figures to be trusted."""
    shares = [s for s in (before, during, after) if s is not None]
    if not shares:
        return "Machine load: not measured (no /proc/stat on this system)."
    around = ", ".join(f"{100 * s:.0f}% {name}" for name, s in (("before", before), ("after", after)) if s is not None)
    main = f"{100 * during:.0f}% of the {cores} cores during the run" if during is not None else f"of the {cores} cores"
    measured = f"other processes used {main}" + (f" ({around})" if around else "")
    if max(shares) > BUSY_SHARE:
        return f"MACHINE BUSY: {measured}; times and efficiencies are worse than on a quiet machine and unreliable."
    return f"Machine quiet: {measured}."
