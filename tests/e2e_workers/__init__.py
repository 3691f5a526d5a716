"""Stand-in workers for end-to-end tests (`[worker] module`): the worker protocol, no torch."""
