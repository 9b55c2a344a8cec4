"""Rendering configs into sbatch scripts: golden files, sbatch's quoting, hostile values."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from hpctrain import config as hconfig
from hpctrain.config import Config
from hpctrain.config.schema import SlurmConfig
from hpctrain.run import exitcodes, protocol
from hpctrain.run.causes import Action
from hpctrain.run.paths import RunDir
from hpctrain.run.protocol import Step
from hpctrain.submit.render import builtin_templates, filename_pattern, render, sbatch_flag, sbatch_quote

GOLDEN = Path(__file__).parent / "golden"
HOSTILE = [
    "a'; touch pwned; echo '",
    "$(touch pwned)",
    "`touch pwned`",
    'x"; touch pwned; "',
    "a b",
    "semi;colon",
    "#hash",
]


def make_config(*overrides: str) -> Config:
    hconfig.register()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        cfg = compose("submit", overrides=list(overrides))
    config, _ = hconfig.to_typed(cfg, overrides)
    return config


def rendered(*overrides: str, run_dir: str = "/scratch/me/runs/exp1") -> str:
    config = make_config("slurm.python=/opt/venv/bin/python", *overrides)
    return render(config, Path(run_dir), Path("/home/me/project")).script


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("HPCTRAIN_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with HPCTRAIN_REGEN_GOLDEN=1 if intended"


def test_golden_default() -> None:
    check_golden("ddp_default.sbatch", rendered())


def test_the_batch_scripts_exit_codes_come_from_the_table() -> None:
    """ddp.sbatch.j2 types no exit code: each is rendered from hpctrain.run.exitcodes, which the
    control step's own codes come from too, so the two cannot drift apart."""
    template = (builtin_templates() / "ddp.sbatch.j2").read_text()
    assert not re.findall(r"\bexit [0-9]", template)
    # `control begin` fails the job, finish, `control requeue`'s own code, stop or fail.
    script = rendered()
    assert re.findall(r"\bexit (\S+)", script) == ['"${begun}"', str(exitcodes.BATCH_FINISHED), '"${rc}"', "1"]
    # ... unless it found a preemption's grace running: then nothing is launched.
    assert f'if [ "${{begun}}" = {exitcodes.CONTROL_PREEMPTING} ]; then' in script
    assert exitcodes.BATCH_FAILED == 1
    # Through a container prefix without control_python, the shell's own requeue: requeued, or
    # `control requeue-refused`'s code.
    prefixed = rendered("slurm.task_prefix=[apptainer,exec,/images/train.sif]")
    assert f"= {exitcodes.CONTROL_NO_SLURM} ]" in prefixed
    assert re.findall(r"\bexit (\S+)", prefixed)[2:4] == [str(exitcodes.BATCH_REQUEUED), '"${rc}"']


@pytest.mark.parametrize(
    "overrides, elastic", [(("slurm.nodes=2",), False), (("slurm.nodes=2-3", "trainer.elastic=true"), True)]
)
def test_the_batch_scripts_protocol_words_come_from_the_protocol(overrides: tuple[str, ...], elastic: bool) -> None:
    """ddp.sbatch.j2 spells neither the control steps' calls nor the answer's action words: both
    are rendered from hpctrain.run.protocol (the actions are hpctrain.run.causes.Action), which
    the control step parses and answers with."""
    template = (builtin_templates() / "ddp.sbatch.j2").read_text()
    for word in ("finish)", "relaunch*)", "requeue*)", "control begin", "control after-step", "recovery.control"):
        assert word not in template, word
    # Through a container prefix: every call is made (`requeue-refused` after the shell's own ask).
    script = rendered("slurm.task_prefix=[apptainer,exec,/images/train.sif]", *overrides)
    assert f"    {Action.FINISH}) exit {exitcodes.BATCH_FINISHED} ;;" in script
    assert f"    {Action.RELAUNCH}*) " in script and f"    {Action.REQUEUE}*)\n" in script
    for step in Step:
        assert f"control {step} " in script, step
    assert f'-m {protocol.CONTROL_MODULE} "$@"' in script and f"-m {protocol.KEEPER_MODULE} " in script
    # The answer line as the control step prints it, read back as the shell reads it.
    line = protocol.Answer(Action.RELAUNCH, ("node2", "node4"), 2 if elastic else None).line()
    reads = 'read -r _ excluded step_nodes <<< "${action}"' if elastic else 'read -r _ excluded <<< "${action}"'
    assert reads in script
    assert line == ("relaunch node2,node4 2" if elastic else "relaunch node2,node4")
    # A hang's relaunch keeps no node out: `-` holds the place of the nodes, read back as none.
    bare = protocol.Answer(Action.RELAUNCH, (), 2 if elastic else None).line()
    assert bare == ("relaunch - 2" if elastic else "relaunch -")
    assert f'[ "${{excluded}}" != {protocol.NO_NODES} ] || excluded=""' in script


@pytest.mark.parametrize(
    "overrides, shell_asks",
    [
        ((), False),
        (("slurm.task_prefix=[apptainer,exec,/images/train.sif]",), True),
        (("slurm.task_prefix=[apptainer,exec,/images/train.sif]", "slurm.control_python=/opt/venv/bin/python"), False),
    ],
)
def test_slurm_is_asked_by_the_control_step_only_unless_it_runs_in_an_image(
    overrides: tuple[str, ...], shell_asks: bool
) -> None:
    """Every Slurm call of a job goes through hpctrain.slurm.client in the control step (time
    limits, no-answer handling). The batch shell asks Slurm itself only when the control step
    runs through a container prefix (which may lack Slurm's commands), and then under `timeout`."""
    script = rendered(*overrides)
    commands = ("sbatch", "scontrol", "squeue", "sacct", "sinfo", "scancel", "sacctmgr")
    code = "\n".join(line.split("#")[0] for line in script.splitlines() if not line.startswith("#"))
    called = re.findall(rf"(\S*)\s+\b({'|'.join(commands)})\b", code)
    if not shell_asks:
        assert called == []
    else:
        assert called and all(before == "30" or before == "15" for before, _ in called), called


def test_golden_full_site_profile() -> None:
    text = rendered(
        "slurm.nodes=4",
        "slurm.gpus_per_node=8",
        "slurm.gpu_bind=per_task",
        "slurm.cpus_per_task=12",
        "slurm.mem=480G",
        "slurm.time=2-00:00:00",
        "slurm.partition=gpu",
        "slurm.account=proj-123",
        "slurm.qos=high",
        "slurm.constraint='a100&ib'",
        "slurm.exclude='gpu-[003,007]'",
        "slurm.job_name='llm pretrain'",
        "slurm.extra=['--mail-type=END','--comment=big run']",
        "slurm.setup=['module load cuda/12.4','source /opt/venv/bin/activate']",
    )
    check_golden("ddp_full.sbatch", text)
    assert "#SBATCH --ntasks-per-node=8" in text  # one task per GPU by default
    assert "--gpus-per-task=1" in text


@pytest.mark.parametrize("value", [*HOSTILE, "plain", "with\\backslash", 'q"uote', "%j"])
def test_sbatch_quote_round_trips_through_sbatch_tokenizer(value: str) -> None:
    # sbatch reads #SBATCH lines with quotes and backslash escapes much like POSIX shell words
    # without expansion; shlex in POSIX mode without escapes inside '' is close: check the
    # double-quoted form decodes back exactly.
    quoted = sbatch_quote(value)
    assert "\n" not in quoted
    decoded = shlex.split(quoted, posix=True)
    assert decoded == [value]


def test_sbatch_quote_refuses_newlines() -> None:
    with pytest.raises(ValueError, match="newline"):
        sbatch_quote("a\nb")


def test_sbatch_flag_quotes_value_and_checks_name() -> None:
    assert sbatch_flag("--mail-type=END") == "--mail-type=END"
    assert sbatch_flag("--comment=a b") == '--comment="a b"'
    assert sbatch_flag("--exclusive") == "--exclusive"
    with pytest.raises(ValueError, match="slurm.extra"):
        sbatch_flag("--x;rm -rf /=1")


def test_percent_in_paths_is_literal_for_slurm() -> None:
    assert filename_pattern(Path("/r/50%/x")) == "/r/50%%/x"


STRING_FIELDS = ["job_name", "partition", "account", "qos", "constraint", "exclude", "mem"]


@pytest.mark.parametrize("field", [*STRING_FIELDS, "template", "python"])
def test_newline_in_a_directive_is_refused_naming_the_key(field: str) -> None:
    with pytest.raises(ValueError, match=f"slurm.{field}"):
        SlurmConfig(**{field: "a\nb"})


def test_newline_in_setup_or_extra_is_refused() -> None:
    with pytest.raises(ValueError, match=r"slurm.setup\[1\]"):
        SlurmConfig(setup=["ok", "echo a\nrm -rf ~"])
    with pytest.raises(ValueError, match=r"slurm.extra\[0\]"):
        SlurmConfig(extra=["--comment=a\n#SBATCH --uid=0"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("slurm.nodes=-1", "slurm.nodes"),
        ("slurm.time=forever", "slurm.time"),
        ("slurm.gpus_per_node=-2", "slurm.gpus_per_node"),
        ("slurm.signal=KILL", "slurm.signal"),
        ("slurm.gpu_bind=some", "slurm.gpu_bind"),
        ("slurm.extra=[mail]", "slurm.extra[0]"),
    ],
)
def test_bad_slurm_values_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        make_config(override)


@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_a_stop_signal_is_refused_as_the_time_limit_warning(name: str) -> None:
    """The batch shell traps TERM as a stop (scancel, preemption) and the worker saves on INT
    without a deadline: either as slurm.signal would turn every warning into a cancel."""
    with pytest.raises(ValueError) as error:
        make_config(f"slurm.signal={name}")
    assert "slurm.signal" in str(error.value) and "could not be told from a stop" in str(error.value)


@pytest.mark.parametrize("name", ["USR1", "USR2", "HUP", "URG"])
def test_a_signal_the_traps_tell_apart_is_taken(name: str) -> None:
    assert f"--signal=B:{name}@" in render(make_config(f"slurm.signal={name}"), Path("/r"), Path("/s")).script


def test_hostile_values_never_run_in_bash(tmp_path: Path) -> None:
    """Every string field and the run dir hostile; run the script's shell part (a stand-in
    srun on PATH, no Slurm needed) and prove no injected command ran."""
    run_dir = tmp_path / "run $(touch pwned) `touch pwned`; x"
    run_dir.mkdir()
    config = make_config()
    # slurm.mem and slurm.partition are checked against Slurm's syntax first: no hostile value
    # gets that far (tests/test_hostile_strings.py shows the partition's refusal).
    checked_first = ("mem", "partition")
    hostile = {field: HOSTILE[i % len(HOSTILE)] for i, field in enumerate(STRING_FIELDS) if field not in checked_first}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in python: the controller says the step finished; the worker does nothing.
    (bin_dir / "python").write_text('#!/bin/bash\n[ "$3" = after-step ] && echo finish\nexit 0\n')
    (bin_dir / "python").chmod(0o755)
    slurm = replace(config.slurm, **hostile, extra=[f"--comment={h}" for h in HOSTILE], python=str(bin_dir / "python"))
    script = render(replace(config, slurm=slurm), run_dir, tmp_path).script
    (tmp_path / "job.sbatch").write_text(script)
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$HPCTRAIN_RUN_DIR/srun-args"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("pwned")), "a hostile value ran as a command"
    # The run dir reached srun as one intact argument.
    assert (run_dir / "srun-args").read_text().splitlines()[-1] == str(run_dir)


@pytest.mark.parametrize(
    ("overrides", "standby"),
    [
        (("slurm.nodes=2", "slurm.spare_nodes=1"), True),
        (("slurm.nodes=2", "slurm.spare_nodes=0"), False),  # no relaunch: nothing to hand over
        (("slurm.nodes=2", "slurm.spare_nodes=1", "slurm.warm_standby=false"), False),
        (("slurm.nodes=2", "slurm.spare_nodes=1", "slurm.gpus_per_node=2", "slurm.ntasks_per_node=2"), False),
    ],
)
def test_a_warm_standby_only_where_a_relaunch_can_use_it(overrides: tuple[str, ...], standby: bool) -> None:
    script = rendered(*overrides)
    assert ("-m hpctrain.process.standby" in script) is standby
    assert ("${relaunched:+hpctrain.process.handoff }hpctrain.worker" in script) is standby
    assert "export HPCTRAIN_STANDBY=" in script if standby else "HPCTRAIN_STANDBY" not in script
    if standby:  # the standby step survives a node lost (--no-kill): the others serve the relaunch
        (line,) = [line for line in script.splitlines() if "HPCTRAIN_STANDBY_ROLE=server srun" in line]
        following = script[script.index(line) :].split("hpctrain.process.standby")[0]
        assert "--overlap" in following and "--no-kill" in following and "--exact" not in following
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize(
    ("overrides", "holders"),
    [
        (("slurm.nodes=2", "slurm.spare_nodes=1"), True),  # on by default (trainer.memory_ckpt_every=1)
        (("slurm.nodes=2", "slurm.spare_nodes=0"), False),  # a requeue's new allocation has no copies
        (("slurm.nodes=2", "slurm.spare_nodes=1", "trainer.memory_ckpt_every=0"), False),
        (("slurm.nodes=2", "slurm.spare_nodes=1", "trainer.strategy=fsdp"), True),  # each rank's shards
    ],
)
def test_memory_holders_only_where_a_relaunch_can_use_them(overrides: tuple[str, ...], holders: bool) -> None:
    script = rendered(*overrides)
    assert ("-m hpctrain.recovery.memory_holder" in script) is holders
    assert ("export HPCTRAIN_MEMORY_TOKEN=" in script) is holders
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_the_sigterm_trap_marks_the_signal_before_its_control_step_runs(tmp_path: Path) -> None:
    """Slurm SIGTERMs every process of the batch step, then SIGKILLs them KillWait seconds later.
    Under load the trap's control step (a Python start) may not finish in time; the mark, a
    builtin, is there at once, for the next life to read (RunDir.sigterm_mark)."""
    run_dir = tmp_path / "run dir 'quoted'"
    run_dir.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in python whose every control step hangs: `begin` holds the shell (as a gate
    # would), `cancelled` never returns (a control step too slow for KillWait).
    (bin_dir / "python").write_text('#!/bin/bash\n[ "$3" = begin ] || [ "$3" = cancelled ] && exec sleep 60\nexit 0\n')
    (bin_dir / "python").chmod(0o755)
    config = make_config()
    script = render(replace(config, slurm=replace(config.slurm, python=str(bin_dir / "python"))), run_dir, tmp_path)
    (tmp_path / "job.sbatch").write_text(script.script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "77",
        "SLURM_RESTART_COUNT": "2",
        "SLURM_JOB_NODELIST": "n1",
    }
    shell = subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], cwd=tmp_path, env=env, start_new_session=True)
    mark = RunDir(run_dir).sigterm_mark("77", 2)
    try:
        deadline = time.monotonic() + 20
        while not _holds_sleep(shell.pid):
            assert time.monotonic() < deadline, "the script never reached its control step"
            time.sleep(0.05)
        assert not mark.exists()
        os.killpg(shell.pid, signal.SIGTERM)  # as Slurm signals the batch step
        deadline = time.monotonic() + 10
        while not mark.exists():
            assert time.monotonic() < deadline, "no mark of the SIGTERM"
            time.sleep(0.05)
        assert shell.poll() is None  # the trap's control step still runs: the mark came first
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # KillWait over
        shell.wait()


def _holds_sleep(pid: int) -> bool:
    """The shell's foreground child is a stand-in control step, asleep."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return any(_cmdline(child).startswith(b"sleep") for child in children)


def _cmdline(pid: str) -> bytes:
    """A process's command line; empty when it ended between pgrep and this read (a short-lived
    child of the shell: what made this test fail under load)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_the_guardian_carries_the_jobs_site_options_and_its_gpus_when_asked() -> None:
    """A site's job_submit policy sees the guardian as it sees the job: partition, account, qos,
    constraint and exclude as the job has them, and `--gpus` where slurm.guardian_gpus asks."""
    from hpctrain.submit.render import render_guardian

    site = ("slurm.partition=gpu", "slurm.account=proj7", "slurm.qos=high", "slurm.constraint='a100&ib'")
    config = make_config("slurm.python=/opt/venv/bin/python", "slurm.exclude=node9", *site)
    script = render_guardian(config, Path("/scratch/me/runs/exp1"), Path("/home/me/project"))
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for wanted in ("--partition=gpu", "--account=proj7", "--qos=high", '--constraint="a100&ib"', "--exclude=node9"):
        assert f"#SBATCH {wanted}" in directives, directives
    assert not [d for d in directives if d.startswith("#SBATCH --gpus")], directives
    asked = make_config("slurm.python=/opt/venv/bin/python", "slurm.guardian_gpus=1", *site)
    script = render_guardian(asked, Path("/scratch/me/runs/exp1"), Path("/home/me/project"))
    assert "#SBATCH --gpus=1" in script.splitlines()
