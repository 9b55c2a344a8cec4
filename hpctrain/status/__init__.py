"""hpctrain-status: where every run stands, in one table.

The flow, one direction:

    paths (run dirs, sweep dirs, folders of runs)  -> discover.run_dirs
    every run dir's journal, metrics tail, newest checkpoint
                                                   -> journal_summary, metrics_tail, checkpoint_age
    the job ids of all of them, asked of Slurm in a few calls
                                                   -> slurm_query.query
    one Row per run (the state decided once)       -> rows.collect, run_state.decide
    a table, JSON, or a plot                       -> table, plot

Nothing here imports torch or Hydra: a status must answer in a moment on a login node.
May import: run, slurm, config, recovery (its facts), submit.
"""
