"""Learning health: whether a game is still learning, judged from its evaluation returns
(docs/learning-health.md). `rules` is pure and dependency-free; `watch` applies its verdicts."""
