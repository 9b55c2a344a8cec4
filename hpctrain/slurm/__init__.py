"""Slurm: the job's environment, the rendered sbatch script, and submission."""
