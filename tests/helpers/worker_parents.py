"""The digits dataset, noting from every DataLoader worker which process started it.

A worker forked by its rank has that rank as its OS parent; one started through a forkserver
has the server as OS parent while multiprocessing still names the rank (the process that asked
for it). Each worker writes `<pid>.json` with both into `out_dir` on its first item.
"""

import json
import multiprocessing
import os
from pathlib import Path

from torch.utils.data import Dataset, get_worker_info

from hpctrain.data.digits import digits
from hpctrain.data.splits import Splits


class NotingParents(Dataset):
    def __init__(self, inner: Dataset, out_dir: str) -> None:
        self.inner, self.out_dir = inner, Path(out_dir)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        note = self.out_dir / f"{os.getpid()}.json"
        if get_worker_info() is not None and not note.exists():
            parent = multiprocessing.parent_process()
            asked_by = parent.pid if parent is not None else None
            note.write_text(json.dumps({"os_parent": os.getppid(), "asked_by": asked_by}))
        return self.inner[index]


def digits_noting_worker_parents(out_dir: str) -> Splits:
    splits = digits()
    return Splits(train=NotingParents(splits.train, out_dir), eval=splits.eval)
