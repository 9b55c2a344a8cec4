"""The console scripts (setup.cfg): hpctrain-train, -submit, -status, -follow, -cancel, -tune and
-export, each a thin entry. May import any folder: nothing imports cli."""
