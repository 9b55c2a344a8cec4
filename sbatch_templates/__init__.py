# Makes sbatch_templates/ importable as hpctrain.sbatch_templates (see setup.cfg).
