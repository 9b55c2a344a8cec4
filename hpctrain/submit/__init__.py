"""From a config to `sbatch`: render job.sbatch, freeze the code, read the site's limits, queue
points and arrays, and the guardian job chained to each. May import: run, slurm, config."""
