"""Per-game worker supervision: the state machine, the OS seams, the supervisor loop."""
