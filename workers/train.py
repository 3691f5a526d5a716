"""One training run: resume or start, learn until stopped or done, final checkpoint, exit code."""

from __future__ import annotations

import logging
import os
import time

import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.type_aliases import TrainFreq
from stable_baselines3.common.utils import configure_logger, set_random_seed
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from workers import checkpoint, defaults
from workers.algos import ALGO_CLASSES, schedule_end_note, set_schedule_horizon
from workers.callback import Checkpointer, FleetCallback, Outcome, StopFlag, goal_reached
from workers.counters import Counters
from workers.envs import EnvConfig, make_vec_env
from workers.evaluation import Evaluator
from workers.guards import Diverged, apply_lr_scale, non_finite_forward
from workers.lease import Superseded
from workers.defaults import family
from workers.hyperparams import (Plan, algo_kwargs, configure_torch, dqn_updates, make_plan, policy_name,
                                 schedule_horizon, select_device)
from workers.precision import apply_precision
from workers.protocol.exit_codes import ExitCode
from workers.protocol.sender import ProgressSender
from workers.protocol.spec import PPO_MIN_BATCH, RunSpec, SpecError
from workers.reporting import Reporter
from workers.resume import ResumeResult, find_resumable
from workers.snapshot import ReplayPolicy, restore_rng

log = logging.getLogger(__name__)

UNBOUNDED_STEPS = 2**62  # "train until stopped": SB3 needs a number


def run(spec: RunSpec, stop: StopFlag | None = None) -> int:
    """Train one game as the spec says; returns the process exit code."""
    stop = stop or StopFlag().install()
    device = select_device(spec.device, spec.gpu)
    configure_torch(device, spec.cpu_threads)
    plan = make_plan(spec, device)
    set_random_seed(spec.seed, using_cuda=device.kind == "cuda")  # python, numpy, torch
    venv = make_vec_env(env_config(spec, plan))
    sender = ProgressSender(spec.progress_socket)
    try:
        return _run_with_env(spec, plan, venv, sender, stop)
    finally:
        venv.close()
        sender.close()


def env_config(spec: RunSpec, plan: Plan) -> EnvConfig:
    return EnvConfig(env_id=spec.env_id, num_envs=plan.num_envs, seed=spec.seed,
                     num_threads=env_threads(spec),
                     max_episode_steps=plan.max_episode_steps,
                     frame_stack=plan.frame_stack)


def env_threads(spec: RunSpec) -> int:
    """EnvPool's threads: the spec's, within this host's cores, as fleetd bounds them on its own
    host (a Ray node's cores are not the head's); never below the torch threads it was given."""
    if not spec.env_threads:
        return spec.cpu_threads
    return max(spec.cpu_threads, min(spec.env_threads, os.cpu_count() or 1))


def _run_with_env(spec: RunSpec, plan: Plan, venv: VecEnv, sender: ProgressSender, stop: StopFlag) -> int:
    checkpoint.remove_temporaries(spec.checkpoint_dir)
    try:  # the model comes to the GPU here, before `_train`: its OOM is the same remedy's
        found = find_resumable(spec.checkpoint_dir, spec.algo, venv, plan.device.torch, plan.normalize,
                               plan.overrides)
        counters = found.restored.counters if found.restored else Counters()
        reporter = Reporter(sender, spec.game, spec.run_id, counters, spec.progress_interval_s)
        if found.unusable and not spec.allow_fresh_start:
            return _refuse_unusable(spec, found, reporter)
        if found.unusable:
            log.warning("no checkpoint is usable; starting from scratch (allow_fresh_start)")
        model = _model_from(found, spec, plan, venv)
        apply_precision(model, spec.bf16_autocast, spec.channels_last)
    except torch.OutOfMemoryError as exc:
        return _cuda_oom(exc, "loading or building the model")
    taken = str(found.taken) if found.taken else None
    horizon = schedule_horizon(spec, plan, _image_obs(venv))
    set_schedule_horizon(model, horizon)
    apply_lr_scale(model, spec.lr_scale)
    log.info("schedules run over %d total steps (%.0f%% done)", horizon,
             100 * (1 - model._current_progress_remaining))
    replay = ReplayPolicy(plan.save_replay_buffer, plan.replay_buffer_max_bytes)
    reporter.send_resumed(taken, found.skipped, _start_notes(found, spec, model, replay),
                          tuple((c.key, c.old, c.new) for c in found.changes))
    interval_steps = spec.checkpoint_interval_steps or defaults.checkpoint_interval_steps(horizon)
    evaluator = Evaluator(env_config(spec, plan), plan.eval_episodes,
                          plan.eval_interval_steps or defaults.eval_interval_steps(horizon),
                          should_stop=lambda: stop.requested, heartbeat=counters.eval_frame)
    checkpointer = Checkpointer(spec, replay, reporter, interval_steps, evaluator=evaluator)
    if found.taken is not None:
        checkpointer.mark_current(counters.steps, _age_s(found.taken))
        _resume_evaluation(found.taken, counters, evaluator, reporter)
    elif spec.unsaved_since is not None:  # from scratch, after runs that left nothing
        checkpointer.mark_current(0, max(0.0, time.time() - spec.unsaved_since))
    return _train(spec, model, counters, reporter, stop, checkpointer)


def _refuse_unusable(spec: RunSpec, found: ResumeResult, reporter: Reporter) -> int:
    """Checkpoints exist and none is usable: never train from scratch over them unasked."""
    reporter.send_resumed(None, found.skipped, refused=True)
    log.error("checkpoints exist in %s but none verifies and loads; refusing to start from "
              "scratch (exit %d). Inspect them (the reasons above); to train this game anew under "
              "fleetd: fleetd games rm %s, then fleetd games add %s %s --kept set-aside (a worker run "
              "by hand: allow_fresh_start in its spec)", spec.checkpoint_dir, ExitCode.CHECKPOINTS_UNUSABLE,
              spec.game, spec.game, spec.env_id)
    return ExitCode.CHECKPOINTS_UNUSABLE


def _age_s(taken) -> float | None:
    """How long ago the checkpoint resumed from was written (its manifest's wall time)."""
    try:
        return max(0.0, time.time() - checkpoint.read_manifest(taken).created_at)
    except checkpoint.CheckpointError:
        return None


def _resume_evaluation(taken, counters: Counters, evaluator: Evaluator, reporter: Reporter) -> None:
    """Report the latest evaluation's figure as of the checkpoint resumed from, and count the
    next evaluation's interval from it: its own (the manifest's), or an earlier one's (its
    counters; a checkpoint written before they carried it has only its own)."""
    try:
        manifest = checkpoint.read_manifest(taken)
    except checkpoint.CheckpointError:
        return
    if manifest.eval_return is not None:
        reporter.eval_return = manifest.eval_return
        evaluator.mark_current(manifest.steps)
    elif counters.eval_steps is not None:
        reporter.eval_return = counters.eval_return
        evaluator.mark_current(counters.eval_steps)


def _start_notes(found: ResumeResult, spec: RunSpec, model: BaseAlgorithm, replay: ReplayPolicy) -> tuple[str, ...]:
    """Warnings at start, logged and reported as events: the replay buffer's, the schedules'."""
    notes = list(_replay_notes(found, model, replay))
    first_run = found.taken is None and not found.unusable
    if (note := schedule_end_note(model, spec.game, spec.total_timesteps, first_run)) is not None:
        log.warning("%s", note)
        notes.append(note)
    return tuple(notes)


def _refill_words(model: BaseAlgorithm) -> str:
    """The transitions a resume without the buffer collects before training, as the notes say it."""
    need = model.refill_transitions() if hasattr(model, "refill_transitions") else model.learning_starts
    if need < model.learning_starts:
        return f"{need:,} transitions (a full buffer: fewer than learning_starts, {model.learning_starts:,})"
    if need > model.learning_starts:
        return f"{need:,} transitions (a batch: more than learning_starts, {model.learning_starts:,})"
    return f"learning_starts ({need:,}) transitions"


def _replay_notes(found: ResumeResult, model: BaseAlgorithm, replay: ReplayPolicy) -> tuple[str, ...]:
    """Warnings about an off-policy model's replay buffer."""
    notes = []
    if (refusal := replay.refusal(model)) is not None:
        notes.append(f"checkpoints leave the replay buffer out: {refusal}; a resumed run re-collects "
                     f"{_refill_words(model)} first")
    if found.restored is not None and found.restored.replay_note:
        notes.append(f"resumed without the replay buffer ({found.restored.replay_note}): collecting "
                     f"{_refill_words(model)} with the restored policy and exploration before training again")
    for note in notes:
        log.warning("%s", note)
    return tuple(notes)


def _model_from(found: ResumeResult, spec: RunSpec, plan: Plan, venv: VecEnv) -> BaseAlgorithm:
    if found.restored is None:
        return build_model(spec, plan, venv)
    model = found.restored.model
    restore_rng(found.restored.rng, model)
    model.tensorboard_log = tensorboard_dir(spec)
    apply_batch_size(model, plan, _image_obs(venv))
    return model


def _image_obs(venv: VecEnv) -> bool:
    return is_image_space(venv.observation_space, check_channels=False)


def apply_batch_size(model: BaseAlgorithm, plan: Plan, image_obs: bool = False) -> None:
    """The plan's batch size holds on resume too: a tier change restarts games from their
    checkpoints expecting its settings. SB3 reads `batch_size` at every update (A2C has none);
    PPO's minibatch stays within its rollout, as for a new model. Only an on-policy rollout
    bounds it: DQN has an `n_steps` too (its n-step return, 1 by default), and capping by that
    once trained every resumed DQN on batches of `num_envs` transitions. DQN takes its batch and
    update frequency as a new model on this env count would (`dqn_updates`: the zoo's reuse)."""
    if not hasattr(model, "batch_size"):
        return
    if isinstance(model, DQN):
        _apply_dqn_updates(model, dqn_updates(plan, family(image_obs)))
        return
    batch = plan.batch_size
    if isinstance(model, OnPolicyAlgorithm):
        batch = min(batch, model.n_steps * model.n_envs)
    if isinstance(model, PPO):  # no minibatch of one, as for a new model (algo_kwargs): a
        batch = max(PPO_MIN_BATCH, batch)  # batch_scale after CUDA out-of-memory can make it 1
    if batch != model.batch_size:
        log.info("batch_size %d -> %d (this run's plan)", model.batch_size, batch)
        model.batch_size = batch


def _apply_dqn_updates(model: DQN, updates: dict[str, int]) -> None:
    new = {"batch_size": updates["batch_size"], "gradient_steps": updates.get("gradient_steps", model.gradient_steps),
           "train_freq": updates.get("train_freq", model.train_freq.frequency)}
    old = {"batch_size": model.batch_size, "gradient_steps": model.gradient_steps, "train_freq": model.train_freq.frequency}
    if new == old:
        return
    log.info("DQN updates %s -> %s (the zoo's reuse at %d envs)", old, new, model.n_envs)
    model.batch_size, model.gradient_steps = new["batch_size"], new["gradient_steps"]
    model.train_freq = TrainFreq(new["train_freq"], model.train_freq.unit)


def build_model(spec: RunSpec, plan: Plan, venv: VecEnv) -> BaseAlgorithm:
    image_obs = _image_obs(venv)
    kwargs = algo_kwargs(spec.algo, plan, image_obs)
    # The returns it scales rewards by are discounted as the algorithm discounts (the zoo's
    # choice); VecNormalize's own default is 0.99 whatever the algorithm's gamma.
    gamma = kwargs.get("gamma", 0.99)
    env = VecNormalize(venv, norm_obs=not image_obs, gamma=gamma) if plan.normalize else venv
    log.info("fresh %s model, %s: %s", spec.algo.upper(), policy_name(plan, image_obs), kwargs)
    try:
        return ALGO_CLASSES[spec.algo](policy_name(plan, image_obs), env, device=plan.device.torch,
                                       seed=spec.seed, verbose=0,
                                       tensorboard_log=tensorboard_dir(spec), **kwargs)
    except (ValueError, TypeError, AssertionError) as exc:
        # SB3 and torch check what the spec's own bounds cannot (a malformed net_arch, an
        # optimizer's kwargs) as they build the model: the spec's fault, which no restart
        # fixes. A bad spec (exit 78, FATAL with this reason), not a crash to retry.
        raise SpecError("hyperparams", f"SB3 cannot build a {spec.algo.upper()} model from them: "
                        f"{type(exc).__name__}: {exc}") from exc


def tensorboard_dir(spec: RunSpec) -> str | None:
    if spec.tensorboard_dir is None:
        return None
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        log.info("tensorboard is not installed; no TensorBoard logs in %s", spec.tensorboard_dir)
        return None
    return spec.tensorboard_dir


def sb3_logger(tensorboard_log: str | None, tb_log_name: str) -> Logger:
    """SB3's own choice, less its default folder: without TensorBoard, `learn()` would create
    an empty tempdir/SB3-<date> folder at every run. Progress goes through our Reporter."""
    if tensorboard_log is None:
        return Logger(folder=None, output_formats=[])
    return configure_logger(0, tensorboard_log, tb_log_name, reset_num_timesteps=False)


def _train(spec: RunSpec, model: BaseAlgorithm, counters: Counters, reporter: Reporter,
           stop: StopFlag, checkpointer: Checkpointer) -> int:
    callback = FleetCallback(spec, counters, stop, checkpointer)
    reporter.start()
    try:
        if not goal_reached(spec, counters):
            model.set_logger(sb3_logger(model.tensorboard_log, spec.game))
            model.learn(total_timesteps=_budget(spec, counters), callback=callback,
                        reset_num_timesteps=False, tb_log_name=spec.game)
            counters.steps = model.num_timesteps
        outcome = _outcome(spec, counters, callback, stop)
        final_saved = checkpointer.write_final(model, counters, evaluate=outcome is Outcome.COMPLETED)
    except (Diverged, ValueError) as exc:
        if isinstance(exc, ValueError) and (exc := non_finite_forward(exc, model.num_timesteps)) is None:
            raise
        log.error("training diverged: %s; no checkpoint written, the last good one stays newest "
                  "(exit %d)", exc, ExitCode.DIVERGED)
        return ExitCode.DIVERGED
    except torch.OutOfMemoryError as exc:
        return _cuda_oom(exc, f"at {model.num_timesteps} steps")
    except Superseded as exc:
        log.error("%s; no checkpoint written, exiting (exit %d)", exc, ExitCode.SUPERSEDED)
        return ExitCode.SUPERSEDED
    finally:
        reporter.stop()
        log.info("%s", callback.phases.describe())
    if not final_saved:
        return _final_not_saved(outcome, counters)
    return _exit_code(outcome, counters)


def _final_not_saved(outcome: Outcome, counters: Counters) -> int:
    """Neither 20 nor 0: fleetd would take the game as done (or cleanly stopped) and the
    training since the newest checkpoint would be lost. A crash's code restarts it from that
    checkpoint, to train the rest again and save it then."""
    log.error("%s at %d steps, but the final checkpoint was not written (the error above); the "
              "newest checkpoint on disk is older (exit %d: a crash, restarted from that one)",
              "goal reached" if outcome is Outcome.COMPLETED else "stopped on signal", counters.steps,
              ExitCode.FINAL_CHECKPOINT_FAILED)
    return ExitCode.FINAL_CHECKPOINT_FAILED


def _cuda_oom(exc: torch.OutOfMemoryError, when: str) -> int:
    log.error("CUDA out of memory %s: %s; no checkpoint written (exit %d)",
              when, str(exc).splitlines()[0] if str(exc) else "", ExitCode.CUDA_OOM)
    return ExitCode.CUDA_OOM


def _budget(spec: RunSpec, counters: Counters) -> int:
    if spec.total_timesteps is None:
        return UNBOUNDED_STEPS
    return spec.total_timesteps - counters.steps


def _outcome(spec: RunSpec, counters: Counters, callback: FleetCallback, stop: StopFlag) -> Outcome:
    if goal_reached(spec, counters):
        return Outcome.COMPLETED
    if stop.requested or callback.outcome is Outcome.STOPPED:
        return Outcome.STOPPED
    return Outcome.COMPLETED  # learn() ran out of its step budget


def _exit_code(outcome: Outcome, counters: Counters) -> int:
    if outcome is Outcome.COMPLETED:
        log.info("goal reached at %d steps, %d episodes; exit %d", counters.steps,
                 counters.episodes, ExitCode.COMPLETED)
        return ExitCode.COMPLETED
    log.info("stopped on signal at %d steps after a final checkpoint; exit %d", counters.steps,
             ExitCode.STOPPED)
    return ExitCode.STOPPED
