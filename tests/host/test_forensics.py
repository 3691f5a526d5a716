"""Reboot forensics: the last heartbeat's picture kept in the boot's row, the previous boot's
kernel warnings read at the next start (journalctl faked), and both shown by
`GET /api/v1/boots/{id}` and `fleetd reboots --detail`. Fake clock and host; no sleeps."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from fleetd.api import create_app
from fleetd.api.context import AppContext, DaemonInfo
from fleetd.cli.render import boot_detail, console, forensics_rows
from fleetd.games.catalog import EnvCatalog
from fleetd.host.forensics import Journalctl, KernelLog, capture, record_kernel_log
from fleetd.host.nvml import incomplete_list
from fleetd.host.samples import GpuSample, HostSample, ProcessSample, Snapshot
from fleetd.host.telemetry import NOT_THIS_NAMESPACE
from fleetd.host.uptime import record_daemon_start
from fleetd.jobs import heartbeat_job
from tests.fakes import FakeHost
from tests.test_supervisor_loop import Loop, loop  # noqa: F401  (the fixture)

TOKEN = "f" * 32
HOT = Snapshot(
    at=1767225600.0,
    gpus=(GpuSample(0, "NVIDIA H100", 99.0, 70 * 2**30, 80 * 2**30, 91.0, 690.5),),
    gpu_available=True,
    gpu_unavailable_reason=None,
    host=HostSample(256 * 2**30, 9 * 2**30, 97.0, 61.5),
    processes=(),
)


def client_for(loop: Loop, boot_pk: int) -> TestClient:
    info = DaemonInfo(boot_pk, loop.clock.now())
    context = AppContext(loop.settings, loop.db, loop.clock, TOKEN, info, EnvCatalog(), loop.sup)
    client = TestClient(create_app(context))
    client.headers["Authorization"] = "Bearer " + TOKEN
    return client


def test_an_unclean_reboot_keeps_the_last_heartbeats_picture_and_the_kernels_warnings(loop: Loop) -> None:
    for name in ("a", "b", "c"):
        loop.add(name)
    loop.start()
    loop.run_up("a", "b")
    heartbeat_job(loop.db, loop.clock, loop.boot_pk, lambda: capture(HOT, loop.sup.snapshot, loop.clock.now()))
    host = FakeHost(loop.clock, boot_id="boot-0")
    host.reboot(down_s=120)  # no warning: nothing more is written before it
    start = record_daemon_start(loop.db, host.current_boot(), loop.clock.now())
    assert start.previous is not None and start.previous.id == loop.boot_pk
    record_kernel_log(loop.db, start.previous.id, KernelLog(True, None, ("2026-01-01T00:00:30+0000 host kernel: NVRM: Xid 79, GPU has fallen off the bus",)))

    detail = client_for(loop, start.boot.id).get(f"/api/v1/boots/{start.boot.id}").json()
    assert detail["id"] == start.boot.id and detail["reboot"]["clean"] is False
    before = detail["before_reboot"]
    state = before["last_state"]
    assert state["telemetry"]["gpus"][0]["temperature_c"] == 91.0
    assert state["telemetry"]["gpus"][0]["power_w"] == 690.5
    assert state["telemetry"]["host"]["load_1m"] == 61.5
    assert state["governor"]["tier"] == "light" and state["governor"]["admitted"] == ["a", "b"]
    assert state["governor"]["rung"] == "2x32 (light)" and state["governor"]["last_backoff"] is None
    assert state["telemetry"]["host"]["pressure"] == {"cpu_some_pct": None, "memory_full_pct": None, "io_full_pct": None}
    assert state["games"] == {"a": "running", "b": "running", "c": "pending"}
    assert before["kernel_warnings"]["kept"] is True and "Xid 79" in before["kernel_warnings"]["lines"][0]
    listed = client_for(loop, start.boot.id).get("/api/v1/boots").json()["items"]
    assert [b["id"] for b in listed] == [start.boot.id, loop.boot_pk]

    with console.capture() as captured:
        console.print(boot_detail(detail))
    text = captured.get()
    for expected in ("unclean", "light tier, level 2", "a, b", "91 C", "88% memory", "690 W", "load 61.50", "Xid 79"):
        assert expected in text, (expected, text)


def test_a_lost_gpu_in_the_last_picture_shows_as_lost_not_as_readings() -> None:
    """A heartbeat taken while NVML answered GPU_IS_LOST: the GPU listed for it (and its Xids)
    reads as lost, not as a GPU at 0% memory; a healthy GPU's picture is unchanged."""
    lost = GpuSample(0, "NVIDIA H100", None, 0, 0, None, None, xid_errors=(79,), lost=True)
    down = Snapshot(1767225600.0, (lost,), False, "NVML read failed: GPU is lost", HOT.host, ())
    rows = dict(forensics_rows(capture(down, None, datetime(2026, 1, 1, tzinfo=UTC))))
    assert rows["GPUs"] == "unavailable (NVML read failed: GPU is lost)"
    assert rows["GPU 0"] == 'NVIDIA H100: lost (NVML: GPU is lost), {"xid_errors": [79]}'
    rows = dict(forensics_rows(capture(HOT, None, datetime(2026, 1, 1, tzinfo=UTC))))
    assert rows["GPU 0"] == "NVIDIA H100: 91 C, 88% memory, 690 W" and "GPUs" not in rows


def test_a_last_picture_without_a_host_memory_reading_says_so_not_zero() -> None:
    """A host memory total out of range is no reading (None, fleetd/host/telemetry.py): the
    picture shows a dash where it divided by it (a TypeError before)."""
    unread = replace(HOT, host=HostSample(None, None, None, 61.5))
    rows = dict(forensics_rows(capture(unread, None, datetime(2026, 1, 1, tzinfo=UTC))))
    assert rows["host"] == "- memory available, load 61.50, CPU -"  # the dash alone, not "-%"


def test_a_last_picture_taken_in_another_pid_namespace_says_the_workers_gpu_memory_was_unknown() -> None:
    rows = dict(forensics_rows(capture(replace(HOT, process_gpu_reason=NOT_THIS_NAMESPACE), None, datetime(2026, 1, 1, tzinfo=UTC))))
    assert rows["worker GPU memory"] == f"unknown ({NOT_THIS_NAMESPACE})" and "process_gpu_reason" not in rows
    assert "worker GPU memory" not in dict(forensics_rows(capture(HOT, None, datetime(2026, 1, 1, tzinfo=UTC))))
    # Each worker's estimate, kept with the picture, said as one (never as a reading).
    estimated = (ProcessSample("pong", 10, 3, 2**30, 100.0, None, gpu_memory_estimate_bytes=6 * 2**30),)
    picture = capture(replace(HOT, process_gpu_reason=NOT_THIS_NAMESPACE, processes=estimated), None, datetime(2026, 1, 1, tzinfo=UTC))
    assert dict(forensics_rows(picture))["worker GPU memory"] == (
        f"unknown ({NOT_THIS_NAMESPACE}) (estimated from each worker's GPU: pong ~6.00 GiB est.)")


def test_a_last_picture_with_some_workers_unread_names_them() -> None:
    # "unknown (REASON)" read as every worker's, where NVML's incomplete list left only pong unread.
    why = incomplete_list("GPU 0 lists a process without its memory")
    workers = (ProcessSample("breakout", 10, 3, 2**30, 100.0, 2**30), ProcessSample("pong", 11, 3, 2**30, 100.0, None))
    picture = capture(replace(HOT, process_gpu_reason=why, processes=workers), None, datetime(2026, 1, 1, tzinfo=UTC))
    assert dict(forensics_rows(picture))["worker GPU memory"] == f"unknown for pong, 1 of 2 workers ({why})"


def test_a_boot_with_no_reboot_before_it_and_an_unknown_boot(loop: Loop) -> None:
    loop.start()
    client = client_for(loop, loop.boot_pk)
    detail = client.get(f"/api/v1/boots/{loop.boot_pk}").json()
    assert detail["before_reboot"] is None and detail["latest"]["kernel_warnings"] is None
    missing = client.get("/api/v1/boots/999")
    assert missing.status_code == 404 and "fleetd reboots" in missing.json()["error"]["message"]


def test_kernel_warnings_not_kept_when_journald_has_no_previous_boot(loop: Loop) -> None:
    loop.start()
    record_kernel_log(loop.db, loop.boot_pk, Journalctl(binary="").kernel_warnings("x"))
    detail = client_for(loop, loop.boot_pk).get(f"/api/v1/boots/{loop.boot_pk}").json()
    assert detail["latest"]["kernel_warnings"] == {"kept": False, "note": "not kept: journalctl is not installed", "lines": []}


class FakeRun:
    def __init__(self, result: subprocess.CompletedProcess[str] | Exception) -> None:
        self.result = result
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.calls.append((argv, kwargs))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_journalctl_is_asked_for_that_boot_bounded_in_lines_and_time() -> None:
    out = "\n".join(f"line {n} " + "x" * (900 if n == 79 else 0) for n in range(80))
    run = FakeRun(subprocess.CompletedProcess([], 0, out, ""))
    log = Journalctl("/usr/bin/journalctl", run).kernel_warnings("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    argv, kwargs = run.calls[0]
    assert argv[:6] == ["/usr/bin/journalctl", "-k", "-b", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "-p", "warning"]
    assert "-n" in argv and kwargs["timeout"] == 5.0
    assert log.kept and len(log.lines) == 50 and log.lines[0] == "line 30 "
    assert len(log.lines[-1]) == 500
    assert Journalctl("/j", FakeRun(subprocess.CompletedProcess([], 0, "", ""))).kernel_warnings("b").note == "no kernel warnings in that boot"


def test_journalctl_failures_say_not_kept_and_why() -> None:
    no_boot = FakeRun(subprocess.CompletedProcess([], 1, "", "Data from the specified boot (-1) is not available: No such boot ID in journal\n"))
    log = Journalctl("/j", no_boot).kernel_warnings("boot-0")
    assert no_boot.calls[0][0][3] == "-1"  # not a kernel boot id: the previous boot
    assert log == KernelLog(False, "not kept: Data from the specified boot (-1) is not available: No such boot ID in journal")
    slow = Journalctl("/j", FakeRun(subprocess.TimeoutExpired("journalctl", 5))).kernel_warnings("b")
    assert slow.note == "not kept: journalctl took longer than 5s"
    gone = Journalctl("/j", FakeRun(FileNotFoundError(2, "No such file or directory"))).kernel_warnings("b")
    assert gone.note == "not kept: cannot run journalctl: No such file or directory"
