"""A short chaos soak (bench/chaos.py): a real daemon, three real training games, and one each
of a worker SIGKILL, a daemon SIGKILL (adoption) and a simulated reboot; every check of the soak
must pass. Its SIGSTOP incident (the hang watchdog, 40 s at the least) is left to the real-daemon
test of it and to the Atari soak, to keep the suite short:
tests/test_supervision_e2e.py::test_kill_9_worker_resumes_from_newest_checkpoint_and_sigstop_is_killed_as_hung"""

from __future__ import annotations

import pytest

from bench.chaos import Options, render, run_soak

pytestmark = pytest.mark.e2e


def test_short_chaos_soak_passes_every_check() -> None:
    options = Options(
        minutes=4.0,  # a bound on when incidents may start; the schedule ends the soak sooner
        seed=7,
        schedule=["worker_kill", "daemon_kill", "reboot"],
        gap_s=(0.5, 2.0),
        # The watchdog counts from the spawn: a torch worker under load takes 20-30 s to its first step.
        hang_timeout_s=40.0,
    )
    lines: list[str] = []
    report = run_soak(options, say=lines.append)
    text = render(report)
    print("\n".join(lines) + "\n" + text)  # shown by pytest when the test fails

    assert [i.kind for i in report.incidents] == options.schedule, text
    assert all(i.ok for i in report.incidents), text
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]
    assert not failed, text
    reboot = next(i for i in report.incidents if i.kind == "reboot")
    assert len(reboot.rows) == 3 and all(row.resumed is not None for row in reboot.rows), text
