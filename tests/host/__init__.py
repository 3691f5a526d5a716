"""Tests of fleetd/host/: boots, uptime, telemetry, forensics, the state dir lock, systemd."""
