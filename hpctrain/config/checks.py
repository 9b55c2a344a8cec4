"""Checks shared by the config schema: a value names its key when refused, a string that reaches
the job script is one line, and the words of a command line cannot break the launch."""

from __future__ import annotations

from typing import Optional


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


def single_line(key: str, value: Optional[str]) -> None:
    # A newline would end an #SBATCH line and start a shell command: never let one through.
    if value is not None:
        require("\n" not in value and "\r" not in value, key, "must be a single line (it contains a newline)")
        require("\0" not in value, key, "must not contain a NUL character")


# srun flags that set what hpctrain itself decides for the training step: its shape (slurm.nodes,
# slurm.ntasks_per_node), the nodes it leaves out after a failure, and ending every task with one.
_SRUN_OWNED_LONG = ("--nodes", "--ntasks", "--ntasks-per-node", "--exclude", "--kill-on-bad-exit")
_SRUN_OWNED_SHORT = ("-N", "-n", "-x", "-K")


def check_words(key: str, words: list[str]) -> None:
    """Each word is one shell argument: a single line, and not empty (an empty word would be
    taken as a program or an option's value by the command reading it)."""
    for index, word in enumerate(words):
        single_line(f"{key}[{index}]", word)
        require(word != "", f"{key}[{index}]", "must not be empty")


def check_srun_args(words: list[str]) -> None:
    check_words("slurm.srun_args", words)
    if words:  # a first word that is no flag would be, to srun, the program to run
        require(
            words[0].startswith("-"),
            "slurm.srun_args[0]",
            f"must be an srun flag like --container-image=IMAGE (got {words[0]!r})",
        )
    for index, word in enumerate(words):
        name = word.split("=", 1)[0]
        owned = _srun_owned_long(name) or (not word.startswith("--") and word[:2] in _SRUN_OWNED_SHORT)
        require(
            not owned,
            f"slurm.srun_args[{index}]",
            f"{name} is set by hpctrain (slurm.nodes, slurm.ntasks_per_node, failed nodes); leave it out",
        )


def _srun_owned_long(name: str) -> bool:
    # srun (getopt_long) also takes a long option by any unambiguous start of its name:
    # `--kill-on` is --kill-on-bad-exit, `--exclu` --exclude.
    return name.startswith("--") and len(name) > 3 and any(owned.startswith(name) for owned in _SRUN_OWNED_LONG)


def check_task_prefix(words: list[str]) -> None:
    check_words("slurm.task_prefix", words)
    if words:  # srun reads words before the program as its own flags
        require(
            not words[0].startswith("-"),
            "slurm.task_prefix[0]",
            f"must be a program like apptainer (got {words[0]!r}); srun's own flags go in slurm.srun_args",
        )
