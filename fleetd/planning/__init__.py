"""Planning: when each game reaches its goal and what it costs, the queue, the rungs and the
host's reboots included (docs/planning.md).

- `goals.py`: a game's goal and its unit;
- `queue.py`: the plan itself, a pure simulation of the governor's queue (no I/O, no clock);
- `downtime.py`: the share of wall time the host's reboots take, from its reboot log;
- `rungs.py`: which rungs the what-if plans cover (the proven ones and the next to probe);
- `error.py`: the plan's past predictions against what happened;
- `projection.py`: recent rates from samples, and time lost to reboots;
- `service.py`: the plan from the store, and its predictions recorded (the only module here with I/O).
"""
