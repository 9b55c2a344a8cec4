"""The door every training process comes through: `python -m hpctrain.worker RUN_DIR`.

srun, torchrun and a user's own sbatch script start this command on every task (docs/slurm.md);
the door itself is hpctrain.process.door, and it holds the stop signals before anything heavy is
imported.
"""

from hpctrain.process.door import main

if __name__ == "__main__":
    main()
