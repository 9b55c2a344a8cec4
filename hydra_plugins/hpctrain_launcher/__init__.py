"""hpctrain's Hydra launcher; Hydra only loads launchers from the hydra_plugins package."""
