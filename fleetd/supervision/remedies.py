"""What a game's next run changes after its worker diverged or ran out of CUDA memory.

The worker exits `ExitCode.DIVERGED` (NaN/inf, caught before any checkpoint) or
`ExitCode.CUDA_OOM`; the game restarts from its last good checkpoint with the learning rate
scaled down, or the batch halved, each down to a floor below which the game goes FATAL with
the reason. A learning-health rollback scales the learning rate too, kept apart
(`rollback_lr_scale`): starting a held game drops the rollbacks' scale, not a divergence's. The
scales reach the worker as `lr_scale` (both learning-rate scales) / `batch_scale` in its run spec.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleetd.store.records import GameRecord


@dataclass(frozen=True)
class Remedies:
    lr_scale: float = 1.0  # the divergence guard's
    batch_scale: float = 1.0
    rollback_lr_scale: float = 1.0  # the learning-health rollbacks'

    def scaled(self, field: str, factor: float, floor: float) -> Remedies | None:
        """With `field` times `factor`; None when that falls below `floor` (give up). The floor
        bounds the guard's own scaling: a learning-health rollback's scale, which its settings
        choose (`rollback_lr_scale`, as low as 1e-6), is not held to it, or the first divergence
        after such a rollback would be fatal at once."""
        value = getattr(self, field) * factor
        return None if value < floor else replace(self, **{field: value})

    def shown(self, field: str) -> str:
        """`field`'s scale as the run is given it, and where a rollback's is multiplied in, of what."""
        if field == "lr_scale" and self.rollback_lr_scale != 1.0:
            return (f"{self.learning_rate_scale:g} (the divergences' {self.lr_scale:g} x a rollback's "
                    f"{self.rollback_lr_scale:g})")
        return f"{self.run_scale(field):g}"

    def run_scale(self, field: str) -> float:
        """The scale the run spec carries for `field` (`lr_scale`: both learning-rate scales)."""
        return self.learning_rate_scale if field == "lr_scale" else getattr(self, field)

    def applied_to(self, spec):
        if self == Remedies() or spec is None:
            return spec
        return spec.model_copy(update={"lr_scale": self.learning_rate_scale, "batch_scale": self.batch_scale})

    @property
    def learning_rate_scale(self) -> float:
        """What the run's learning rate is scaled by: the divergences' and the rollbacks' scales."""
        return self.lr_scale * self.rollback_lr_scale


def remedies_of(game: GameRecord) -> Remedies:
    """The scales a game's next run takes, as the store keeps them (the supervisor stores them
    as they change), so a daemon restart does not start it again at the batch or rate that failed."""
    return Remedies(lr_scale=game.remedy_lr_scale, batch_scale=game.remedy_batch_scale,
                    rollback_lr_scale=game.remedy_rollback_lr_scale)
