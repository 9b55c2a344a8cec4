"""One training process's life, from the door (`door`: `python -m hpctrain.worker RUN_DIR`) to the
exit (`ending`): its signals, start-up clock, watchdog, heartbeats, the warm standby and its handoff.
May import: run, dist, config, trainer, checkpoint, data, models, metrics, slurm. Never submit,
recovery, status, sweep, tune or cli (those are other programs)."""
