"""The in-job programs that keep a run going: the batch shell's control step (`control`: `gather`
the typed `facts`, ask the one decider `decide` once, `apply` its decision), the heartbeat watcher,
the keeper, the guardian job, the in-memory tier's holders (`memory_holder`). May import: run,
slurm, submit, config. Never torch, never tune."""
