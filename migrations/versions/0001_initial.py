"""The initial schema: boots, games, runs, checkpoints, events, samples.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _time(name: str, nullable: bool = False) -> sa.Column:
    # Naive UTC on disk; the application adds the time zone back.
    return sa.Column(name, sa.DateTime(), nullable=nullable)


def _pk(table: str) -> sa.PrimaryKeyConstraint:
    return sa.PrimaryKeyConstraint("id", name=f"pk_{table}")


def _fk(table: str, column: str, target: str, ondelete: str | None = None) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete=ondelete
    )


def _index(table: str, *columns: str) -> None:
    op.create_index(f"ix_{table}_{'_'.join(columns)}", table, list(columns))


def upgrade() -> None:
    op.create_table(
        "boots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        _time("booted_at"),
        _time("first_seen_at"),
        _time("last_seen_at"),
        _time("daemon_started_at"),
        sa.Column("daemon_clean_stop", sa.Boolean(), nullable=False),
        sa.Column("previous_id", sa.Integer(), nullable=True),
        _fk("boots", "previous_id", "boots"),
        _pk("boots"),
        sa.UniqueConstraint("boot_id", name="uq_boots_boot_id"),
    )
    op.create_table(
        "games",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("env_id", sa.String(128), nullable=False),
        sa.Column("algo", sa.String(8), nullable=False),
        sa.Column("desired", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("total_timesteps", sa.Integer(), nullable=True),
        sa.Column("target_episodes", sa.Integer(), nullable=True),
        sa.Column("checkpoint_interval_s", sa.Double(), nullable=True),
        sa.Column("hyperparams", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        _time("state_changed_at"),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("episodes", sa.Integer(), nullable=False),
        sa.Column("episodes_per_hour", sa.Double(), nullable=True),
        sa.Column("mean_reward_100", sa.Double(), nullable=True),
        sa.Column("best_reward", sa.Double(), nullable=True),
        _time("progress_at", nullable=True),
        _time("created_at"),
        _time("updated_at"),
        sa.CheckConstraint("algo IN ('ppo', 'dqn', 'a2c')", name="ck_games_algo"),
        sa.CheckConstraint("desired IN ('running', 'stopped')", name="ck_games_desired"),
        _pk("games"),
        sa.UniqueConstraint("name", name="uq_games_name"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        _time("at"),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(8), nullable=False),
        sa.Column("game", sa.String(64), nullable=True),
        sa.Column("boot_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.CheckConstraint("severity IN ('info', 'warning', 'error')", name="ck_events_severity"),
        _fk("events", "boot_id", "boots"),
        _pk("events"),
    )
    _index("events", "at")
    _index("events", "game", "at")
    _index("events", "kind", "at")
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("game_id", sa.Integer(), nullable=False),
        sa.Column("boot_id", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("proc_start_time", sa.Double(), nullable=True),
        sa.Column("cmdline", sa.JSON(), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=True),
        _time("started_at"),
        _time("ended_at", nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("exit_signal", sa.Integer(), nullable=True),
        sa.Column("cause", sa.String(32), nullable=True),
        sa.Column("resumed_from_steps", sa.Integer(), nullable=True),
        sa.Column("adoptions", sa.Integer(), nullable=False),
        _fk("runs", "boot_id", "boots"),
        _fk("runs", "game_id", "games", ondelete="CASCADE"),
        _pk("runs"),
    )
    _index("runs", "boot_id", "ended_at")
    _index("runs", "game_id", "started_at")
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer(), nullable=False),
        _time("at"),
        sa.Column("game_id", sa.Integer(), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("metric", sa.String(48), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        _fk("samples", "game_id", "games", ondelete="CASCADE"),
        _pk("samples"),
    )
    _index("samples", "at")
    _index("samples", "game_id", "metric", "at")
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("game_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("episodes", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        _time("created_at"),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=True),
        _fk("checkpoints", "game_id", "games", ondelete="CASCADE"),
        _fk("checkpoints", "run_id", "runs", ondelete="SET NULL"),
        _pk("checkpoints"),
        sa.UniqueConstraint("game_id", "path", name="uq_checkpoints_game_id_path"),
    )
    _index("checkpoints", "game_id", "steps")


def downgrade() -> None:
    for table in ("checkpoints", "samples", "runs", "events", "games", "boots"):
        op.drop_table(table)  # dropping a table drops its indexes
