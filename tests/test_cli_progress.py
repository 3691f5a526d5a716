"""Issue 25 item 4: long commands say what they are doing on stderr; on a terminal a byte count
moves in place, in a log each step is one line."""

from __future__ import annotations

import io

from fleetd.cli.progress import MIB, Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_the_steps_and_no_counts() -> None:
    log = io.StringIO()
    progress = Progress(log)
    progress.step("exporting pong: the daemon packs its latest checkpoint ...")
    progress.count("downloading", MIB, 4 * MIB)
    progress.step("unpacking into /tmp/pong")
    assert log.getvalue() == ("fleetd: exporting pong: the daemon packs its latest checkpoint ...\n"
                              "fleetd: unpacking into /tmp/pong\n")


def test_a_terminal_sees_the_count_move_and_the_next_step_on_its_own_line() -> None:
    terminal = Terminal()
    progress = Progress(terminal)
    progress.step("exporting pong ...")
    progress.count("downloading", MIB, 4 * MIB)
    progress.count("downloading", 4 * MIB, 4 * MIB)  # the last count is always drawn
    progress.step("unpacking into /tmp/pong")
    assert terminal.getvalue() == ("fleetd: exporting pong ...\n"
                                   "\rfleetd: downloading: 1.0 of 4.0 MiB"
                                   "\rfleetd: downloading: 4.0 of 4.0 MiB\n"
                                   "fleetd: unpacking into /tmp/pong\n")
