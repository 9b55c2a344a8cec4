"""The in-job programs that keep a run going: the batch shell's control step, its one decider
(`decide`, from the typed `facts`), the heartbeat watcher, the keeper, the guardian job.
May import: run, slurm, submit, config. Never torch (each answers in a moment), never tune."""
