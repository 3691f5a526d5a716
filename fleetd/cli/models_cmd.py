"""`fleetd games import` and `fleetd games export`: plain stable-baselines3 models in and out."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleetd.cli.exit_codes import ExitCode
from fleetd.cli.progress import MIB, Progress
from fleetd.cli.common import ConfigOption, JsonOption, call, fail, game_path, options_typed, whole_number
from fleetd.cli.games_cmd import GAME_OPTIONS, _show, games_app, parse_hyperparams
from fleetd.states import Desired

if TYPE_CHECKING:
    from fleetd.cli.client import ApiClient

TRANSFER_TIMEOUT_S = 1800.0  # the daemon checks the model in a subprocess; a replay buffer is slow


def _readable(path: Path | None, option: str) -> Path | None:
    if path is not None and not path.is_file():
        fail(f"{option} {path}: no such file")
    return path


@games_app.command("import")
def import_model(
    name: Annotated[str, typer.Argument(help="The new game's name (a slug).")],
    env_id: Annotated[str, typer.Argument(help="The env the model was trained on (CartPole-v1, Breakout-v5).")],
    source: Annotated[Path, typer.Option("--from", help="A stable-baselines3 model zip (model.save()).")],
    vecnormalize: Annotated[Path | None, typer.Option(help="Its VecNormalize statistics (VecNormalize.save()).")] = None,
    replay_buffer: Annotated[Path | None, typer.Option(help="DQN: its replay buffer (save_replay_buffer()).")] = None,
    algo: Annotated[str | None, typer.Option(help="ppo, dqn or a2c; default: detected from the zip.")] = None,
    total_timesteps: Annotated[int | None, typer.Option(parser=whole_number, metavar="INTEGER", help="Goal in env steps (the model's count included).")] = None,
    target_episodes: Annotated[int | None, typer.Option(parser=whole_number, metavar="INTEGER", help="Goal in whole episodes, counted from the import.")] = None,
    priority: Annotated[int, typer.Option(parser=whole_number, metavar="INTEGER", help="Higher runs first when the fleet is full.")] = 0,
    hp: Annotated[list[str] | None, typer.Option(help="Hyperparameter override key=value; repeat.")] = None,
    stopped: Annotated[bool, typer.Option("--stopped", help="Import it without starting it.")] = False,
    config: ConfigOption = None,
    json_out: JsonOption = False,
) -> None:
    """Start a game from an existing SB3 model: it resumes at the model's step count."""
    from workers.bundle import REPLAY_BUFFER, VECNORMALIZE

    _readable(source, "--from")
    extras = {VECNORMALIZE: _readable(vecnormalize, "--vecnormalize"),
              REPLAY_BUFFER: _readable(replay_buffer, "--replay-buffer")}
    params = {"env_id": env_id, "algo": algo, "total_timesteps": total_timesteps,
              "target_episodes": target_episodes, "priority": priority,
              "hyperparams": json.dumps(parse_hyperparams(hp or [])) if hp else None,
              "desired": str(Desired.STOPPED if stopped else Desired.RUNNING)}
    import tempfile

    if call(config, lambda client: _exists(client, name), options_typed(GAME_OPTIONS)):
        # Before the upload: the daemon refuses the name (409) only once the whole body has come,
        # minutes for a model with a replay buffer of gigabytes over a slow link.
        fail(f"game {name!r} already exists: import under a new name")
    with tempfile.TemporaryDirectory(prefix="fleetd-import-") as work:
        upload = _bundle(source, extras, Path(work) / "bundle.zip")
        Progress().step(f"importing {name}: uploading {source.name} ({upload.stat().st_size / MIB:.1f} MiB); "
                        "the daemon then loads it in a subprocess to check it ...")
        game = call(config, lambda client: client.upload(game_path(name, "/import"), upload, params,
                                                                  TRANSFER_TIMEOUT_S), options_typed(GAME_OPTIONS))
    _show(game, json_out, f"imported {name} ({game['algo']}, {env_id}); it resumes from the model's step count")


def _exists(client: "ApiClient", name: str) -> bool:
    from fleetd.cli.client import ClientError

    try:
        client.get(game_path(name))
    except ClientError as exc:
        if exc.code is ExitCode.NOT_FOUND:
            return False
        raise
    return True


def _bundle(model: Path, extras: dict[str, Path | None], target: Path) -> Path:
    """The model zip itself when it comes alone; else a stored zip of it and its files."""
    import zipfile

    from workers.bundle import MODEL

    present = {name: path for name, path in extras.items() if path is not None}
    if not present:
        return model
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as bundle:
        bundle.write(model, MODEL)
        for name, path in present.items():
            bundle.write(path, name)
    return target


@games_app.command("export")
def export_model(
    name: str,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write model.zip and its files into.")],
    best: Annotated[bool, typer.Option("--best/--latest", help="Best checkpoint by evaluation, or the newest.")] = False,
    config: ConfigOption = None,
) -> None:
    """Write a game's model as a plain SB3 zip (plus VecNormalize statistics, metadata, README)."""
    from workers.bundle import BUNDLE_FILES, METADATA

    if out.exists() and not out.is_dir():
        fail(f"--out {out}: a file, not a folder: name a new or empty folder for model.zip and its files", ExitCode.USAGE)
    # Any of the names the export writes, not only model.zip: a folder's own README.md was replaced.
    taken = [name for name in BUNDLE_FILES if (out / name).exists()]
    if taken:
        fail(f"{', '.join(str(out / name) for name in taken)} exist{'s' if len(taken) == 1 else ''}: the export "
             f"writes {', '.join(BUNDLE_FILES[:2])}, {METADATA} and README.md: export into an empty or new folder")
    # The folders this command makes, deepest first: taken away again if the export fails (a
    # missing game left an empty folder behind), unless something else was put in them.
    created = [folder for folder in (out, *out.parents) if not folder.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out}: cannot create the folder ({exc.strerror or exc})")
    progress, which = Progress(), "best" if best else "latest"
    progress.step(f"exporting {name}: the daemon packs its {which} checkpoint (with a replay buffer: minutes) ...")
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix=".export-", dir=out) as work:
            archive = Path(work) / "bundle.zip"
            on_bytes = lambda done, total: progress.count("downloading", done, total)  # noqa: E731
            call(config, lambda client: client.download(game_path(name, "/export"), archive,
                                                        TRANSFER_TIMEOUT_S, on_bytes, which=which))
            progress.step(f"unpacking into {out}")
            written = _extract(archive, out)
    except BaseException:  # typer.Exit from call() too
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (or gone): kept, and so is every folder above it
        raise
    meta = json.loads((out / METADATA).read_text())
    typer.echo(f"exported {name} ({meta['algo']}, {meta['steps']} steps, {meta['checkpoint']}): "
               + ", ".join(str(out / n) for n in written))


def _extract(archive: Path, out: Path) -> list[str]:
    """Only the bundle's known files, by name: nothing lands outside `out`."""
    import zipfile

    from workers.bundle import BUNDLE_FILES

    with zipfile.ZipFile(archive) as bundle:
        names = [n for n in BUNDLE_FILES if n in bundle.namelist()]
        for name in names:
            (out / name).write_bytes(bundle.read(name))
    return names
