"""The run protocol: what every hpctrain process (trainer, worker, batch script's control step,
hpctrain-status, hpctrain-follow) agrees on about a run dir.

    paths       RunDir: every path of a run dir, checkpoint file names
    jsonlines   the JSON-lines plumbing (whole lines, torn lines skipped, no NaN)
    events      typed events (`start`, `checkpoint`, `stop`, `forced_save`, `requeue`, `relaunch`,
                `failure`, `cancelled`, `retry`, `finish`, ...): one writer (Journal), one reader
                (read_events), one list of the events that end a life (ENDINGS)
    causes      the words: CheckpointReason, StopReason, Cause, Action
    exitcodes   every exit code, named by the process that exits with it
    facts       what recovery knows (ClusterView, Outcome, Budgets) and Slurm's text parsed
    decide      recovery as a pure function of those facts
No torch here: the batch shell's control step imports it and must answer in a moment.
"""
