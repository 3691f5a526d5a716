"""Evaluation episodes and the best model: real CartPole training, manifests, retention."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import tests.workers.faulty_env  # noqa: F401 - registers the Eval*CartPole-v0 ids
from workers import checkpoint
from workers.callback import StopFlag
from workers.envs import EnvConfig, make_vec_env
from workers.evaluation import EvalFailure, Evaluator, sticky_cuda_error
from workers.protocol.exit_codes import ExitCode
from workers.protocol.reports import CheckpointReport, ProgressReport
from workers.train import run

EVAL = {"num_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2,
        "policy_kwargs": {"net_arch": [16]}, "eval_interval_steps": 256, "eval_episodes": 3}


@pytest.fixture
def inbox(inbox):
    inbox.collect()
    return inbox


def _scores(directory) -> dict[int, float | None]:
    return {c.steps: checkpoint.read_manifest(c.path).eval_return
            for c in checkpoint.list_checkpoints(directory)}


def test_evaluation_runs_at_due_checkpoints_reports_and_lands_in_the_manifest(make_spec, inbox):
    spec = make_spec(progress_socket=str(inbox.path), total_timesteps=768, hyperparams=EVAL,
                     keep_checkpoints=10)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    scores = _scores(spec.checkpoint_dir)
    # checkpoints every 128 steps; an evaluation at the first one 256 steps after the last
    assert sorted(s for s, r in scores.items() if r is not None) == [256, 512, 768]
    assert all(scores[s] is None for s in (128, 384, 640))
    assert all(r >= 1.0 for r in scores.values() if r is not None)  # CartPole pays 1 a step
    reports = inbox.drain()
    by_ckpt = {r.checkpoint.steps: r.checkpoint.eval_return for r in reports
               if isinstance(r, CheckpointReport)}
    assert by_ckpt == scores
    progress = [r for r in reports if isinstance(r, ProgressReport)]
    last = progress[-1]
    assert last.eval_return == scores[768]
    # The evaluations' own steps, which show the hang watchdog the worker alive while it evaluates
    frames = [r.eval_frames for r in progress]
    assert frames == sorted(frames) and last.eval_frames > 0
    best = checkpoint.best_verified(spec.checkpoint_dir)
    assert best is not None and scores[best.steps] == max(r for r in scores.values() if r is not None)


def test_evaluation_is_deterministic_for_the_same_model(make_spec):
    spec = make_spec(total_timesteps=256, hyperparams=EVAL)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    first = _scores(spec.checkpoint_dir)[256]
    again = make_spec(total_timesteps=256, hyperparams=EVAL,
                      checkpoint_dir=str(spec.checkpoint_dir) + "-again")
    assert run(again, stop=StopFlag()) == ExitCode.COMPLETED
    assert first is not None and _scores(again.checkpoint_dir)[256] == first


def test_eval_episodes_0_turns_evaluation_off(make_spec):
    spec = make_spec(total_timesteps=256, hyperparams={**EVAL, "eval_episodes": 0})
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    assert set(_scores(spec.checkpoint_dir).values()) == {None}
    assert checkpoint.best_verified(spec.checkpoint_dir) is None


def test_best_checkpoint_survives_pruning_and_resume_reports_its_figure(make_spec, inbox):
    spec = make_spec(total_timesteps=512, hyperparams=EVAL, keep_checkpoints=1, keep_hourly=0,
                     keep_daily=0)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    best_before = checkpoint.best_verified(spec.checkpoint_dir)
    assert best_before is not None
    kept = [c.steps for c in checkpoint.list_checkpoints(spec.checkpoint_dir)]
    assert kept == sorted({512, best_before.steps}, reverse=True)  # the newest, and the best
    # Make it the best by far (the manifest is not part of its own hashes): a longer run
    # evaluates again and prunes to one, and must keep it.
    longer = make_spec(total_timesteps=1024, hyperparams=EVAL, keep_checkpoints=1, keep_hourly=0,
                       keep_daily=0, progress_socket=str(inbox.path))
    manifest_path = best_before.path / "manifest.json"
    data = json.loads(manifest_path.read_text())
    data["eval_return"] = 1e6
    manifest_path.write_text(json.dumps(data))
    assert run(longer, stop=StopFlag()) == ExitCode.COMPLETED
    kept = [c.steps for c in checkpoint.list_checkpoints(spec.checkpoint_dir)]
    assert kept == [1024, best_before.steps]  # the newest, and the best
    assert checkpoint.best_verified(spec.checkpoint_dir).steps == best_before.steps
    first = next(r for r in inbox.drain() if isinstance(r, ProgressReport))
    assert first.eval_return is not None  # resumed from 512, which was evaluated


def test_a_run_resumed_from_an_unevaluated_checkpoint_keeps_the_evaluation_cadence(make_spec):
    """Resumed from a checkpoint that was not evaluated, the next evaluation is due an interval
    after the last one before it, as in a run that never stopped; it came at the first
    checkpoint past an interval from step 0 (after every restart, in a crash loop)."""
    hyperparams = {**EVAL, "eval_interval_steps": 384}
    first = make_spec(total_timesteps=512, hyperparams=hyperparams, keep_checkpoints=20)
    assert run(first, stop=StopFlag()) == ExitCode.COMPLETED
    assert [s for s, r in sorted(_scores(first.checkpoint_dir).items()) if r is not None] == [384]
    longer = make_spec(total_timesteps=1024, hyperparams=hyperparams, keep_checkpoints=20)
    assert run(longer, stop=StopFlag()) == ExitCode.COMPLETED
    scores = _scores(longer.checkpoint_dir)
    assert [s for s, r in sorted(scores.items()) if r is not None] == [384, 768]  # not 640
    state = json.loads((checkpoint.list_checkpoints(longer.checkpoint_dir)[0].path / "state.json").read_text())
    assert (state["counters"]["eval_steps"], state["counters"]["eval_return"]) == (768, scores[768])


def test_a_seed_at_the_top_of_envpools_int32_evaluates(make_spec):
    """The evaluation env's seed (the game's + 1,000,003) wraps within EnvPool's int32: a seed
    near 2^31 trained, then crashed at its first evaluation, and at every restart again."""
    spec = make_spec(total_timesteps=256, hyperparams=EVAL, seed=2**31 - 1)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    assert _scores(spec.checkpoint_dir)[256] is not None


ONE_ENV_EVAL = {**EVAL, "num_envs": 1, "eval_episodes": 1}  # in-process envs: the test env's raise is ours


def _eval_failures(reports) -> dict[int, tuple[str | None, bool]]:
    """What each checkpoint report says of the evaluation just before it."""
    return {r.checkpoint.steps: (r.eval_failure, r.eval_subprocess_died) for r in reports
            if isinstance(r, CheckpointReport)}


def test_a_failing_evaluation_fails_alone_and_training_goes_on(make_spec, caplog, inbox):
    """An evaluation env that raises crashed the whole worker, at every evaluation after every
    restart. Now that evaluation fails alone (logged; that checkpoint has no eval_return),
    training goes on, and the next evaluation is tried at its normal time. The checkpoint
    report that follows it says why (the daemon's `evaluation_failed` event); those of the
    checkpoints with no evaluation due say nothing failed."""
    spec = make_spec(env_id="EvalFailCartPole-v0", progress_socket=str(inbox.path), total_timesteps=768,
                     hyperparams=ONE_ENV_EVAL, keep_checkpoints=10)
    with caplog.at_level(logging.ERROR, logger="workers.evaluation"):
        assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    scores = _scores(spec.checkpoint_dir)
    assert sorted(scores) == [128, 256, 384, 512, 640, 768] and set(scores.values()) == {None}
    failed = [r.getMessage() for r in caplog.records if r.name == "workers.evaluation"]
    assert [m.split(" failed")[0] for m in failed] == [f"evaluation at {s} steps" for s in (256, 512, 768)]
    assert "RuntimeError: evaluation env broke (test env)" in failed[0]
    assert "training goes on (next evaluation due at 512 steps)" in failed[0]
    why = ("RuntimeError: evaluation env broke (test env)", False)
    assert _eval_failures(inbox.drain()) == {128: (None, False), 256: why, 384: (None, False), 512: why,
                                              640: (None, False), 768: why}


@pytest.mark.parametrize("stopped", [False, True], ids=["limit", "stop"])
def test_an_evaluation_past_its_limit_is_a_failure_and_one_a_stop_cut_short_is_not(stopped):
    """An evaluation abandoned past its limit is a failure the daemon is told of (an
    `evaluation_failed` event); one a stop cut short is not (a stop is normal)."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", make_vec_env(EnvConfig("CartPole-v1", 1)), n_steps=64, batch_size=64,
                policy_kwargs={"net_arch": [8]}, device="cpu")
    evaluator = Evaluator(EnvConfig("CartPole-v1", 1), episodes=1, interval_steps=256,
                          should_stop=lambda: stopped, max_s=-1.0)  # past it at the first step
    assert evaluator.evaluate(model, 256) is None
    assert evaluator.failure == (None if stopped else EvalFailure("abandoned after 0 s (limit -1 s)"))


@pytest.mark.parametrize(("error", "reason"), [(EOFError(), "EOFError"), (EOFError("\n  boom\nmore"), "EOFError: boom"),
                                               (RuntimeError("bad env"), "RuntimeError: bad env")])
def test_a_failure_is_named_by_its_type_and_first_line_with_text(monkeypatch, error, reason):
    """The reason the event carries: the error's type, and its first line that has text (a
    message opening with a newline lost its text; one without a message left a dangling colon)."""
    from stable_baselines3 import PPO

    import workers.evaluation as evaluation

    model = PPO("MlpPolicy", make_vec_env(EnvConfig("CartPole-v1", 1)), n_steps=64, batch_size=64,
                policy_kwargs={"net_arch": [8]}, device="cpu")

    def broken(config):
        raise error

    monkeypatch.setattr(evaluation, "make_vec_env", broken)  # the eval env's build fails so
    evaluator = Evaluator(EnvConfig("CartPole-v1", 1), episodes=1, interval_steps=256)
    assert evaluator.evaluate(model, 256) is None
    assert evaluator.failure == EvalFailure(reason)


def test_an_interrupt_inside_an_evaluation_is_not_taken_for_its_failure(make_spec):
    spec = make_spec(env_id="EvalInterruptCartPole-v0", total_timesteps=256, hyperparams=ONE_ENV_EVAL)
    with pytest.raises(KeyboardInterrupt):
        run(spec, stop=StopFlag())


def test_an_eval_env_dying_in_its_subprocess_is_logged_as_that(make_spec, caplog, inbox):
    """With more than one evaluation game the eval envs run in SubprocVecEnv children: one that
    raised left the worker a dead pipe, and closing the envs raised again (BrokenPipeError),
    hiding the first error. The log names the first error and where the child's traceback is."""
    spec = make_spec(env_id="tests.workers.faulty_env:EvalFailCartPole-v0", progress_socket=str(inbox.path),
                     total_timesteps=256,
                     hyperparams={**ONE_ENV_EVAL, "eval_episodes": 2})
    with caplog.at_level(logging.DEBUG, logger="workers.evaluation"):
        assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    assert _scores(spec.checkpoint_dir)[256] is None
    failed = [r for r in caplog.records if r.name == "workers.evaluation" and r.levelno == logging.ERROR]
    assert len(failed) == 1 and "evaluation at 256 steps failed" in failed[0].getMessage()
    assert "(EOFError)" in failed[0].getMessage()  # the recv that met the dead child, not close()'s error
    assert "(an eval env subprocess died; its traceback is in the worker log above)" in failed[0].getMessage()
    reason, died = _eval_failures(inbox.drain())[256]
    assert reason == "EOFError" and died  # no message: the type alone, no dangling colon


def test_a_sticky_cuda_error_inside_an_evaluation_ends_the_run():
    """An illegal memory access poisons the CUDA context: logged as the evaluation's failure with
    "training goes on", the next training step crashed anyway. It goes on up, as an OOM does."""
    assert sticky_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not sticky_cuda_error(RuntimeError("evaluation env broke (test env)"))
    assert not sticky_cuda_error(ValueError("CUDA error: not a RuntimeError"))
    if hasattr(torch, "AcceleratorError"):  # torch >= 2.8 raises this type for such errors
        assert sticky_cuda_error(torch.AcceleratorError("an illegal memory access was encountered"))


def test_a_cuda_error_raised_in_an_evaluation_is_not_taken_for_its_failure(make_spec):
    spec = make_spec(env_id="EvalCudaErrorCartPole-v0", total_timesteps=256, hyperparams=ONE_ENV_EVAL)
    with pytest.raises(RuntimeError, match="CUDA error: an illegal memory access"):
        run(spec, stop=StopFlag())


def test_the_eval_env_built_and_reset_counts_as_progress_before_its_first_step(make_spec, inbox):
    """Building the eval envs (8 subprocesses: seconds) and resetting them advanced no
    `eval_frames`: the hang watchdog saw nothing until the first evaluation step. Now each is
    a heartbeat of its own (here the eval env's first step raises, so only those two count)."""
    spec = make_spec(env_id="EvalStepFailCartPole-v0", progress_socket=str(inbox.path), total_timesteps=256,
                     hyperparams=ONE_ENV_EVAL)
    assert run(spec, stop=StopFlag()) == ExitCode.COMPLETED
    assert _scores(spec.checkpoint_dir)[256] is None
    progress = [r for r in inbox.drain() if isinstance(r, ProgressReport)]
    assert progress[-1].eval_frames == 2
