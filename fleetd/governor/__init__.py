"""The load governor: tiers, gradual admission, back-off after instability."""
