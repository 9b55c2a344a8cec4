"""The training loop and its parts: data loading, steps, evaluation, schedules."""
