"""The phase-by-fault matrix: every moment of a job's life crossed with every fault a site sends,
each cell's expected outcome and the tests that assert it.

One place for what the docs' "Phase by fault" page (docs/fault-matrix.md) says:
`python tests/phase_fault_matrix.py` prints its table (`--cells`: each cell's outcome and tests),
and tests/test_phase_fault_matrix.py checks that every cell is here, that every test a cell names
exists, and that the page shows exactly this table. A cell without a test is open:
its outcome is what hpctrain is meant to do there, not yet asserted at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass

# The moments of a life, in order, each with the fault point that holds a process there.
PHASES = {
    "begin": ("before `control begin`", "batch.before_begin"),
    "setup": ("`slurm.setup`", "batch.setup"),
    "imports": ("a task imports torch", "worker.before_imports"),
    "rendezvous": ("rendezvous", "worker.before_rendezvous"),
    "resume": ("resume (loading)", "trainer.resume_loading"),
    "step": ("a training step", "trainer.step"),
    "periodic": ("periodic write in flight", "checkpoint.periodic_in_flight"),
    "forced": ("forced save in flight", "checkpoint.forced_in_flight"),
    "renames": ("between the two renames", "checkpoint.between_renames"),
    "after_step": ("`after-step` judging", "control.after_step"),
    "requeue": ("asking `scontrol requeue`", "batch.before_requeue"),
    "hold": ("the requeue hold (PENDING)", ""),
}
FAULTS = {
    "preempt_0": "preemption, GraceTime 0",
    "preempt_grace": "preemption, GraceTime > 0",
    "scancel": "`scancel`",
    "admin_requeue": "admin `scontrol requeue`",
    "warning": "time-limit warning",
    "node_down": "node down",
    "rank_kill": "a rank SIGKILLed",
    "rank_stop": "a rank SIGSTOPped",
    "slurmctld": "slurmctld away 30 s",
    "disk_full": "checkpoint disk full",
}


@dataclass(frozen=True)
class Cell:
    short: str  # the action, a word or two, for the grid
    outcome: str  # what happens: action, budget charged, events, steps redone
    proof: tuple[str, ...] = ()  # tests asserting it, "FILE::FUNCTION" or "...::test_decide[ROW]"

    @property
    def state(self) -> str:
        if self.short == "n/a":
            return "n/a"
        return "asserted" if self.proof else "open"


def na(why: str) -> Cell:
    return Cell("n/a", why)


DECIDE = "tests/test_decide.py::test_decide"
GUARD = "tests/test_guardian.py::test_decide_guard"
MOMENTS = "tests/test_slurm_moments.py::test_faults_at_the_batch_scripts_worst_moments_side_by_side"
START = "tests/test_slurm_start_faults.py::test_scancel_admin_requeue_and_warning_as_a_life_starts"
WRITES = "tests/test_slurm_start_faults.py::test_scancel_admin_requeue_and_warning_while_a_checkpoint_is_written"
START_PREEMPT = (
    "tests/test_slurm_start_preemption.py::test_a_preemption_with_and_without_grace_at_the_rendezvous_and_the_resume"
)
START_PREEMPT_BATCH = (
    "tests/test_slurm_start_preemption.py::test_a_preemption_with_and_without_grace_at_the_batch_scripts_own_moments"
)
START_PREEMPT_WRITES = (
    "tests/test_slurm_start_preemption.py::test_a_preemption_with_and_without_grace_while_a_checkpoint_is_written"
)
STOPPED_WRITING = (
    "tests/test_stopped_rank_while_writing.py::"
    "test_a_rank_stopped_while_a_checkpoint_is_written_is_a_hang_and_the_run_still_ends_exact"
)
HANG_RELAUNCHED = f"{DECIDE}[hang seen by its exit code alone: relaunch]"
FULL_WHILE_WRITING = (
    "tests/test_full_disk_while_writing.py::"
    "test_a_full_disk_during_a_forced_save_or_between_the_renames_keeps_the_newest_checkpoint"
)
USER_ERROR_STOPS = f"{DECIDE}[user's mistake]"
START_RANKS = "tests/test_slurm_start_node_faults.py::test_a_rank_killed_or_stopped_as_a_life_starts"
START_NODE = "tests/test_slurm_start_node_faults.py::test_a_node_down_as_a_life_starts_or_a_checkpoint_is_written"
OUTAGE_START = "tests/test_slurm_outage.py::test_slurmctld_stopped_for_30_s_as_a_life_starts_and_as_a_step_is_judged"
OUTAGE_REQUEUE = "tests/test_slurm_outage.py::test_slurmctld_stopped_for_30_s_during_the_requeue"
TRAINING = "tests/test_slurm_training_faults.py::test_admin_requeue_killed_rank_stopped_rank_and_overlaps_side_by_side"
ZERO_GRACE = (
    "tests/test_slurm_training_faults.py::test_a_preemption_without_grace_saves_within_killwait_and_redoes_nothing"
)
POINTS_RUN = "tests/test_fault_points_run.py::test_each_fault_point_acts_at_its_moment_and_the_run_still_ends_exact"
EARLY = "tests/test_early_signals.py::test_a_stop_at_start_up_leaves_at_once_saying_why"
FULL_DISK = (
    "tests/test_slurm_full_disk.py::"
    "test_a_full_checkpoint_disk_keeps_the_newest_checkpoint_and_the_retry_resumes_from_it"
)
GUARDIAN = "tests/test_slurm_guardian.py::test_a_lost_batch_host_is_submitted_again_by_the_guardian_and_ends_exact"
KEEPER = "tests/test_slurm_keeper.py::test_a_job_whose_batch_script_vanished_is_submitted_again_by_the_keeper"
RECOVERY = "tests/test_slurm_recovery.py"

NO_RANKS = na("no task runs yet: only the batch shell")
NOTHING_WRITTEN = na("nothing is written at this moment")
SAVED_REQUEUE = "saved at the stop step, requeued (`preempt`); nothing redone"

CELLS: dict[str, dict[str, Cell]] = {
    "begin": {
        "preempt_0": Cell(
            "requeue", "Slurm requeues; the shell's trap records it (`preempt`, by slurm)", (START_PREEMPT_BATCH,)
        ),
        "preempt_grace": Cell(
            "requeue",
            "`control begin` sees PreemptTime: nothing launched, requeued (`preempt`); no crash charged",
            (START_PREEMPT_BATCH, f"{DECIDE}[preemption's grace running before srun started (no step launched)]"),
        ),
        "scancel": Cell("cancel", "`cancelled`, nothing launched", (START, f"{DECIDE}[scancel before srun started]")),
        "admin_requeue": Cell(
            "requeue", "the trap records Slurm's requeue (`preempt`, by slurm); no `failure`", (START,)
        ),
        "warning": Cell(
            "requeue",
            "nothing launched; requeued (`timelimit`); next life from step 0",
            (START, f"{DECIDE}[time-limit warning before srun started (no step launched)]"),
        ),
        "node_down": Cell(
            "guardian",
            "the batch node: Slurm (1 node) or the guardian (2+) starts the run again (`node_failure`)",
            (f"{GUARD}[batch host lost before the first start]",),
        ),
        "rank_kill": NO_RANKS,
        "rank_stop": NO_RANKS,
        "slurmctld": Cell(
            "trains on", "`control begin` and srun wait for Slurm; one life, no requeue", (OUTAGE_START,)
        ),
        "disk_full": Cell(
            "stop",
            "`control begin` cannot take the life's generation: no room, said in one line, nothing launched; "
            "FAILED, not requeued, the guardian finds no room; `--retry` trains it",
            (
                "tests/test_slurm_full_disk.py::test_a_disk_full_before_control_begin_ends_the_job_and_the_retry_trains_it",
            ),
        ),
    },
    "setup": {
        "preempt_0": Cell(
            "requeue", "the trap records Slurm's requeue (`preempt`, by slurm); no `failure`", (START_PREEMPT_BATCH,)
        ),
        "preempt_grace": Cell(
            "requeue",
            "`control begin` sees PreemptTime: nothing launched, requeued (`preempt`)",
            (START_PREEMPT_BATCH,),
        ),
        "scancel": Cell("cancel", "`cancelled`, nothing launched", (f"{DECIDE}[scancel before srun started]",)),
        "admin_requeue": Cell(
            "requeue", "the trap records Slurm's requeue (`preempt`, by slurm); no `failure`", (MOMENTS,)
        ),
        "warning": Cell("requeue", "nothing launched; requeued (`timelimit`); next life from step 0", (MOMENTS,)),
        "node_down": Cell(
            "guardian",
            "the batch node: Slurm (1 node) or the guardian (2+) starts the run again (`node_failure`)",
            (f"{GUARD}[batch host lost before the first start]",),
        ),
        "rank_kill": NO_RANKS,
        "rank_stop": NO_RANKS,
        "slurmctld": Cell(
            "trains on", "setup's lines run; srun waits for Slurm; one life, no requeue", (OUTAGE_START,)
        ),
        "disk_full": NOTHING_WRITTEN,
    },
    "imports": {
        "preempt_0": Cell(
            "requeue", "held, left before the rendezvous (`stop`, deadline 0); Slurm's requeue", (EARLY,)
        ),
        "preempt_grace": Cell(
            "requeue", "held, left before the rendezvous; requeued (`preempt`); nothing lost", (EARLY,)
        ),
        "scancel": Cell("cancel", "held, left before the rendezvous; `cancelled`, CANCELLED", (START,)),
        "admin_requeue": Cell(
            "requeue", "held, left; the trap records Slurm's requeue (`preempt`, by slurm)", (START,)
        ),
        "warning": Cell(
            "requeue", "held, left before the rendezvous (exit 140); requeued (`timelimit`)", (EARLY, START)
        ),
        "node_down": Cell("requeue", "srun ends the step: `node_failure` (the node named), requeued", (START_NODE,)),
        "rank_kill": Cell(
            "requeue",
            "`crash` charged (srun's SIGTERM to the peer is no preemption), relaunched in the job; the armed point "
            "kills the relaunched step too: a second crash, requeued",
            (START_RANKS, f"{DECIDE}[a rank dying at start-up: srun's SIGTERM to the others is no preemption]"),
        ),
        "rank_stop": Cell(
            "requeue",
            "the peer's watchdog: `hang` after `trainer.hang_timeout_s`, relaunched in the job; the armed point "
            "stops the relaunched step too (it fires in every launch of a life): a second hang, requeued",
            (START_RANKS,),
        ),
        "slurmctld": Cell(
            "trains on", "GraceTime/KillWait unread: Slurm's defaults assumed, said in the log", (OUTAGE_START,)
        ),
        "disk_full": NOTHING_WRITTEN,
    },
    "rendezvous": {
        "preempt_0": Cell(
            "requeue", "held; saved at step 1 within KillWait; Slurm's requeue; nothing redone", (START_PREEMPT,)
        ),
        "preempt_grace": Cell(
            "requeue", "held; saved at step 1; requeued (`preempt`); nothing redone", (START_PREEMPT,)
        ),
        "scancel": Cell("cancel", "`cancelled`, CANCELLED, never requeued", (START,)),
        "admin_requeue": Cell(
            "requeue", "Slurm's requeue (`preempt`, by slurm); resumed from the newest checkpoint", (START,)
        ),
        "warning": Cell("requeue", "held; `timelimit` save at the first step boundary; nothing redone", (START,)),
        "node_down": Cell(
            "requeue", "`node_failure` (the node named), requeued; from the newest checkpoint", (START_NODE,)
        ),
        "rank_kill": Cell(
            "requeue",
            "`crash` charged, relaunched in the job; requeued at the second crash; from the newest checkpoint",
            (START_RANKS,),
        ),
        "rank_stop": Cell(
            "requeue",
            "the peer's watchdog: `hang` after `trainer.hang_timeout_s`, not a crash; relaunched, then requeued "
            "at the second hang",
            (START_RANKS, TRAINING),
        ),
        "slurmctld": Cell("trains on", "the group forms while Slurm is away; one life", (OUTAGE_START,)),
        "disk_full": NOTHING_WRITTEN,
    },
    "resume": {
        "preempt_0": Cell(
            "requeue", "saved at the next step boundary within KillWait; nothing redone", (START_PREEMPT,)
        ),
        "preempt_grace": Cell("requeue", f"{SAVED_REQUEUE}", (START_PREEMPT,)),
        "scancel": Cell("cancel", "`cancelled`, CANCELLED; no further requeue", (START,)),
        "admin_requeue": Cell("requeue", "Slurm's requeue (`preempt`, by slurm); from the newest checkpoint", (START,)),
        "warning": Cell("requeue", "`timelimit` save at the first step boundary; nothing redone", (START,)),
        "node_down": Cell("requeue", "`node_failure`, requeued; from the checkpoint it was loading", (START_NODE,)),
        "rank_kill": Cell(
            "requeue",
            "`crash` charged, relaunched; requeued at the second crash; nothing journaled by the lost load",
            (START_RANKS, POINTS_RUN),
        ),
        "rank_stop": Cell(
            "requeue", "the peer's watchdog: `hang`, relaunched; requeued at the second hang", (START_RANKS,)
        ),
        "slurmctld": Cell(
            "trains on", "nothing asks Slurm here: the second life trains on while Slurm is away", (OUTAGE_START,)
        ),
        "disk_full": NOTHING_WRITTEN,
    },
    "step": {
        "preempt_0": Cell("requeue", "saved within KillWait; Slurm's requeue; nothing redone", (ZERO_GRACE,)),
        "preempt_grace": Cell(
            "requeue",
            SAVED_REQUEUE,
            (f"{RECOVERY}::test_preemption_saves_at_the_signal_step_and_resumes_exactly",),
        ),
        "scancel": Cell(
            "cancel", "saved, stopped, `cancelled`", (f"{RECOVERY}::test_scancel_saves_and_stops_without_requeue",)
        ),
        "admin_requeue": Cell("requeue", "saved within KillWait; Slurm's requeue (`preempt`, by slurm)", (TRAINING,)),
        "warning": Cell(
            "requeue",
            "saved (`timelimit`), requeued; nothing redone",
            ("tests/test_slurm_time_limit.py::test_time_limit_requeues_until_done",),
        ),
        "node_down": Cell(
            "relaunch / requeue",
            "`node_failure`: relaunch on a spare, or requeue without the node; the batch node: its guardian, or its"
            " keeper when the job does not end",
            (
                f"{RECOVERY}::test_node_failure_requeues_without_the_node",
                f"{RECOVERY}::test_hot_spare_relaunches_without_requeue",
                GUARDIAN,
                KEEPER,
            ),
        ),
        "rank_kill": Cell(
            "relaunch",
            "`crash` charged, trained again in the same job from the newest checkpoint; a crash right after, requeued",
            (TRAINING, f"{DECIDE}[crash]", f"{DECIDE}[a crash right after a crash's relaunch: requeue]"),
        ),
        "rank_stop": Cell(
            "relaunch",
            "`hang` (the peer's watchdog), not a crash: trained again in the same job from the newest checkpoint",
            (TRAINING,),
        ),
        "slurmctld": Cell("trains on", "training never asks Slurm; one life", (OUTAGE_START,)),
        "disk_full": NOTHING_WRITTEN,
    },
    "periodic": {
        "preempt_0": Cell(
            "requeue",
            "the forced save decides with the write under way (`forced_save`) within KillWait, or SIGKILL first: "
            "from the newest complete checkpoint; Slurm's requeue",
            (START_PREEMPT_WRITES,),
        ),
        "preempt_grace": Cell(
            "requeue",
            "waits for, abandons or keeps the write under way, whichever loses least",
            (
                "tests/test_forced_save_slurm.py::"
                "test_a_preempted_multi_gb_save_meets_the_grace_time_and_resumes_from_a_complete_checkpoint",
                f"{DECIDE}[preemption during a background write]",
            ),
        ),
        "scancel": Cell("cancel", "the forced save waits for or abandons the write; `cancelled`, CANCELLED", (WRITES,)),
        "admin_requeue": Cell(
            "requeue", "Slurm's requeue (`preempt`, by slurm); from the newest complete checkpoint", (WRITES,)
        ),
        "warning": Cell(
            "requeue",
            "the stop step written (the write under way waited for or abandoned); nothing redone",
            (WRITES, f"{DECIDE}[time-limit stop that abandoned a background write and wrote the stop step]"),
        ),
        "node_down": Cell(
            "requeue",
            "srun ends the step, the write with it: `node_failure`, requeued; the half-written one never counts",
            (START_NODE,),
        ),
        "rank_kill": Cell(
            "relaunch",
            "`crash`, relaunched; the `.pt.tmp` never counts; resumed from the checkpoint before",
            (POINTS_RUN,),
        ),
        "rank_stop": Cell(
            "relaunch",
            "the peer's watchdog: `hang`, trained again in the job; the write under way never counts",
            (STOPPED_WRITING, HANG_RELAUNCHED),
        ),
        "slurmctld": Cell("trains on", "writes never ask Slurm; one life", (OUTAGE_START,)),
        "disk_full": Cell(
            "stop",
            "ENOSPC: partial file removed, newest checkpoint kept, `failure` (`user_error`); `--retry` resumes",
            (FULL_DISK,),
        ),
    },
    "forced": {
        "preempt_0": Cell(
            "requeue",
            "`overran` (cancelled before KillWait ends) or SIGKILL; the stop journaled before: no crash; "
            "the newest complete one stands",
            (START_PREEMPT_WRITES,),
        ),
        "preempt_grace": Cell(
            "requeue",
            "a second SIGTERM changes nothing; the save meets its deadline or is `overran`",
            ("tests/test_forced_save.py::test_a_forced_write_still_under_way_at_the_deadline_is_cancelled",),
        ),
        "scancel": Cell(
            "cancel",
            "the save completes or is killed: `cancelled`; the newest complete checkpoint stands",
            (WRITES, f"{DECIDE}[scancel during a forced save (killed before it was written)]"),
        ),
        "admin_requeue": Cell(
            "requeue", "Slurm's requeue; the save completes within KillWait; from the newest complete one", (WRITES,)
        ),
        "warning": Cell(
            "requeue",
            "the save goes on; requeued (`timelimit`) from the stop step, or, `overran`, the newest complete one",
            (WRITES,),
        ),
        "node_down": Cell(
            "requeue",
            "the save lost; the `stop` already journaled: requeued as the stop it was",
            (f"{DECIDE}[preemption whose save was killed]",),
        ),
        "rank_kill": Cell(
            "requeue",
            "the `stop` journaled first: requeued as the stop (not a crash); from the newest complete one",
            (
                POINTS_RUN,
                "tests/test_forced_save.py::test_the_stop_is_journaled_before_its_save_and_outlives_a_killed_save",
            ),
        ),
        "rank_stop": Cell(
            "relaunch", "the peer's watchdog: `hang`; the stop already journaled", (STOPPED_WRITING, HANG_RELAUNCHED)
        ),
        "slurmctld": Cell(
            "requeue",
            "the save written while Slurm is away (it never asks); the requeue waits for Slurm",
            (OUTAGE_START,),
        ),
        "disk_full": Cell(
            "stop",
            "ENOSPC: the stop's save fails, its partial file removed; `failure` (`user_error`); "
            "the newest complete checkpoint stands",
            (FULL_WHILE_WRITING, USER_ERROR_STOPS),
        ),
    },
    "renames": {
        "preempt_0": Cell(
            "requeue",
            "the stop step saved within KillWait, or SIGKILL first: the `.pt` is whole, a later start may "
            "resume from it; Slurm's requeue",
            (START_PREEMPT_WRITES,),
        ),
        "preempt_grace": Cell(
            "requeue",
            "the forced save waits for the rename pair or abandons it; the stop step saved; requeued (`preempt`)",
            (START_PREEMPT_WRITES,),
        ),
        "scancel": Cell("cancel", "the held write completes or is abandoned; `cancelled`, CANCELLED", (WRITES,)),
        "admin_requeue": Cell(
            "requeue", "Slurm's requeue (`preempt`, by slurm); from the newest complete checkpoint", (WRITES,)
        ),
        "warning": Cell("requeue", "the stop step written after the held write; nothing redone", (WRITES,)),
        "node_down": Cell(
            "requeue",
            "`node_failure`, requeued; the `.pt` without its `.json` is resumed from when nothing newer is",
            (START_NODE,),
        ),
        "rank_kill": Cell(
            "relaunch",
            "`crash`, relaunched; a `.pt` without its `.json`: resumed from when nothing newer is usable",
            ("tests/test_checkpoint.py::test_a_write_killed_between_its_two_renames_is_resumed_from",),
        ),
        "rank_stop": Cell(
            "relaunch",
            "the peer's watchdog: `hang`; the `.pt` without `.json` as above",
            (STOPPED_WRITING, HANG_RELAUNCHED),
        ),
        "slurmctld": Cell("trains on", "renames never ask Slurm; one life", (OUTAGE_START,)),
        "disk_full": Cell(
            "stop",
            "the `.json` cannot be written: the `.pt` removed too; `failure` (`user_error`); "
            "the newest complete checkpoint stands",
            (FULL_WHILE_WRITING, USER_ERROR_STOPS),
        ),
    },
    "after_step": {
        "preempt_0": Cell(
            "requeue",
            "Slurm requeues at once: its SIGTERM to the shell is no cancel; the requeue recorded once",
            (f"{DECIDE}[SIGTERM to the shell while Slurm requeues the job]",),
        ),
        "preempt_grace": Cell("requeue", "decided as a preemption (`preempt`)", (f"{DECIDE}[preemption]",)),
        "scancel": Cell(
            "cancel",
            "`JobState=COMPLETING` without a restart more: no requeue, CANCELLED",
            (f"{DECIDE}[SIGTERM to the shell while Slurm requeues the job]",),
        ),
        "admin_requeue": Cell(
            "requeue",
            "Restarts past this life's: no cancel; Slurm's requeue",
            (f"{DECIDE}[SIGTERM to the shell while Slurm requeues the job]",),
        ),
        "warning": Cell(
            "guardian",
            "the limit itself reached meanwhile: TIMEOUT, no cancel; the guardian resubmits (`timelimit`)",
            (MOMENTS, f"{DECIDE}[the time limit's SIGTERM to the shell of a warned step]"),
        ),
        "node_down": Cell(
            "requeue",
            "the failed node kept out (or the count lowered)",
            (f"{DECIDE}[node failing after the time-limit warning: requeue]",),
        ),
        "rank_kill": na("the step has ended: no rank runs"),
        "rank_stop": na("the step has ended: no rank runs"),
        "slurmctld": Cell(
            "requeue", "facts fall back within 20 s; the requeue waits for Slurm; one job", (OUTAGE_START,)
        ),
        "disk_full": Cell(
            "stop",
            "the decision cannot be journaled, so not acted on: said in one line, the job ends FAILED, "
            "no requeue; the guardian finds no room; the retry resumes",
            (
                "tests/test_slurm_full_disk.py::"
                "test_a_disk_full_while_after_step_judges_ends_the_job_and_the_retry_resumes",
            ),
        ),
    },
    "requeue": {
        "preempt_0": Cell(
            "requeue",
            "Slurm requeues first; the control step reads Restarts and asks nothing: one requeue, charged once",
            (START_PREEMPT_BATCH,),
        ),
        "preempt_grace": Cell(
            "requeue",
            "the decided requeue asked before the grace ends: one requeue, charged once",
            (START_PREEMPT_BATCH,),
        ),
        "scancel": Cell("cancel", "no requeue asked: CANCELLED, `Restarts=0`", (MOMENTS,)),
        "admin_requeue": Cell(
            "requeue",
            "Restarts show it done: asked no more",
            ("tests/test_control_step.py::test_a_requeue_without_answer_is_looked_at_before_anything_else",),
        ),
        "warning": Cell("requeue", "the requeue already decided; asked once; the warning changes nothing", (MOMENTS,)),
        "node_down": Cell(
            "guardian",
            "the batch shell lost while asking: the guardian resubmits as the decided requeue, charged once",
            (MOMENTS,),
        ),
        "rank_kill": na("the step has ended: no rank runs"),
        "rank_stop": na("the step has ended: no rank runs"),
        "slurmctld": Cell(
            "requeue", "no answer: `scontrol show job` then asked again for up to 60 s; one requeue", (OUTAGE_REQUEUE,)
        ),
        "disk_full": NOTHING_WRITTEN,
    },
    "hold": {
        "preempt_0": na("a pending job is not preempted"),
        "preempt_grace": na("a pending job is not preempted"),
        "scancel": Cell(
            "cancel",
            "CANCELLED; its guardian sees the cancel and does nothing",
            (f"{GUARD}[scancel, nothing recorded]", f"{GUARD}[hpctrain-cancel while it was pending]"),
        ),
        "admin_requeue": na("Slurm refuses to requeue a pending job"),
        "warning": na("no signal reaches a pending job"),
        "node_down": Cell(
            "requeue",
            "the count lowered to the nodes in service: it starts without the node",
            ("tests/test_slurm_recovery_more.py::test_recovery_after_the_time_limit_warning_side_by_side",),
        ),
        "rank_kill": na("no rank runs"),
        "rank_stop": na("no rank runs"),
        "slurmctld": Cell("trains on", "the job starts once Slurm is back; one requeue, no failure", (OUTAGE_START,)),
        "disk_full": NOTHING_WRITTEN,
    },
}

MARKS = {"asserted": "✓", "open": "○", "n/a": "·"}


def counts() -> dict[str, int]:
    states = [cell.state for row in CELLS.values() for cell in row.values()]
    return {state: states.count(state) for state in MARKS}


def _grid_cell(cell: Cell) -> str:
    return MARKS["n/a"] if cell.state == "n/a" else f"{cell.short} {MARKS[cell.state]}"


def render() -> str:
    """The docs' table (docs/fault-matrix.md): phases down, faults across, each cell its action and mark."""
    lines = [
        "| phase | " + " | ".join(FAULTS.values()) + " |",
        "|---" * (len(FAULTS) + 1) + "|",
    ]
    for phase, (title, point) in PHASES.items():
        where = f"{title} (`{point}`)" if point else title
        cells = [_grid_cell(CELLS[phase][fault]) for fault in FAULTS]
        lines.append(f"| {where} | " + " | ".join(cells) + " |")
    tally = counts()
    lines.append("")
    lines.append(
        f"{tally['asserted']} cells asserted (✓), {tally['open']} open (○: the outcome meant, not yet asserted "
        f"at that moment), {tally['n/a']} that cannot happen (·)."
    )
    return "\n".join(lines)


def render_cells() -> str:
    """Every cell's outcome and the tests that assert it, a row each."""
    lines = ["| phase | fault | outcome | asserted by |", "|---|---|---|---|"]
    for phase, (title, _) in PHASES.items():
        for fault, name in FAULTS.items():
            cell = CELLS[phase][fault]
            tests = "<br>".join(f"`{proof.removeprefix('tests/')}`" for proof in cell.proof) or cell.state
            lines.append(f"| {title} | {name} | {cell.outcome} | {tests} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(render_cells() if sys.argv[1:] == ["--cells"] else render())
