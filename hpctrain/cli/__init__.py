"""Console entry points: hpctrain-train (and, with the Slurm path, hpctrain-submit)."""
