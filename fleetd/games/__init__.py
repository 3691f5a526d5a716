"""What a game is and how it changes: the rules the API, the CLI and the fleet file share.

- `spec.py`: what defines a game, stated once (the API's body and a `[[games]]` entry);
- `fields.py`: which settings change in place (standard library only, for the CLI's help);
- `settings.py`: changing a game's settings, and the record of it;
- `lifecycle.py`: adding, starting, stopping and removing games;
- `fleet_spec.py`: the fleet as a file (`fleetd apply`, `fleetd export-spec`);
- `catalog.py`: which env ids exist;
- `module_envs.py`: a user's own env, `module:EnvName-vN`, judged from what importing it did;
- `slug.py`: game names as folder names.

Nothing is imported here: the CLI reads `fields` without pydantic.
"""
