"""Which commit a folder's code is at, and what differs from it: for the code snapshot's record.

Every git call is checked: a folder that is no git checkout (or a machine without git) gives
None; a checkout git cannot describe (no commit yet, a broken repository) gives its error, so
the record says why it has no commit instead of silently leaving it out.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 60
# Untracked files listed by name at most (a diff holds tracked files only).
MAX_UNTRACKED = 50


class GitError(RuntimeError):
    pass


def _git(folder: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GitError(f"git {' '.join(args)}: {error}") from None
    if done.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


def describe(folder: Path, leave_out: Path | None = None) -> dict[str, Any] | None:
    """{root, commit, branch, dirty, diff, untracked} of the checkout holding `folder`; None when
    it is none; {root, error} when git cannot say. Untracked files under `leave_out` (the run
    or sweep dir being written) are not listed."""
    if shutil.which("git") is None or not folder.is_dir():
        return None
    try:
        root = _git(folder, "rev-parse", "--show-toplevel").strip()
    except GitError:
        return None  # not a checkout: nothing to record
    try:
        commit = _git(folder, "rev-parse", "--verify", "HEAD").strip()
        branch = _git(folder, "rev-parse", "--abbrev-ref", "HEAD").strip()
        # --binary: a changed binary file is recorded too, so `git apply` restores the tree.
        diff = _git(folder, "diff", "HEAD", "--binary")
        listed = _git(folder, "ls-files", "--others", "--exclude-standard", "--full-name", "-z", ":/")
    except GitError as error:
        return {"root": root, "error": str(error)}
    skip = leave_out.resolve() if leave_out else None
    untracked = [
        name for name in listed.split("\0") if name and not (skip and skip in (Path(root) / name).resolve().parents)
    ]
    return {
        "root": root,
        "commit": commit,
        "branch": branch,
        "dirty": bool(diff),
        "diff": diff,
        "untracked": untracked[:MAX_UNTRACKED],
        "untracked_count": len(untracked),
    }
