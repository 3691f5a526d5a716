"""Tests of fleetd/operations/: alerts, backups, model import and export, run logs."""
