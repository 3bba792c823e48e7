"""LIBERO's goal predicates (On, In, Open, Close, TurnOn, TurnOff), batched, for any array module.

Each test is LIBERO's own (``libero/libero/envs/predicates``, ``object_states``, ``SiteObject``),
written once over arrays of a batch of simulations: numpy from ``mujoco.batch``, torch on the
device from MuJoCo Warp. Only operators and positional ``.all(-1)``/``.sum(-1)`` are used, which
numpy arrays and torch tensors share, so no array-module argument is needed.

- ``On(a, b)``, ``b`` an object: ``z_b <= z_a``, ``a`` and ``b`` touch, and their body origins are
  within 3 cm in xy. ``b`` a region site: ``a``'s origin, in the site's frame (LIBERO multiplies
  by the site's rotation matrix, not its transpose: kept), lies ``size_z - 5 mm .. size_z + 10 cm``
  above the site and within its half-sizes in xy; and ``a`` touches the site's parent object if it
  has one.
- ``In(a, site)``: ``a``'s origin inside the site's box, half-sizes ``|R size|``, 1 cm lower slack.
- ``Open``/``Close``/``TurnOn``/``TurnOff``: each joint's ``qpos`` against the object's range end
  (``Open`` and ``TurnOn``: any joint passes; ``Close`` and ``TurnOff``: every joint passes).

Contacts come from the ``contact`` sensors :func:`sims.libero.scene.build_model` adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco

ON_XY_TOLERANCE = 0.03  # m, LIBERO's ObjectState.check_ontop
UNDER_SLACK, UNDER_HEIGHT = 0.005, 0.10  # m, LIBERO's SiteObject.under
IN_Z_SLACK = 0.01  # m, LIBERO's SiteObject.in_box


@dataclass(frozen=True)
class Kinematics:
    """The arrays the predicates read, for N simulations (numpy or torch, one module throughout).

    Attributes:
        xpos: body positions [N, nbody, 3]; site_xpos: [N, nsite, 3]; site_xmat: [N, nsite, 9]
            or [N, nsite, 3, 3]; qpos: [N, nq]; sensordata: [N, nsensordata].
    """

    xpos: Any
    site_xpos: Any
    site_xmat: Any
    qpos: Any
    sensordata: Any


def _joint_test(q: Any, op: str, value: float) -> Any:
    return {"<": q < value, "<=": q <= value, ">": q > value, ">=": q >= value}[op]


class GoalPredicates:
    """A task's goal, compiled against a model's ids; :meth:`evaluate` tests it on a batch."""

    def __init__(self, goal: list[dict[str, Any]], model: mujoco.MjModel, contact_sensor: dict[tuple[str, str], int]):
        """Args: goal: the task's resolved goal (``LiberoTask.goal``); model; contact_sensor: the
        sensordata address of each contact pair (``LiberoLayout.contact_sensor``).

        Raises:
            ValueError: a predicate or argument form LIBERO's four suites do not use.
        """
        self.names = [f"{p['predicate']}({', '.join(p['args'])})" for p in goal]
        self._tests = [self._compile(p, model, contact_sensor) for p in goal]

    @staticmethod
    def _compile(pred: dict[str, Any], model: mujoco.MjModel, contacts: dict[tuple[str, str], int]) -> Any:
        kind = pred["predicate"]
        if kind in ("open", "close", "turnon", "turnoff"):
            rule = pred["joints"]
            adr, op, value, any_joint = list(rule["qpos_adr"]), rule["op"], rule["value"], kind in ("open", "turnon")

            def joints(k: Kinematics) -> Any:
                ok = _joint_test(k.qpos[:, adr], op, value)
                return ~((~ok).all(-1)) if any_joint else ok.all(-1)
            return joints
        a, b = pred["entities"]
        if a["kind"] != "body" or kind not in ("on", "in") or (kind == "in" and b["kind"] != "site"):
            raise ValueError(f"goal {kind}({', '.join(pred['args'])}) has a form the LIBERO suites do not use")
        body_a = model.body(a["body"]).id
        if b["kind"] == "body":
            body_b, touch = model.body(b["body"]).id, contacts[(b["body"], a["body"])]

            def on_object(k: Kinematics) -> Any:
                pa, pb = k.xpos[:, body_a], k.xpos[:, body_b]
                d = pa[:, :2] - pb[:, :2]
                return (pb[:, 2] <= pa[:, 2]) & (k.sensordata[:, touch] > 0) & ((d * d).sum(-1) < ON_XY_TOLERANCE**2)
            return on_object
        site, size = model.site(b["site"]).id, [float(s) for s in b["size"]]
        parent = contacts.get((b["parent_body"], a["body"])) if b["parent_body"] is not None else None

        def site_frame(k: Kinematics) -> tuple[Any, Any, Any]:
            mat = k.site_xmat[:, site].reshape((-1, 3, 3))
            return mat, k.site_xpos[:, site], k.xpos[:, body_a]

        if kind == "in":
            def inside(k: Kinematics) -> Any:
                mat, pos, pa = site_frame(k)
                half = abs(mat[:, :, 0] * size[0] + mat[:, :, 1] * size[1] + mat[:, :, 2] * size[2])  # |R @ size|
                lo, hi = pos - half, pos + half
                below = pa[:, 2] > lo[:, 2] - IN_Z_SLACK
                return (pa[:, :2] > lo[:, :2]).all(-1) & below & (pa < hi).all(-1)
            return inside

        def on_site(k: Kinematics) -> Any:
            mat, pos, pa = site_frame(k)
            delta = (mat * (pa - pos)[:, None, :]).sum(-1)  # R @ (a - site), as LIBERO writes it
            ok = (delta[:, 2] > size[2] - UNDER_SLACK) & (delta[:, 2] < size[2] + UNDER_HEIGHT)
            ok = ok & (abs(delta[:, 0]) < size[0]) & (abs(delta[:, 1]) < size[1])
            return ok & (k.sensordata[:, parent] > 0) if parent is not None else ok
        return on_site

    def evaluate(self, k: Kinematics) -> list[Any]:
        """Each predicate's truth, a list of bool arrays [N] (the goal holds where all are true)."""
        return [test(k) for test in self._tests]

    def success(self, k: Kinematics) -> Any:
        """The goal (the conjunction), bool [N]."""
        out = None
        for value in self.evaluate(k):
            out = value if out is None else out & value
        return out

