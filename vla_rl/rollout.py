"""Experience collection into ``[T, N]`` TensorDicts, with the time split simulate/render/infer.

:func:`collect_steps` (PPO) runs T decisions of N environments, carrying the observation
across iterations; :func:`collect_episodes` (GRPO) resets every environment and runs each until
its first episode ends. Both execute action chunks (``action`` ``[N, K, A]``) open-loop: the K
actions of a decision are sent one after another, rewards are summed until an episode ends, and
the decision counts as done if its episode ended at any of the K steps.

Fields of the ``[T, N]`` batch:

====================  ==========================  ==============================================
key                   shape / dtype               meaning
====================  ==========================  ==============================================
``obs``               TensorDict ``[T, N]``       observation acted on at step t
``action``            ``[T, N, (K,) A]`` float32  what ``policy.act`` returned
``log_prob``          ``[T, N]``                  log-probability of ``action`` at collection
``value``             ``[T, N]``                  V(obs_t) (PPO)
``next_value``        ``[T, N]``                  V(s_{t+1}); for a truncated episode V(final obs)
``reward``            ``[T, N]``                  summed reward of the decision
``terminated``        ``[T, N]`` bool             episode ended in a terminal state
``done``              ``[T, N]`` bool             terminated or truncated
``success``           ``[T, N]`` bool             task success at this step
``alive``             ``[T, N]`` bool             (GRPO) step belongs to the env's first episode
``valid``             ``[T, N]`` bool             (PPO with deferred restarts) step belongs to an episode
====================  ==========================  ==============================================

Where the batch lives (:func:`buffer_device`): on the env's device when the env yields tensors on
one (``env.backend=warp``: MuJoCo Warp on ``env.warp_device``), else on the host. When that device
is the policy's (``device`` = ``env.warp_device``), a step is device-resident: the policy acts on
the env's tensors, its action tensor goes to ``step_td`` as it is, and every field is written into
a ``[T, N]`` TensorDict preallocated on the device; GAE and the PPO update then read it there.
Nothing on the per-step path reads the device: which episodes were truncated (and so need a bootstrap
value) comes from the env's host bookkeeping (``env.host_done``, the flags ``sims`` computes on the host
before uploading them), the validity checks of the device arrays are deferred to the rollout's end
(``env.deferred_checks``, one read), and a chunk's final observations are merged with ``torch.where``.
With ``terminate_on_success`` the host would need each step's success to restart the episodes it ended; the
loop instead runs inside the env's ``deferred_restarts``: an episode ended at success keeps stepping, unread (its
steps have ``valid`` False and are dropped by :func:`valid_steps`), until the loop asks for its restart, at most
:data:`END_CHECKS` times per rollout (each one read). An env without host flags costs one read per step ("was an
episode truncated"). A ``sims`` env renders each
world once per step when no critic reads the final observations' frames (:func:`frames_for_critic`). Per iteration,
:func:`account` reads the ``[T, N]`` rewards and flags on the host for episode statistics and
reward scaling (``vla_rl.host_syncs`` counts these reads). GRPO's loop (:func:`collect_first_episodes`) runs inside
the env's ``first_episodes`` (no episode restarts, so success is not read back to decide restarts) and asks
whether every episode has ended every step on the host, at most :data:`END_CHECKS` times per episode limit on a
device.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from tensordict import TensorDict
from torch import nn

from policies import RunningNorm
from vla_rl.host_syncs import host_side

#: How many times per episode limit the GRPO loop asks a device-resident env whether every episode has ended, and
#: per rollout the PPO loop reads which episodes ended at success to restart them (deferred restarts).
END_CHECKS = 8


@dataclass
class Timer:
    """Seconds spent per phase; ``render`` comes from the env's ``timings`` counter when it has one.

    On a GPU a phase's launches return before their work is done, so its seconds mean little unless
    the clock waits for the device: with ``sync_device`` (a CUDA device) :meth:`now` synchronises it
    first, and so does the env's render timer (``timing_sync``); one wait per phase boundary, so
    only a measurement asks for it."""

    seconds: dict[str, float] = field(default_factory=lambda: {"simulate": 0.0, "render": 0.0, "infer": 0.0})
    sync_device: torch.device | None = None

    def add(self, key: str, seconds: float) -> None:
        """Accumulate ``seconds`` under ``key``."""
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def now(self) -> float:
        """``time.perf_counter()``, after the device's queued work when ``sync_device`` is a CUDA device."""
        if self.sync_device is not None and self.sync_device.type == "cuda":
            torch.cuda.synchronize(self.sync_device)
        return time.perf_counter()

    def sync_env(self, env: Any) -> None:
        """Have ``env``'s own phase timers (its render seconds) wait for the device as :meth:`now` does."""
        if hasattr(env, "timing_sync"):
            env.timing_sync = self.now if self.sync_device is not None else None


@dataclass
class EpisodeResult:
    """One finished episode: its task and instruction indices (-1: unknown), return, length and success."""

    task: int
    instruction: int
    ret: float
    length: int
    success: bool


@dataclass
class EpisodeStats:
    """Running return, length and success of each environment's current episode, and finished ones.

    The one episode bookkeeping of training (:func:`account`) and evaluation
    (``vla_rl.evaluate.run_episodes``). With ``task_names`` (more than one task) the summary also
    holds each task's success rate.
    """

    ret: torch.Tensor
    length: torch.Tensor
    succeeded: torch.Tensor
    task_names: tuple[str, ...] = ()
    finished: list[EpisodeResult] = field(default_factory=list)
    """Each episode finished (and kept) since the last summary."""

    @classmethod
    def zeros(cls, num_envs: int, task_names: Sequence[str] = ()) -> EpisodeStats:
        """Fresh statistics for ``num_envs`` environments."""
        return cls(torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.int64),
                   torch.zeros(num_envs, dtype=torch.bool), tuple(task_names))

    def record(self, reward: torch.Tensor, success: torch.Tensor, done: torch.Tensor, steps: int | torch.Tensor,
               task: torch.Tensor | None = None, instruction: torch.Tensor | None = None,
               keep: torch.Tensor | None = None) -> None:
        """Add one decision's reward (all ``[N]``; ``steps`` control steps, per env or for all; ``task``/``instruction`` the indices of each env's
        episode); close the episodes that ended, keeping in ``finished`` those where ``keep`` (default: all)."""
        self.ret += reward
        self.length += steps
        self.succeeded |= success
        closing = done if keep is None else done & keep
        for i in torch.nonzero(closing).flatten().tolist():
            self.finished.append(EpisodeResult(
                -1 if task is None else int(task[i]), -1 if instruction is None else int(instruction[i]),
                float(self.ret[i]), int(self.length[i]), bool(self.succeeded[i])))
        self.ret[done] = 0.0
        self.length[done] = 0
        self.succeeded[done] = False

    def add_episode(self, ret: float, length: int, success: bool, task: int = -1) -> None:
        """Count one finished episode (``task``: its index in ``task_names``, -1 unknown)."""
        self.finished.append(EpisodeResult(task, -1, ret, length, success))

    def pop_summary(self) -> dict[str, float]:
        """Mean return, length and success of the episodes finished since the last call, and
        ``episode_success/<task>`` of each task that finished one."""
        done, self.finished = self.finished, []
        if not done:
            return {}
        n = len(done)
        out = {
            "episode_return": sum(d.ret for d in done) / n,
            "episode_length": sum(d.length for d in done) / n,
            "episode_success": sum(d.success for d in done) / n,
            "episodes": float(n),
        }
        if len(self.task_names) > 1:
            for index, name in enumerate(self.task_names):
                of_task = [d.success for d in done if d.task == index]
                if of_task:
                    out[f"episode_success/{name}"] = sum(of_task) / len(of_task)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The running tensors (finished episodes are logged each iteration, not saved)."""
        return {"ret": self.ret.clone(), "length": self.length.clone(), "succeeded": self.succeeded.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.ret, self.length, self.succeeded = state["ret"].clone(), state["length"].clone(), state["succeeded"].clone()


class RewardScaler:
    """Divide rewards by the running standard deviation of the discounted return.

    The reward normalisation of SB3's ``VecNormalize`` and gymnasium's ``NormalizeReward``:
    ``G <- gamma * G + r`` per environment (reset at episode ends), the running variance of ``G``
    is tracked, and ``r / sqrt(var + eps)`` (clipped to ``[-clip, clip]``) is what PPO learns from.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.ret = torch.zeros(num_envs, dtype=torch.float64)
        self.norm = RunningNorm((), clip=None)

    def __call__(self, reward: torch.Tensor, done: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Scale one step's rewards ``[N]`` and update the statistics from the environments where ``valid`` (the
        others step no episode: deferred restarts)."""
        ret = self.ret * self.gamma + reward.double()
        self.ret = torch.where(valid, ret, self.ret)
        if valid.any():
            self.norm.update(ret[valid])
        self.ret[done] = 0.0
        scaled = reward.double() / torch.sqrt(self.norm.var + self.eps)
        return scaled.clamp(-self.clip, self.clip).to(reward.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Running return and statistics, for checkpoints."""
        return {"ret": self.ret.clone(), "norm": self.norm.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.ret = state["ret"].clone()
        self.norm.load_state_dict(state["norm"])


def _env_seconds(env: Any) -> dict[str, float]:
    timings = getattr(env, "timings", None)
    return dict(timings) if timings else {}


def _host_done(env: Any) -> tuple[Any, Any] | None:
    """The last step's ``(terminated, truncated)`` as the env's host bookkeeping holds them (numpy [N]), or None."""
    return getattr(env, "host_done", None)


def step_frames(env: Any, action: torch.Tensor, frames: bool) -> TensorDict:
    """``env.step_td(action)``, drawing no frames unless ``frames`` where the env can skip them (``draw_frames``)
    and nothing reads the frames of its final observations (``final_frames`` off): an open-loop chunk's inner steps,
    whose observations only carry episode ends, cost the physics alone."""
    if frames or not hasattr(env, "draw_frames") or env.final_frames:
        return env.step_td(action)
    env.draw_frames = False
    try:
        return env.step_td(action)
    finally:
        env.draw_frames = True


def env_step(env: Any, action: torch.Tensor, timer: Timer, frames: bool = True) -> TensorDict:
    """Execute one decision (one action, or a chunk ``[N, K, A]`` open-loop) and time it; a chunk's inner steps
    draw no frames (:func:`step_frames`), nor does its last with ``frames`` off.

    Returns the env's step TensorDict ``[N]`` where, for chunks, ``reward`` is summed up to the
    end of each env's episode, ``terminated``/``truncated``/``success`` are or-ed over the chunk,
    and ``final_observation`` is the one at the episode's end.
    """
    return env_step_flags(env, action, timer, frames)[0]


def env_step_flags(env: Any, action: torch.Tensor, timer: Timer, frames: bool = True) -> tuple[TensorDict, Any]:
    """:func:`env_step`, and the decision's episode ends as the env's host bookkeeping holds them
    (``env.host_done``: numpy bool [N] ``(terminated, truncated)`` or-ed over a chunk's first episode; None where
    the env keeps none): read without touching the device."""
    chunk = action.unsqueeze(1) if action.dim() == 2 else action
    last = chunk.shape[1] - 1
    before = _env_seconds(env)
    start = timer.now()
    out = step_frames(env, chunk[:, 0].contiguous(), frames and last == 0)
    host = _host_done(env)
    for k in range(1, chunk.shape[1]):
        step = step_frames(env, chunk[:, k].contiguous(), frames and k == last)
        live = ~(out["terminated"] | out["truncated"])
        out["reward"] = out["reward"] + step["reward"] * live
        out["success"] = out["success"] | (step["success"] & live)
        for key in ("terminated", "truncated"):
            out[key] = out[key] | (step[key] & live)
        newly = live & (step["terminated"] | step["truncated"])
        step_host = _host_done(env)
        if host is None or step_host is None:
            host = None
        if host is None or (step_host[0] | step_host[1]).any():  # a where, not a masked copy: no device read
            out["final_observation"] = step["final_observation"].apply(
                lambda new, old, newly=newly: torch.where(newly.view(-1, *[1] * (new.dim() - 1)), new, old),
                out["final_observation"])
        if host is not None:
            live_host = ~(host[0] | host[1])
            host = (host[0] | (step_host[0] & live_host), host[1] | (step_host[1] & live_host))
        out["observation"] = step["observation"]
    elapsed = timer.now() - start
    after = _env_seconds(env)
    render = after.get("render", 0.0) - before.get("render", 0.0)
    timer.add("render", render)
    timer.add("simulate", elapsed - render)
    return out, host


def buffer_device(env: Any) -> torch.device:
    """Where a collected batch lives: the device of the env's tensors (``env.device``), else the host."""
    device = getattr(env, "device", None)
    return torch.device("cpu") if device is None else torch.device(device)


def _allocate(record: TensorDict, steps: int) -> TensorDict:
    """An uninitialised ``[steps, N]`` TensorDict with ``record``'s keys, dtypes and devices."""
    return record.apply(lambda x: torch.empty((steps, *x.shape), dtype=x.dtype, device=x.device),
                        batch_size=[steps, *record.batch_size])


@dataclass
class Decision:
    """The policy's answer to one stage's request, as tensors on the buffer's device.

    Attributes:
        action: ``[n, (K,) A]``, or ``None`` for a values-only request.
        log_prob: ``[n]``, or ``None`` for a values-only request.
        value: ``[n]`` values of the observation.
        bootstrap_value: ``[m]`` values of the truncated episodes' final observations sent along.
        version: weights version that answered (a server's), or ``None`` in process.
    """

    action: torch.Tensor | None
    log_prob: torch.Tensor | None
    value: torch.Tensor
    bootstrap_value: torch.Tensor
    version: int | None = None


class PolicyLink(Protocol):
    """How the collection loop reaches the policy: a request per stage, answered later.

    ``ask`` returns a handle at once (a remote server answers while the loop steps the other
    stages); ``wait`` blocks for its :class:`Decision`. ``timer_key`` names the seconds spent in
    both (``infer`` in process, ``wait`` when inference runs elsewhere).
    """

    timer_key: str

    def ask(self, stage: int, obs: TensorDict, bootstrap_obs: TensorDict | None, value_only: bool) -> Any: ...

    def wait(self, handle: Any) -> Decision: ...


class LocalPolicyLink:
    """The policy of this process, answering each request when asked.

    Args:
        policy: actor-critic with ``act`` and ``value``.
        device: the policy's device.
        here: the buffer's device (:func:`buffer_device`); answers are moved there (a no-op when equal).
    """

    timer_key = "infer"

    def __init__(self, policy: nn.Module, device: torch.device, here: torch.device) -> None:
        self.policy, self.device, self.here = policy, device, here

    def ask(self, stage: int, obs: TensorDict, bootstrap_obs: TensorDict | None, value_only: bool) -> Decision:
        """Values of ``bootstrap_obs`` first, then an action for ``obs`` (or its values only)."""
        with torch.no_grad():
            bootstrap = (torch.zeros(0, device=self.here) if bootstrap_obs is None
                         else self.policy.value(bootstrap_obs.to(self.device)).to(self.here))
            if value_only:
                return Decision(None, None, self.policy.value(obs.to(self.device)).to(self.here), bootstrap)
            out = self.policy.act(obs.to(self.device))
        return Decision(out["action"].to(self.here), out["log_prob"].to(self.here), out["value"].to(self.here), bootstrap)

    def wait(self, handle: Decision) -> Decision:
        """The answer computed at :meth:`ask`."""
        return handle


def _timed(timer: Timer, key: str, fn: Any, *args: Any) -> Any:
    start = timer.now()
    result = fn(*args)
    timer.add(key, timer.now() - start)
    return result


def _record(obs: TensorDict, decision: Decision, step: TensorDict, truncated: torch.Tensor) -> TensorDict:
    fields = {
        "obs": obs,
        "action": decision.action,
        "log_prob": decision.log_prob,
        "value": decision.value,
        "bootstrap": torch.zeros_like(decision.value),
        "reward": step["reward"],
        "terminated": step["terminated"],
        "truncated": truncated,
        "done": step["terminated"] | step["truncated"],
        "success": step["success"],
    }
    if decision.version is not None:
        fields["version"] = torch.full_like(decision.value, decision.version, dtype=torch.int64)
    return TensorDict(fields, batch_size=[obs.batch_size[0]])


def _enter_rollout(scope: contextlib.ExitStack, env: Any, timer: Timer, *blocks: str) -> None:
    """Open a rollout's blocks of ``env`` in ``scope``: its render timer synchronised with ``timer``, the env's
    ``blocks`` it has (``first_episodes``: no restarts), and its ``deferred_checks`` (validity checks of device
    arrays read once, at the rollout's end)."""
    timer.sync_env(env)
    for block in (*blocks, "deferred_checks"):
        if hasattr(env, block):
            scope.enter_context(getattr(env, block)())


def collect_stages(
    envs: list[Any], link: PolicyLink, obs: list[TensorDict], steps: int, timer: Timer
) -> tuple[TensorDict, list[TensorDict]]:
    """Run ``steps`` decisions of every environment of every stage (the one PPO collection loop).

    One request per stage is in flight: while the policy answers stage ``s``, the loop steps the
    other stages, so with a remote policy and ``P >= 2`` stages inference hides behind simulation.
    The values of step t's truncated final observations travel with step t+1's request; the last
    request asks values only, V(obs_T).

    Args:
        envs: the P stages' vector envs (``n_s`` environments each).
        link: where the policy answers (:class:`LocalPolicyLink` in process, the fleet's server link).
        obs: per stage, the observation ``[n_s]`` to act on first.
        steps: decisions T per environment.
        timer: accumulates simulate/render seconds and ``link.timer_key``.

    Returns:
        The batch ``[T, sum n_s]`` (stages side by side; see the module docstring; raw rewards,
        ``version`` when the link reports one) and each stage's observation to act on next.
    """
    stages = range(len(envs))
    obs = list(obs)
    batches: list[TensorDict | None] = [None for _ in stages]
    truncated_prev: list[torch.Tensor | None] = [None for _ in stages]
    check_every = max(1, -(-steps // END_CHECKS))
    with contextlib.ExitStack() as scope:
        for env in envs:
            _enter_rollout(scope, env, timer, "deferred_restarts")
        pending = [link.ask(s, obs[s], None, False) for s in stages]
        for t in range(steps):
            for s in stages:
                decision = _timed(timer, link.timer_key, link.wait, pending[s])
                if t:
                    _fill_bootstrap(batches[s][t - 1], truncated_prev[s], decision)
                ended = getattr(envs[s], "ended", None)  # before the step: its episode is over (deferred restarts)
                valid = None if ended is None else ~ended
                step, host = env_step_flags(envs[s], decision.action, timer)
                truncated = step["truncated"] & ~step["terminated"]
                record = _record(obs[s], decision, step, truncated)
                if valid is not None:
                    record["valid"] = valid
                    if (t + 1) % check_every == 0 and t < steps - 1:  # the block's end asks after the last step
                        envs[s].request_restarts()
                host_truncated = None if host is None else host[1] & ~host[0]
                batches[s] = _allocate(record, steps) if batches[s] is None else batches[s]
                batches[s][t] = record
                obs[s] = step["observation"]
                truncated_prev[s], final = _truncated_rows(step, truncated, host_truncated)
                pending[s] = _timed(timer, link.timer_key, link.ask, s, obs[s], final, t == steps - 1)
    for s in stages:
        decision = _timed(timer, link.timer_key, link.wait, pending[s])
        _fill_bootstrap(batches[s][steps - 1], truncated_prev[s], decision)
        batch = batches[s]
        # V(s_{t+1}) is the next step's value, V(obs_T) after the last step, V(final obs) where truncated.
        following = torch.cat([batch["value"][1:], decision.value[None]], dim=0)
        batch["next_value"] = torch.where(batch["truncated"], batch.pop("bootstrap"), following)
    return (batches[0] if len(envs) == 1 else torch.cat(batches, dim=1)), obs


def _truncated_rows(step: TensorDict, truncated: torch.Tensor, host: Any) -> tuple[torch.Tensor | None, Any]:
    """Which rows were truncated (a long index where the env's host flags tell, else the bool mask)
    and their final observations (None: none). With host flags nothing is read from the device."""
    if host is None:  # the env keeps no host flags: one read of the device's
        return (truncated, step["final_observation"][truncated]) if truncated.any() else (None, None)
    if not host.any():
        return None, None
    rows = torch.as_tensor(host.nonzero()[0], device=truncated.device)
    return rows, step["final_observation"][rows]


def _fill_bootstrap(record: TensorDict, truncated: torch.Tensor | None, decision: Decision) -> None:
    """Write the values of a step's truncated final observations (rows of :func:`_truncated_rows`) into its record."""
    if truncated is not None:
        record["bootstrap"][truncated] = decision.bootstrap_value


def collect_steps(
    env: Any,
    policy: nn.Module,
    obs: TensorDict,
    steps: int,
    timer: Timer,
    device: torch.device,
) -> tuple[TensorDict, TensorDict]:
    """Run ``steps`` decisions of every environment with ``policy`` in process (PPO collection).

    :func:`collect_stages` with one stage and this process's policy.

    Args:
        env: Vector env with the TensorDict view.
        policy: Actor-critic with ``act`` and ``value``.
        obs: Observation ``[N]`` to act on first (carried over from the previous iteration).
        steps: Decisions T per environment.
        timer: Accumulates simulate/render/infer seconds.
        device: Device of the policy.

    Returns:
        The batch ``[T, N]`` on :func:`buffer_device` (see module docstring; raw rewards) and the
        observation to act on next.
    """
    frames_for_critic(env, policy)
    link = LocalPolicyLink(policy, device, buffer_device(env))
    batch, (next_obs,) = collect_stages([env], link, [obs], steps, timer)
    return batch, next_obs


def frames_for_critic(env: Any, policy: nn.Module | None) -> None:
    """Tell a ``sims`` env (``final_frames``) whether the final observations it hands on need their frames: only
    when ``policy``'s critic (None: no critic reads them) may read a frame key (``env.FRAME_KEYS``); without
    them a step renders each world once (the device renderer: one pass instead of two on a step with resets)."""
    if not hasattr(env, "final_frames"):
        return
    keys = None if policy is None else getattr(policy, "critic_obs_keys", None)
    env.final_frames = policy is not None and (keys is None or bool(set(keys) & set(env.FRAME_KEYS)))


def account(batch: TensorDict, stats: EpisodeStats, reward_scaler: RewardScaler | None) -> None:
    """Episode bookkeeping of a collected ``[T, N]`` batch, whichever collector produced it.

    Records each step into ``stats`` (raw rewards) and, with a ``reward_scaler``, replaces
    ``batch["reward"]`` by the scaled rewards PPO learns from, step by step in time order.
    """
    chunk = batch["action"].shape[2] if batch["action"].dim() == 4 else 1
    # The statistics and the scaler live on the host: one read of [T, N] per iteration, not per step.
    host = batch.select("reward", "success", "done", *(["valid"] if "valid" in batch else [])).to("cpu")
    task = batch["obs", "task"].to("cpu") if ("obs", "task") in batch.keys(True) else None
    scaled = []
    with host_side():
        # The steps of an ended episode before its restart (deferred restarts: ``valid`` False) belong to none.
        valid = host["valid"] if "valid" in host else torch.ones_like(host["done"])
        reward, success, done = host["reward"] * valid, host["success"] & valid, host["done"] & valid
        steps = chunk * valid.long()
        for t in range(batch.batch_size[0]):
            stats.record(reward[t], success[t], done[t], steps[t], None if task is None else task[t])
            if reward_scaler is not None:
                scaled.append(reward_scaler(host["reward"][t], done[t], valid[t]))
    if reward_scaler is not None:
        batch["reward"] = torch.stack(scaled).to(batch["reward"].device)


def valid_steps(batch: TensorDict, *keys: str) -> TensorDict:
    """``batch``'s ``keys`` flattened to ``[M]``: every step of the ``[T, N]`` batch, or with deferred restarts
    (``valid``) the steps that belong to an episode (one read of the device for their index)."""
    flat = batch.select(*keys).reshape(-1)
    if "valid" not in batch:
        return flat
    return flat[batch["valid"].reshape(-1).nonzero().squeeze(1)]


class LocalCollector:
    """The in-process collector: one vector env stepped in this process.

    The trainer talks to every collector through this surface (the Ray fleet of
    ``vla_rl.fleet`` offers the same): ``num_envs``, ``instructions``, ``task_names``,
    ``single_action_space``, ``max_episode_steps``, ``reset(seed)``, ``collect(policy, steps, timer)``,
    ``get_state()``/``set_state()``, ``metrics()`` and ``close()``.

    Args:
        env: A vector env with the TensorDict view.
        device: Device of the policy.
    """

    def __init__(self, env: Any, device: torch.device) -> None:
        self.env = env
        self.device = device
        self.num_envs = env.num_envs
        self.instructions = list(env.instructions)
        self.task_names = list(env.task_names)
        self.single_action_space = env.single_action_space
        self.max_episode_steps: int | None = getattr(env, "max_episode_steps", None)
        self.obs: TensorDict | None = None
        self._warned_no_snapshot = False

    def reset(self, seed: int | None) -> TensorDict:
        """Reset every environment; returns (and carries) the first observation ``[N]``."""
        self.obs = self.env.reset_td(seed=seed)
        return self.obs

    def collect(self, policy: nn.Module, steps: int, timer: Timer) -> TensorDict:
        """``steps`` decisions of PPO experience, continuing from the carried observation."""
        if self.obs is None:
            raise RuntimeError("LocalCollector.collect before reset(seed)")
        batch, self.obs = collect_steps(self.env, policy, self.obs, steps, timer, self.device)
        return batch

    def collect_episodes(
        self, policy: nn.Module, seed: int | None, max_decisions: int | None, timer: Timer
    ) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
        """GRPO experience: see :func:`collect_episodes`."""
        return collect_episodes(self.env, policy, seed, max_decisions, timer, self.device)

    def get_state(self) -> dict[str, Any]:
        """The environments' state and the carried observation.

        An environment that cannot snapshot (a gymnasium ``AsyncVectorEnv``: its environments live in
        other processes) is stored as ``None``, with a warning the first time, since resuming it
        starts fresh episodes.
        """
        try:
            env_state = self.env.get_state()
        except NotImplementedError as exc:
            if not self._warned_no_snapshot:
                warnings.warn(f"checkpoints hold no environment state ({exc}); a resumed run starts fresh "
                              "episodes and is not bit-identical (env.vectorization=sync can snapshot)", stacklevel=2)
                self._warned_no_snapshot = True
            env_state = None
        return {"env": env_state, "obs": None if self.obs is None else self.obs.to_dict()}

    def set_state(self, state: dict[str, Any], reset_seed: int) -> None:
        """Restore :meth:`get_state`'s result; without an env snapshot, reset with ``reset_seed`` and warn."""
        if state["env"] is None:
            warnings.warn(
                f"the checkpoint holds no environment state ({type(self.env).__name__} cannot snapshot); "
                "environments restart from fresh episodes, so this continuation is not bit-identical",
                stacklevel=2,
            )
            self.reset(reset_seed)
            return
        self.env.set_state(state["env"])
        # Checkpoints load onto the host; the carried observation goes back where the env's tensors live.
        self.obs = None if state["obs"] is None else TensorDict.from_dict(
            state["obs"], batch_size=[self.num_envs]).to(buffer_device(self.env))

    def metrics(self) -> dict[str, float]:
        """Collector-specific metrics (none in process)."""
        return {}

    def close(self) -> None:
        """Close the environment."""
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def collect_episodes(
    env: Any,
    policy: nn.Module,
    seed: int | None,
    max_decisions: int | None,
    timer: Timer,
    device: torch.device,
) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """Reset all environments and run each until its first episode ends (GRPO collection).

    Args:
        env: Vector env with the TensorDict view (with ``group_size`` G for GRPO).
        policy: Policy with ``act``.
        seed: Seed of this reset (new initial states per iteration), or ``None`` to continue the env's RNG.
        max_decisions: Upper bound on decisions (the episode limit); ``None``: until every episode
            has ended (the environment must end them itself, e.g. by a time limit).
        timer: Accumulates simulate/render/infer seconds.
        device: Device of the policy.

    Returns:
        The batch ``[T, N]`` with ``alive``, the episode return ``[N]`` and episode success ``[N]``,
        all on :func:`buffer_device` (T is known only at the end, so the steps are stacked).
    """
    frames_for_critic(env, None)  # GRPO bootstraps from no final observation
    link = LocalPolicyLink(policy, device, buffer_device(env))
    batch, _ = collect_first_episodes(env, link, env.reset_td(seed=seed), max_decisions, timer)
    return (batch, *episode_outcome(batch))


def collect_first_episodes(
    env: Any, link: PolicyLink, obs: TensorDict, max_decisions: int | None, timer: Timer, *,
    stop_when_ended: bool = True,
) -> tuple[TensorDict, TensorDict]:
    """The one GRPO collection loop: act until each environment's current episode has ended.

    Args:
        env: vector env whose episodes start now (just reset), ``n`` environments.
        link: where the policy answers (:class:`LocalPolicyLink` in process, the fleet's server link).
        obs: the first observation ``[n]``.
        max_decisions: upper bound on decisions; ``None``: until every episode has ended.
        timer: accumulates simulate/render seconds and ``link.timer_key``.
        stop_when_ended: stop as soon as every episode has ended; ``False`` runs all ``max_decisions``
            (a fleet shard: the server batches every shard's requests, so none may stop alone).

    Returns:
        The batch ``[T, n]`` with ``obs``, ``action``, ``log_prob``, ``reward``, ``success``, ``alive``
        (the step belongs to the first episode; ``version`` when the link reports one), and the
        observation after the last step.
    """
    if max_decisions is None and not stop_when_ended:
        raise ValueError("stop_when_ended=False needs max_decisions (the episode limit)")
    alive = torch.ones(env.num_envs, dtype=torch.bool, device=buffer_device(env))
    every = _end_check_interval(env, max_decisions) if stop_when_ended else None
    records = []
    with contextlib.ExitStack() as scope:
        _enter_rollout(scope, env, timer, "first_episodes")
        while max_decisions is None or len(records) < max_decisions:
            decision = _timed(timer, link.timer_key, link.wait,
                              _timed(timer, link.timer_key, link.ask, 0, obs, None, False))
            step = env_step(env, decision.action, timer)
            fields = {"obs": obs, "action": decision.action, "log_prob": decision.log_prob, "reward": step["reward"],
                      "success": step["success"], "alive": alive.clone()}
            if decision.version is not None:
                fields["version"] = torch.full_like(alive, decision.version, dtype=torch.int64)
            records.append(TensorDict(fields, batch_size=[env.num_envs]))
            alive &= ~(step["terminated"] | step["truncated"])
            obs = step["observation"]
            if every is not None and len(records) % every == 0 and not alive.any():
                break
    return torch.stack(records, dim=0), obs


def _end_check_interval(env: Any, max_decisions: int | None) -> int:
    """Decisions between the GRPO loop's reads of "has every episode ended": every decision where that read
    costs nothing (the env's arrays on the host) or no limit is known, else :data:`END_CHECKS` reads per episode
    limit (each a device sync; at most ``interval - 1`` decisions run past the last end, unread)."""
    if getattr(env, "device", None) is None or max_decisions is None:
        return 1
    return max(1, -(-max_decisions // END_CHECKS))


def episode_outcome(batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each environment's first-episode return ``[N]`` and success ``[N]`` from a ``[T, N]`` episode batch."""
    alive = batch["alive"]
    returns = torch.zeros(batch.batch_size[1], device=alive.device)
    success = torch.zeros_like(alive[0])
    for t in range(batch.batch_size[0]):  # in time order: the same float sums as accumulating while stepping
        returns += batch["reward"][t] * alive[t]
        success |= batch["success"][t] & alive[t]
    return returns, success
