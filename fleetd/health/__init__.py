"""Learning health: whether a game is still learning, judged from its evaluation returns
(docs/learning-health.md). `rules` and `settings` are pure and dependency-free; the
supervisor applies the verdicts (fleetd/supervision/learning.py, learning_actions.py)."""
