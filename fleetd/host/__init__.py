"""The host fleetd runs on: what it reads about it and what it holds there.

- `boot.py`: the boot id and the kernel's boot time;
- `uptime.py`: the boot and uptime log, what a daemon start means, the heartbeat;
- `expected_reboots.py`: the bounds of an operator's word that a reboot is coming;
- `forensics.py`: what the host looked like just before it went down;
- `telemetry.py`: NVML and psutil readings of the GPUs and the workers' process trees;
- `mounts.py`: this process's mounts (/proc/self/mountinfo), for telemetry and the OOM count;
- `statedir.py`: the one-daemon-per-state_dir lock;
- `sd_notify.py`: readiness, status and watchdog pings to systemd;
- `systemd_unit.py`: the unit file for this installation.

Nothing is imported here: the CLI reads `expected_reboots` without the rest.
"""
