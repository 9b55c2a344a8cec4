"""Talking to Slurm and nothing else: one client with typed verbs (`client`), its records, job ids,
states, host lists and the environment Slurm gives a task. May import: the standard library only."""
