"""Game names become folder names: lowercase letters, digits, '-' and '_', starting alphanumeric."""

import re
from typing import Annotated

from pydantic import AfterValidator, Field

GAME_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
GAME_NAME_RULE = "must be a slug: 1-64 of a-z 0-9 - _, starting with a letter or digit"


def check_game_name(value: str) -> str:
    if not re.fullmatch(GAME_NAME_PATTERN, value):
        raise ValueError(GAME_NAME_RULE)
    return value


# A game's name in a model: the validator gives the rule in words; the pattern documents it in the
# OpenAPI schema.
GameName = Annotated[str, AfterValidator(check_game_name), Field(
    max_length=64, json_schema_extra={"pattern": GAME_NAME_PATTERN}, description=GAME_NAME_RULE, examples=["pong"])]
