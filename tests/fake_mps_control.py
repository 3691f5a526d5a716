"""A stand-in for `nvidia-cuda-mps-control` (tests/test_mps_e2e.py puts it on PATH under that
name). It is NOT MPS: it shares no GPU. It speaks the real program's control protocol as far as
fleetd uses it:

- `nvidia-cuda-mps-control -d`: forks a control daemon into the background and returns 0; the
  daemon writes `nvidia-cuda-mps-control.pid` and listens on the `control` socket in
  CUDA_MPS_PIPE_DIRECTORY, logging to `control.log` in CUDA_MPS_LOG_DIRECTORY;
- `echo quit | nvidia-cuda-mps-control`: sends the commands on stdin to that daemon, which
  removes its pid file and socket and exits on `quit`; exits 1 when no daemon listens.
Standard library only.
"""

import os
import socket
import sys
from pathlib import Path

PIPE = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
LOG = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
SOCKET, PID_FILE = PIPE / "control", PIPE / "nvidia-cuda-mps-control.pid"


def log(line: str) -> None:
    with (LOG / "control.log").open("a") as out:
        out.write(line + "\n")


def serve() -> None:
    SOCKET.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(SOCKET))
    server.listen(4)
    PID_FILE.write_text(f"{os.getpid()}\n")
    log(f"started, pid {os.getpid()}")
    while True:
        conn, _ = server.accept()
        commands = conn.recv(4096).decode().split()
        conn.close()
        if "quit" in commands:
            log("quit")
            PID_FILE.unlink(missing_ok=True)
            SOCKET.unlink(missing_ok=True)
            os._exit(0)


def daemonize() -> int:
    if os.fork():
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    serve()
    return 0


def client() -> int:
    commands = sys.stdin.read()
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(str(SOCKET))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    conn.sendall(commands.encode())
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(daemonize() if sys.argv[1:] == ["-d"] else client())
