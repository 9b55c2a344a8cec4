"""How a rank leaves: its exit code as sys.exit would give it, its output out first, and no
interpreter teardown (no atexit handler runs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hpctrain.process import ending


@pytest.mark.parametrize(
    ("code", "expected"),
    [(None, 0), (0, 0), (3, 3), (143, 143), ("error: a message", 1)],
)
def test_the_code_of_an_exit_is_what_sys_exit_gives(code: object, expected: int) -> None:
    assert ending.code_of(SystemExit(code)) == expected


def test_leave_flushes_logs_and_output_and_skips_the_teardown() -> None:
    program = textwrap.dedent("""\
        import atexit, logging, sys
        from hpctrain.process import ending
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
        atexit.register(lambda: print("teardown ran", flush=True))
        print("written before leaving", end="")  # no newline: still in the buffer
        logging.getLogger("x").info("logged before leaving")
        assert not ending.did_train_here()
        ending.trained_here()
        assert ending.did_train_here()
        ending.leave(7)
        """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert done.stdout == "written before leaving"  # flushed, and the atexit handler never ran
    assert done.stderr.strip() == "logged before leaving"
