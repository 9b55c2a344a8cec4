"""hpctrain: train PyTorch models with DistributedDataParallel, locally or on Slurm."""

__version__ = "0.1.0"
