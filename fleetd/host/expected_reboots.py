"""The bounds of an expected reboot (`fleetd expect-reboot`, `POST /api/v1/reboots/expected`),
shared by the API's schema and the CLI's own checks. Standard library only: the CLI checks them
without importing pydantic."""

MIN_WINDOW_S = 1  # less is no window at all (1e-300 s was taken: "expected within 0s")
MAX_WINDOW_S = 7 * 86400  # a word holds at most a week
MAX_REBOOTS = 10  # the most unclean reboots one word may explain
