"""`python -m workers --spec FILE`: run one training worker (docs/worker-protocol.md)."""

from __future__ import annotations

import argparse
import logging
import sys

from workers.protocol.exit_codes import ExitCode, write_exit_record
from workers.protocol.spec import RunSpec, SpecError

log = logging.getLogger("workers")


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    logging.captureWarnings(True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    parser.add_argument("--spec", required=True, help="run spec JSON written by the supervisor")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        spec = RunSpec.load(args.spec)
    except SpecError as exc:
        log.error("bad run spec %s: %s (exit %d)", args.spec, exc, ExitCode.BAD_SPEC)
        return ExitCode.BAD_SPEC
    log.info("worker for game %s, run %d: %s %s", spec.game, spec.run_id, spec.algo, spec.env_id)
    from workers.train import run  # torch and SB3 load only for a valid spec

    try:
        return run(spec)
    except SpecError as exc:  # found once the algorithm is known, e.g. a DQN-only key for PPO
        log.error("bad run spec %s: %s (exit %d)", args.spec, exc, ExitCode.BAD_SPEC)
        return ExitCode.BAD_SPEC


def main_recorded(argv: list[str] | None = None) -> int:
    """main(), leaving the exit code beside the run spec for a daemon that adopted this worker
    (workers.protocol.exit_codes.exit_record_path). An uncaught exception is recorded as the
    interpreter's own exit status for it, 1; death by a signal leaves no record."""
    code: int = 1
    try:
        code = main(argv)
        return code
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:
        spec, _ = _spec_arg().parse_known_args(argv)
        if spec.spec:
            try:
                write_exit_record(spec.spec, code)
            except OSError as exc:
                log.warning("could not leave the exit code beside %s: %s", spec.spec, exc)


def _spec_arg() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--spec")
    return parser


if __name__ == "__main__":
    sys.exit(main_recorded())
