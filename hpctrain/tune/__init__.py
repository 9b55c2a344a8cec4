"""hpctrain-tune's Optuna search: the study in a sweep dir, its trials' run dirs, and what a trial's
job runs when its run ends (`report`, named in the trial's listeners.json: hpctrain.run.listeners).
May import: run, slurm, config, submit, status; never recovery, which only tells the listeners.
"""
