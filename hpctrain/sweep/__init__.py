"""Operations on a sweep as a whole: cancel its points, retry those that ended unfinished.

    points   which run dirs a command names (a sweep dir, its points, or one run dir) and what
             hpctrain-status knows of each (job, Slurm's state, the journal's ending)
    pick     which points to cancel or retry: pure functions of those facts
    cancel   one scancel for the chosen points, each recorded as `cancelled`
    retry    their own job.sbatch submitted again through submit_all, recorded as `retry`
No torch here: both commands answer in a moment on a login node.
May import: run, slurm, config, submit, status.
"""
