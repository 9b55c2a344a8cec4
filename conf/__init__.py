# Makes conf/ importable as hpctrain.conf (see setup.cfg), so Hydra finds it with pkg://.
