"""What a run costs (hpctrain/status/cost.py, usage.py): tables over real records.

The journals: the chaos soak's (tests/golden/goodput_soak: job 7 requeued five times, then job 10
relaunched onto its spare node) and small ones in the trainer's format. sacct's lines: captured
on the dev cluster (tests/fixtures/sacct_usage/README.md says how), with and without GPUs counted
by accounting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.run.events import Event, Replanned, Start, from_record, read_events
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.status.cost import Plan, Shape, hours, life_shapes, plan_at, read_plan, run_cost
from hpctrain.status.goodput import goodput
from hpctrain.status.slurm_query import parse_sacct, parse_usage
from hpctrain.status.usage import Usage, parse_tres

USAGE = Path(__file__).parent / "fixtures" / "sacct_usage"
SOAK = Path(__file__).parent / "golden" / "goodput_soak"


def ev(name: str, t: float, **fields: object) -> Event:
    event = from_record({"event": name, "time": t, **fields})
    assert event is not None, (name, fields)
    return event


# ---- sacct's lines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("billing=2,cpu=2,gres/gpu=4,node=2", {"billing": 2, "cpu": 2, "gres/gpu": 4, "node": 2}),
        ("billing=1,cpu=1,mem=12000M,node=1", {"billing": 1, "cpu": 1, "node": 1}),  # mem is no count
        ("cpu=8,gres/gpu:a100=4,gres/gpu=4,node=1", {"cpu": 8, "gres/gpu:a100": 4, "gres/gpu": 4, "node": 1}),
        ("", {}),
    ],
)
def test_alloc_tres(text: str, expected: dict[str, int]) -> None:
    assert parse_tres(text) == expected


TRACKED_IDS = ["23817010", "23817011", "23817012", "23817013_0", "23817013_1", "23817014"]


@pytest.mark.parametrize(
    ("fixture", "job_id", "expected"),
    [
        # 2 nodes x 2 GPUs: AllocTRES counts the whole allocation.
        ("gpus_tracked.txt", "23817010", [Usage("COMPLETED", 3, 2, 4)]),
        # Accounting counts GPUs (other lines name gres/gpu): a job without one held 0.
        ("gpus_tracked.txt", "23817011", [Usage("COMPLETED", 2, 1, 0)]),
        # Requeued by hand, then completed: each life its own line, oldest first.
        ("gpus_tracked.txt", "23817012", [Usage("REQUEUED", 2, 1, 1), Usage("COMPLETED", 6, 1, 1)]),
        ("gpus_tracked.txt", "23817013_0", [Usage("COMPLETED", 2, 1, 1)]),  # raw id 23817015
        ("gpus_tracked.txt", "23817014", [Usage("PENDING", 0, 0, 0)]),  # nothing allocated yet
        # Slurm's default AccountingStorageTRES: no line says gres/gpu, so the GPUs are unknown.
        ("gpus_untracked.txt", "23817000", [Usage("COMPLETED", 4, 2, None)]),
        ("gpus_untracked.txt", "23817002", [Usage("REQUEUED", 3, 1, None), Usage("COMPLETED", 6, 1, None)]),
        ("running_and_cancelled.txt", "23817016", [Usage("RUNNING", 5, 1, 2)]),
        ("running_and_cancelled.txt", "23817014", [Usage("CANCELLED", 0, 0, 0)]),  # "CANCELLED by 0"
    ],
)
def test_usage_of_each_life(fixture: str, job_id: str, expected: list[Usage]) -> None:
    text = (USAGE / fixture).read_text()
    ids = [job_id] if fixture == "running_and_cancelled.txt" else TRACKED_IDS + ["23817000", "23817002"]
    assert parse_usage(text, ids)[job_id] == expected


def test_the_state_reader_takes_the_usage_lines_too() -> None:
    """One sacct call answers both: its states read as before (restarts = lives - 1)."""
    jobs = parse_sacct((USAGE / "gpus_tracked.txt").read_text(), TRACKED_IDS)
    assert (jobs["23817012"].state, jobs["23817012"].restarts) == ("COMPLETED", 1)
    assert jobs["23817014"].state == "PENDING"


# ---- what each life held, from the records -------------------------------------------------------


def test_the_soak_s_lives_held_its_spare_until_the_relaunch_used_it() -> None:
    """Job 7 and job 10 asked for 2 training nodes and 1 spare (3 nodes); job 10 lost node2 and
    relaunched on node1 and node3, its spare: that life held 2 (`spare_nodes: 0` left)."""
    events = read_events(SOAK / "events.jsonl")
    shapes = life_shapes(events, Plan(gpus_per_node=0, spare_nodes=1))
    assert [s.nodes for s in shapes] == [3, 3, 3, 3, 3, 3, 3, 2]
    assert {s.gpus for s in shapes} == {0}
    with_gpus = life_shapes(events, Plan(gpus_per_node=2, spare_nodes=1))
    assert [s.gpus for s in with_gpus] == [6] * 7 + [4]


def start(t: float, **fields: object) -> Event:
    record = {"job_id": "5", "restart": 0, "world_size": 2, "nodes": ["node1", "node2"], "resumed_from_step": 0}
    return ev("start", t, **{**record, **fields})


@pytest.mark.parametrize(
    ("label", "events", "plan", "expected"),
    [
        ("the config's spares and GPUs", [start(0)], Plan(4, 1), [Shape(3, 12, 4)]),
        ("what the start recorded wins", [start(0, job_nodes=4, gpus_per_node=8)], Plan(4, 1), [Shape(4, 32, 8)]),
        (
            "a requeue that lowered the node count",
            [start(0), ev("requeue", 5, job_id="5", cause="node_failure", nodes=2), start(9, restart=1)],
            Plan(1, 1),
            [Shape(3, 3, 1), Shape(2, 2, 1)],
        ),
        (
            "a replan after the first life: each life its own plan",
            [start(0), ev("replanned", 5, changes={"slurm.spare_nodes": [1, 0]}), start(9, job_id="6")],
            Plan(2, 0),
            [Shape(3, 6, 2), Shape(2, 4, 2)],
        ),
        (
            "hpctrain-train: this machine, the CUDA devices its ranks drove",
            [start(0, job_id=None, nodes=["box"], ranks=[{"device": "cuda:0"}, {"device": "cuda:1"}])],
            Plan(8, 1),
            [Shape(1, 2, 2)],
        ),
        ("hpctrain-train on CPU", [start(0, job_id=None, ranks=[{"device": "cpu"}])], Plan(), [Shape(1, 0, 0)]),
    ],
)
def test_life_shapes(label: str, events: list[Event], plan: Plan, expected: list[Shape]) -> None:
    assert life_shapes(events, plan) == expected, label


def test_a_plan_is_the_one_each_life_ran_with() -> None:
    events = [
        ev("replanned", 10, changes={"slurm.spare_nodes": [0, 1]}),
        ev("replanned", 20, changes={"slurm.spare_nodes": [1, 2], "trainer.max_steps": [10, 20]}),
    ]
    assert isinstance(events[0], Replanned)
    now = Plan(gpus_per_node=4, spare_nodes=2)
    assert [plan_at(now, events, t).spare_nodes for t in (5, 15, 25)] == [0, 1, 2]


def test_read_plan(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("slurm:\n  nodes: 2\n  gpus_per_node: 4\n  spare_nodes: 1\n")
    assert read_plan(config) == Plan(4, 1)
    assert read_plan(tmp_path / "none.yaml") == Plan()


# ---- the cost -----------------------------------------------------------------------------------


def test_the_soak_from_its_records_alone() -> None:
    """No accounting: each life's allocated time x the nodes it held; kept = goodput's kept."""
    events = read_events(SOAK / "events.jsonl")
    figures = goodput(events, read_jsonl(SOAK / "metrics.jsonl"))
    cost = run_cost(events, figures, Plan(gpus_per_node=2, spare_nodes=1), {})
    last = figures.lives[-1].allocated_s
    assert cost.node_s == pytest.approx(3 * (figures.allocated_s - last) + 2 * last)
    assert cost.gpu_s == pytest.approx(2 * cost.node_s)
    kept_last = figures.lives[-1].kept_s
    assert cost.kept_gpu_s == pytest.approx(6 * (figures.kept_s - kept_last) + 4 * kept_last)
    # Job 7's six lives and job 10's one allocation (its relaunch stayed in it).
    assert [(a.job_id, a.restart) for a in cost.allocations] == [("7", r) for r in range(6)] + [("10", 0)]
    assert cost.allocations[-1].nodes == 3 and cost.allocations[-1].elapsed_s == pytest.approx(
        figures.lives[-2].allocated_s + last
    )
    assert (cost.source, cost.gpus_source) == ("records", "records")
    assert cost.kept_pct == pytest.approx(100 * cost.kept_gpu_s / cost.gpu_s)
    assert cost.to_json()["gpu_hours"] == pytest.approx(cost.gpu_s / 3600, abs=1e-6)
    # A CPU run: no GPU-hours at all, not 0 of them; its share is of node-hours.
    cpu = run_cost(events, figures, Plan(gpus_per_node=0, spare_nodes=1), {})
    assert (cpu.gpu_s, cpu.kept_gpu_s, cpu.gpus_source) == (None, None, None)
    assert cpu.kept_pct == pytest.approx(100 * cpu.kept_node_s / cpu.node_s)


def requeued_job(job: str, gpus_per_node: int | None = None) -> list[Event]:
    """Job `job`'s journal: a life requeued at step 10, then one that finished at 20."""
    extra = {} if gpus_per_node is None else {"gpus_per_node": gpus_per_node}
    return [
        start(100, job_id=job, nodes=["node3"], allocated_at=99.5, **extra),
        ev("checkpoint", 101.0, step=10, reason="timelimit", blocking_s=0.1, write_s=0.1),
        ev("requeue", 101.5, job_id=job, cause="timelimit"),
        start(200, job_id=job, restart=1, nodes=["node3"], resumed_from_step=10, allocated_at=199.0, **extra),
        ev("finish", 204.0, step=20),
    ]


METRICS = [{"step": 10, "time": 100.9}, {"step": 20, "time": 203.9}]


@pytest.mark.parametrize(
    ("label", "fixture", "plan", "expected"),
    [
        # AllocTRES gres/gpu=1 on both lives: 2 s and 6 s of one node and one GPU.
        ("sacct counts GPUs", "gpus_tracked.txt", Plan(0, 0), ([2, 6], 8 / 3600, 8 / 3600, "sacct", "sacct")),
        # No gres/gpu in AllocTRES: the records' GPUs per node (config: 1) on sacct's node count.
        ("GPUs from the records", "gpus_untracked.txt", Plan(1, 0), ([3, 6], 9 / 3600, 9 / 3600, "sacct", "records")),
        ("a CPU job, GPUs not counted", "gpus_untracked.txt", Plan(0, 0), ([3, 6], 9 / 3600, None, "sacct", None)),
    ],
)
def test_sacct_wins_where_it_answers(label: str, fixture: str, plan: Plan, expected: tuple) -> None:
    job = "23817012" if fixture == "gpus_tracked.txt" else "23817002"
    events = requeued_job(job)
    figures = goodput(events, METRICS)
    usage = parse_usage((USAGE / fixture).read_text(), [job])
    cost = run_cost(events, figures, plan, usage)
    elapsed, node_h, gpu_h, source, gpus_source = expected
    assert [a.elapsed_s for a in cost.allocations] == elapsed, label
    assert cost.to_json()["node_hours"] == pytest.approx(node_h, abs=1e-6)
    assert cost.to_json()["gpu_hours"] == (None if gpu_h is None else pytest.approx(gpu_h, abs=1e-6))
    assert (cost.source, cost.gpus_source) == (source, gpus_source)
    # Kept time comes from the records: steps 0-10 (0.9 s after allocated_at's start) and 10-20.
    assert [round(a.kept_s, 3) for a in cost.allocations] == [round(life.kept_s, 3) for life in figures.lives]


def test_records_fill_in_where_sacct_does_not_know_a_job() -> None:
    """The run's first job is long gone from accounting (or another cluster's): records; its
    second, resubmitted job from sacct; and sacct's life the records lack (ended before its
    `start`) counts, keeping nothing."""
    events = [
        start(0, job_id="41", nodes=["node1"]),
        ev("failure", 10, job_id="41", cause="crash"),
        start(50, job_id="23817010", nodes=["node1", "node2"], resumed_from_step=0),
        ev("finish", 53, step=5),
    ]
    figures = goodput(events, [{"step": 5, "time": 52.5}])
    usage = parse_usage((USAGE / "gpus_tracked.txt").read_text(), ["23817010", "23817011"])
    cost = run_cost(events, figures, Plan(2, 0), usage, job_ids=["23817011"])
    assert [(a.job_id, a.source, a.nodes, a.gpus) for a in cost.allocations] == [
        ("41", "records", 1, 2),
        ("23817010", "sacct", 2, 4),
        ("23817011", "sacct", 1, None),  # sacct counts GPUs and this job held none
    ]
    assert cost.source == "sacct+records" and cost.gpus_source == "sacct+records"
    assert cost.allocations[2].kept_s == 0
    assert cost.node_s == pytest.approx(10 * 1 + 3 * 2 + 2 * 1)
    assert cost.gpu_s == pytest.approx(10 * 2 + 3 * 4)


def test_nothing_allocated_yet() -> None:
    cost = run_cost([], goodput([], []), Plan(2, 0), {"7": [Usage("PENDING", 0, 0, None)]}, job_ids=["7"])
    assert cost.allocations == [] and cost.source is None and cost.kept_pct is None
    assert cost.to_json(False) == {
        "node_hours": 0.0,
        "gpu_hours": None,
        "kept_gpu_hours": None,
        "kept_node_hours": 0.0,
        "kept_pct": None,
        "source": None,
        "gpus_source": None,
    }


def test_start_reads_old_journals_and_new_fields() -> None:
    old = from_record({"event": "start", "time": 1.0, "job_id": "5", "nodes": ["n1"], "world_size": 1})
    new = from_record({"event": "start", "time": 1.0, "job_id": "5", "job_nodes": 3, "gpus_per_node": 8})
    assert isinstance(old, Start) and (old.job_nodes, old.gpus_per_node) == (None, None)
    assert isinstance(new, Start) and (new.job_nodes, new.gpus_per_node) == (3, 8)
    assert "job_nodes" not in old.to_record() and new.to_record()["gpus_per_node"] == 8


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.0, "0.000"),
        (18.0, "0.005"),
        (3600 * 1.234, "1.23"),
        (3600 * 48.25, "48.2"),
        (3600 * 12345.6, "12346"),
    ],
)
def test_hours(seconds: float | None, shown: str) -> None:
    assert hours(seconds) == shown
