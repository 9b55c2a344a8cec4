"""The run protocol: what every hpctrain process (trainer, worker, batch script's control step,
hpctrain-status, hpctrain-follow) agrees on about a run dir.

    paths       RunDir: every path of a run dir, checkpoint file names
    jsonlines   the JSON-lines plumbing (whole lines, torn lines skipped, no NaN)
    events      typed events (`start`, `checkpoint`, `stop`, `forced_save`, `requeue`, `relaunch`,
                `failure`, `cancelled`, `retry`, `finish`, ...): one writer (Journal), one reader
                (read_events), one list of the events that end a life (ENDINGS)
    causes      the words: CheckpointReason, StopReason, Cause, Action; STOP_TABLE, a stop's every
                translation (signal, urgency, deadline, exit code, cause)
    exitcodes   every exit code, named by the process that exits with it
    protocol    the batch shell and its control step: their calls, answer line and exit codes
    heartbeats  the datagrams on the heartbeat watcher's port (beats, the keeper's ping)
    node_address  the address a node of the job is reached at (rank 0's, the watcher's)
    memory_wire the wire between a rank and a memory holder of the in-memory tier
    listeners   the programs a run dir names to be told when the run has ended (hpctrain-tune's)
No torch here: the batch shell's control step imports it and must answer in a moment.
May import: slurm (job ids, the task's environment); every other folder may import run.
"""
