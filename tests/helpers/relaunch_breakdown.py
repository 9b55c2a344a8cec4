"""Where a relaunch's time goes, from the run's own records: the pieces between a node's loss and
the next trained step, for the table in docs/lost-nodes.md (the silent-node and hot-spare tests print it).

- until the step ended: from the loss to srun's return (Slurm's notice, or the heartbeat
  watcher's silence and its kill of the step);
- decision: the control step's after-step (`relaunch`'s decided_s);
- launch, imports, rendezvous, resume: the new step's start-up (`start`'s startup);
- first step: from `start` to the first trained step logged after it.
"""

from __future__ import annotations

import json
from pathlib import Path


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def breakdown(run_dir: Path, lost_at: float) -> dict[str, float]:
    """Seconds per piece of the last relaunch after `lost_at`; `total` to the first step after it."""
    events = _records(run_dir / "events.jsonl")
    relaunch = next(e for e in events if e["event"] == "relaunch" and e["time"] > lost_at)
    start = next(e for e in events if e["event"] == "start" and e["time"] > relaunch["time"])
    first = next(r for r in _records(run_dir / "metrics.jsonl") if (r.get("time") or 0) > start["time"])
    decided_s = relaunch.get("decided_s") or 0.0
    startup = start.get("startup") or {}
    pieces = {
        "step ended": relaunch["time"] - decided_s - lost_at,
        "decision": decided_s,
        **{
            name.removesuffix("_s"): startup[name]
            for name in ("launch_s", "imports_s", "rendezvous_s", "resume_s")
            if name in startup
        },
        "first step": first["time"] - start["time"],
    }
    pieces["unaccounted"] = (first["time"] - lost_at) - sum(pieces.values())
    pieces["total"] = first["time"] - lost_at
    return {k: round(v, 2) for k, v in pieces.items()}


def told(pieces: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in pieces.items())
