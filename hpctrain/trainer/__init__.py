"""The training loop and its parts: building, data loading, steps, evaluation, resume, stops.
May import: run, config, dist, data, models, metrics, checkpoint, tune (a trial's pruning);
never process (which runs it).
"""
