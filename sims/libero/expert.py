"""Scripted experts for LIBERO-Spatial (a bowl onto the plate), LIBERO-Object (an object into the
basket) and LIBERO-Goal's pick-and-place tasks (an object onto an object or a region), batched
over a :class:`sims.libero.sim.LiberoSim`.

A phase machine per simulation on the privileged state (body poses, geom boxes), acting through
LIBERO's action space (:class:`sims.libero.controller.PandaController`): settle, over the grasp
point, down, close, lift, carry over the place point, lower, open, up. The plan is made once per
episode, from the settled scene:

- **Grasp candidates** (:func:`rim_candidates`: the bowl's rim where the fingers' closing axis
  crosses it; :func:`top_candidates`: the object's top with the fingers across a side that fits
  the opening), with the hand's yaw (0 or a quarter turn
  about the vertical) and the grip depth. Each is scored by how much the hand's and the fingers'
  boxes at the grasp overlap other objects' collision boxes (a cabinet's top, a neighbour), then
  by reach from the shoulder; the least-overlapping, nearest one wins.
- **Heights from the corridor.** The hand travels to the grasp, and carries the object to the
  place point, above every collision box under its path (plus the hanging object), so it never
  sweeps through a cabinet or a basket wall; it descends and lifts vertically.
- **Closed-loop placing.** While carrying and lowering, the target is the place point plus the
  *current* grip-to-object offset, so an object that slipped in the fingers still lands on target.
- The hand's orientation is held (or turned to the planned yaw) by the rotation part of the action.
"""

from __future__ import annotations

from collections.abc import Callable

import mujoco
import numpy as np

from sims.backends import to_numpy
from sims.libero.controller import PandaController
from sims.libero.sim import LiberoSim
from sims.libero.suites import MAX_STEPS

HOVER = 0.08  # m above the grasp point before descending
LIFT = 0.08  # m lifted at least before carrying (more where the corridor needs it; high carries leave the reach)
CLEARANCE = 0.03  # m between the fingertips (or a held object's bottom) and a box under the path
HAND_MARGIN = 0.01  # m between the hand's hull and a box under it
CLOSE_STEPS, OPEN_STEPS = 8, 6
REACHED = 0.008  # m: a waypoint counts as reached
TURNED = 0.05  # rad: the hand's orientation counts as reached
DOWN_STEPS = 20  # the fingers may rest on a neighbour before reaching the grasp point: close anyway
LOWER_STEPS = 30  # the object may touch down before its target: open anyway
CARRY_STEPS = 60  # a carry that has not arrived by then is at the edge of the reach: lower from there
CARRY_SPEED = 0.6  # fraction of the largest action while holding (fast moves shake the object loose)
CARRY_ACCEL = 0.15  # the most the position action changes per step while holding (jerks shake it loose)
SLIP = 0.02  # m: the object moved this far in the hand since the grasp: it is no longer held as grasped
SETTLE_STEPS = 10  # LIBERO's evaluation waits 10 steps for the objects to settle
# Some initial states hold an object in the air (spatial/5's bowl lands tilted on the ramekin at
# step ~15): the plan waits until the object rests, at most SETTLE_MAX steps.
SETTLE_MAX, AT_REST = 30, 0.01  # steps; m/s and rad/s
PHASES = ("settle", "above", "down", "close", "lift", "carry", "lower", "open", "up", "done")
# The Panda hand's collision hull and open fingers relative to the grip site, fingers closing along
# local y (half-widths in x, y; z range), measured on the model: the hull's bottom is flat 2.4 cm
# above the grip site across its 21 cm width.
HAND_BOX = (0.045, 0.11, 0.022, 0.15)
FINGER_BOX = (0.015, 0.05, -0.014, 0.05)
ROBOT_PREFIXES = ("robot0_", "gripper0_", "mount0_")
NEGLIGIBLE_OVERLAP = 2e-6  # m^3 (2 cm^3): AABBs of rotated meshes overlap a little where nothing touches
SHOULDER_HEIGHT = 0.333  # m: the Panda's second joint above its base
# Beyond about 0.8 m from the shoulder the elbow straightens onto its joint limit and the
# least-squares step (which knows no limits) lets the hand sag: such grasps cost extra.
COMFORT_REACH, REACH_COST = 0.80, 3.0


def geom_boxes(m: mujoco.MjModel, d: mujoco.MjData, geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """World-axis-aligned bounding boxes (lo, hi) [G, 3] of ``geoms`` at ``d``'s pose."""
    mat = d.geom_xmat[geoms].reshape(-1, 3, 3)
    centre = d.geom_xpos[geoms] + np.einsum("gij,gj->gi", mat, m.geom_aabb[geoms, :3])
    half = np.einsum("gij,gj->gi", np.abs(mat), m.geom_aabb[geoms, 3:])
    return centre - half, centre + half


def _overlap(lo: np.ndarray, hi: np.ndarray, box_lo: np.ndarray, box_hi: np.ndarray) -> float:
    """Summed overlap volume of boxes [G, 3] with one box [3]."""
    ext = np.clip(np.minimum(hi, box_hi) - np.maximum(lo, box_lo), 0.0, None)
    return float(ext.prod(1).sum())


def _hand_boxes(grip: np.ndarray, yaw: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """The hand's and the fingers' boxes (lo, hi) at grip site position ``grip`` [3], the fingers
    closing along world y (yaw 0) or x (a quarter turn)."""
    out = []
    for hx, hy, zlo, zhi in (HAND_BOX, FINGER_BOX):
        half = np.array([hy, hx] if abs(yaw) > 1e-6 else [hx, hy])
        out.append((np.array([*(grip[:2] - half), grip[2] + zlo]), np.array([*(grip[:2] + half), grip[2] + zhi])))
    return out


def _corridor_top(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray, half: np.ndarray) -> float:
    """The highest top [m] of boxes (lo, hi) [G, 3] whose xy footprint meets a footprint of
    half-sizes ``half`` [2] (x, y) moved from ``a`` to ``b`` (xy); -inf where none does."""
    top = -np.inf
    for t in np.linspace(0.0, 1.0, 12):
        p = a[:2] + t * (b[:2] - a[:2])
        meets = ((lo[:, :2] < p + half) & (hi[:, :2] > p - half)).all(1)
        if meets.any():
            top = max(top, float(hi[meets, 2].max()))
    return top


def _half(box: tuple[float, float, float, float], yaw: float) -> np.ndarray:
    """The xy half-sizes [2] of a hand or finger box with the hand at ``yaw`` (0 or a quarter turn)."""
    return np.array([box[1], box[0]] if abs(yaw) > 1e-6 else [box[0], box[1]])


def _under_hand_top(lo: np.ndarray, hi: np.ndarray, grip: np.ndarray, yaw: float) -> float:
    """The highest top [m] of boxes (lo, hi) under the hand's footprint with the grip site at
    ``grip`` (xy); -inf where none is."""
    (hand_lo, hand_hi), _ = _hand_boxes(grip, yaw)
    under = ((lo[:, :2] < hand_hi[:2]) & (hi[:, :2] > hand_lo[:2])).all(1)
    return float(hi[under, 2].max()) if under.any() else -np.inf


def _rotation_error(target: np.ndarray, quat_wxyz: np.ndarray) -> np.ndarray:
    """World-frame axis-angle [3] turning orientation ``quat_wxyz`` into rotation matrix ``target``."""
    cur, tq = np.zeros(9), np.zeros(4)
    mujoco.mju_quat2Mat(cur, quat_wxyz)
    mujoco.mju_mat2Quat(tq, (target @ cur.reshape(3, 3).T).reshape(-1))
    vel = np.zeros(3)
    mujoco.mju_quat2Vel(vel, tq if tq[0] >= 0 else -tq, 1.0)
    return vel


Candidate = tuple[np.ndarray, float, float]  # grip site position [3], hand yaw [rad], cost [m of reach]
RIM_DEPTHS = (0.03, 0.018, 0.011)  # m below a bowl's rim top (its wall is 3.75 cm tall)
RIM_SHALLOW_COST = 0.5  # m of reach a centimetre less grip is worth avoiding
RIM_TURN_COST = 0.1  # m of reach: turning the hand a quarter near the base folds the arm onto joint limits
GRIP_BELOW_TOP = 0.025  # m below an object's top where the fingers close
MIN_GRIP = 0.012  # m above an object's bottom: the fingertips reach 1.4 cm below the grip site
OPENING = 0.066  # m: the widest side the open fingers take (their pads 6.6 cm apart)
SHIFTS = (-0.03, -0.015, 0.0, 0.015, 0.03)  # m along the side the fingers do not span
EDGE = 0.02  # m: a shifted grasp keeps this much of the object beyond the fingers' centre
TOP_TURN_COST = 0.05  # m of reach a quarter turn of the hand is worth avoiding


def rim_candidates(m: mujoco.MjModel, d: mujoco.MjData, bowl: int, geoms: np.ndarray) -> list[Candidate]:
    """Grasps of a bowl (body ``bowl``, collision ``geoms``) by its rim: the rim's ends along world
    y (yaw 0) and x (a quarter turn), one finger inside, at each of :data:`RIM_DEPTHS`. The rim is
    the ring of segments at the top in the bowl's own frame, so a tilted bowl is gripped where its
    rim really is."""
    local = (d.geom_xpos[geoms] - d.xpos[bowl]) @ d.xmat[bowl].reshape(3, 3)
    rim = geoms[local[:, 2] > local[:, 2].max() - 0.005]
    centre = d.geom_xpos[rim].mean(0)
    out = []
    for axis, yaw in ((1, 0.0), (0, np.pi / 2)):
        across = 1 - axis
        for side in (-1.0, 1.0):
            seg = rim[np.argmax(side * (d.geom_xpos[rim, axis] - centre[axis])
                                - np.abs(d.geom_xpos[rim, across] - centre[across]))]
            top = d.geom_xpos[seg, 2] + m.geom_size[seg, 2]
            for depth in RIM_DEPTHS:
                cost = (RIM_DEPTHS[0] - depth) * 100 * RIM_SHALLOW_COST + (RIM_TURN_COST if yaw else 0.0)
                out.append((np.array([d.geom_xpos[seg, 0], d.geom_xpos[seg, 1], top - depth]), yaw, cost))
    return out


def top_candidates(m: mujoco.MjModel, d: mujoco.MjData, obj: int, geoms: np.ndarray) -> tuple[list[Candidate], float]:
    """Grasps of an object (body ``obj``, collision ``geoms``) from above near its top, the fingers
    across a side that fits the opening, at the centre or shifted along the other side (a long box
    held off-centre keeps the hand off a neighbour); and the object's origin above its bottom [m]."""
    lo, hi = geom_boxes(m, d, geoms)
    lo, hi = lo.min(0), hi.max(0)
    centre = (lo + hi) / 2
    z = max(hi[2] - GRIP_BELOW_TOP, lo[2] + MIN_GRIP)
    width = hi - lo
    # Fingers across a side wider than the opening would wedge the object open-handed: only where
    # neither side fits (a diagonal box) the narrower one is tried.
    axes = [(axis, yaw) for axis, yaw in ((1, 0.0), (0, np.pi / 2)) if width[axis] <= OPENING]
    axes = axes or [min(((1, 0.0), (0, np.pi / 2)), key=lambda a: width[a[0]])]
    out = []
    for axis, yaw in axes:
        along = 1 - axis  # the side the fingers do not span
        room = max(width[along] / 2 - EDGE, 0.0)
        for shift in np.unique(np.clip(SHIFTS, -room, room)):
            grip = np.array([centre[0], centre[1], z])
            grip[along] += shift
            out.append((grip, yaw, (TOP_TURN_COST if yaw else 0.0) + abs(shift)))
    return out, float(d.xpos[obj, 2] - lo[2])


class PickPlaceExpert:
    """The phase machine shared by the LIBERO experts (see the module docstring); subclasses give
    the grasp candidates and the place point."""

    def __init__(self, sim: LiberoSim, obj_body: str):
        """Args: sim; obj_body: the body the expert picks (the goal's first argument)."""
        self.sim, self.ctl = sim, PandaController(sim.layout)
        m = sim.model
        self.obj = m.body(obj_body).id
        self._obj_dof = m.jnt_dofadr[m.body_jntadr[self.obj]] + np.arange(6)  # its free joint
        robot = np.array([m.body(b).name.startswith(ROBOT_PREFIXES) for b in range(m.nbody)])
        collide = (m.geom_contype > 0) | (m.geom_conaffinity > 0)
        self._scene_geoms = np.flatnonzero(collide & ~robot[m.geom_bodyid] & (m.body_rootid[m.geom_bodyid] != self.obj))
        self._obj_geoms = np.flatnonzero(collide & (m.body_rootid[m.geom_bodyid] == self.obj))
        self._shoulder = m.body("robot0_base").id
        n = sim.num_envs
        self.phase = np.zeros(n, np.int64)
        self.timer = np.zeros(n, np.int64)
        self.grasp = np.zeros((n, 3))  # the grip site's target at the grasp, in the object's frame
        self.grasp_world = np.zeros((n, 3))  # where the grip site closed
        self.hover = np.zeros(n)  # grip site height for the approach
        self.carry = np.zeros(n)  # grip site height for the carry
        self.lowest = np.zeros(n)  # the lowest grip site height over the place point (the hand rests above)
        self.rot = np.tile(np.eye(3), (n, 1, 1))  # the hand's target orientation
        self.held = np.zeros((n, 3))  # grip site minus object origin once grasped
        self.last = np.zeros((n, 3))  # the previous position action

    def reset(self) -> None:
        """Start every simulation's episode (call after ``sim.reset``): settle, then plan."""
        self.phase[:] = 0
        self.timer[:] = 0
        self.last[:] = 0.0

    # ------------------------------------------------------------------ subclasses
    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        """Grasp candidates for simulation ``i`` at its settled pose ``d``: (grip site position [3], yaw [rad], cost [m])."""
        raise NotImplementedError

    def place_points(self) -> np.ndarray:
        """Where the object's origin should be released, [N, 3] (current state)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ planning
    def _plan(self, i: int, eef: np.ndarray, quat: np.ndarray) -> None:
        """Choose simulation ``i``'s grasp and heights from its settled state (see module docstring)."""
        m = self.sim.model
        d = mujoco.MjData(m)
        d.qpos[:] = to_numpy(self.sim.qpos[i])
        mujoco.mj_kinematics(m, d)
        lo, hi = geom_boxes(m, d, self._scene_geoms)
        shoulder = d.xpos[self._shoulder] + np.array([0.0, 0.0, SHOULDER_HEIGHT])
        best, best_key = None, None
        for grip, yaw, cost in self.candidates(i, d):
            hit = sum(_overlap(lo, hi, blo, bhi) for blo, bhi in _hand_boxes(grip, yaw))
            reach = np.linalg.norm(grip - shoulder)
            key = (max(hit, NEGLIGIBLE_OVERLAP), reach + REACH_COST * max(reach - COMFORT_REACH, 0.0) + cost)
            if best_key is None or key < best_key:
                best, best_key = (grip, yaw), key
        grip, yaw = best
        self.grasp[i] = (grip - d.xpos[self.obj]) @ d.xmat[self.obj].reshape(3, 3)
        hand, fingers = _half(HAND_BOX, yaw), _half(FINGER_BOX, yaw)
        # Heights at which the fingertips, the hand's hull and the held object pass over what lies
        # under their own paths: to the grasp (turning on the way: both orientations' footprints),
        # then from the grasp to over the place point.
        turning = np.maximum(hand, _half(HAND_BOX, 0.0)), np.maximum(fingers, _half(FINGER_BOX, 0.0))
        self.hover[i] = max(grip[2] + HOVER, _corridor_top(lo, hi, eef, grip, turning[1]) + CLEARANCE - FINGER_BOX[2],
                            _corridor_top(lo, hi, eef, grip, turning[0]) + HAND_MARGIN - HAND_BOX[2])
        olo, ohi = geom_boxes(m, d, self._obj_geoms)
        olo, ohi = olo.min(0), ohi.max(0)
        hang = grip[2] - olo[2]  # the held object's bottom below the grip site
        shift = self.place_points()[i, :2] - d.xpos[self.obj, :2]  # the object's origin: grasp -> place
        centre = (olo[:2] + ohi[:2]) / 2
        self.carry[i] = max(grip[2] + LIFT,
                            _corridor_top(lo, hi, grip, grip[:2] + shift, hand) + HAND_MARGIN - HAND_BOX[2],
                            _corridor_top(lo, hi, centre, centre + shift, (ohi[:2] - olo[:2]) / 2) + CLEARANCE + hang)
        # A hand wider than the basket rests on its walls: lower only until the hand is just above them.
        held = np.append(grip[:2] + shift, grip[2])
        self.lowest[i] = _under_hand_top(lo, hi, held, yaw) - HAND_BOX[2] + HAND_MARGIN
        cur = np.zeros(9)
        mujoco.mju_quat2Mat(cur, quat)
        c, s = np.cos(yaw), np.sin(yaw)
        self.rot[i] = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ cur.reshape(3, 3)

    # ------------------------------------------------------------------ acting
    def act(self) -> np.ndarray:
        """Actions [N, 7] for the current state; advances each simulation's phase."""
        sim = self.sim
        eef = to_numpy(sim.proprio()["eef_pos"])
        quat = to_numpy(sim.field("xquat")[:, sim.layout.hand_body])
        obj = to_numpy(sim.field("xpos")[:, self.obj])
        obj_quat = to_numpy(sim.field("xquat")[:, self.obj])
        moving = np.abs(to_numpy(sim.qvel[:, self._obj_dof])).max(1) > AT_REST
        place = self.place_points()
        target, grip = eef.copy(), np.full(len(eef), -1.0)
        turn = np.zeros((len(eef), 3))
        for i, phase in enumerate(self.phase):
            name = PHASES[phase]
            if name == "settle":
                grip[i] = 0.0
                if self.timer[i] >= SETTLE_STEPS - 1 and (not moving[i] or self.timer[i] >= SETTLE_MAX - 1):
                    self._plan(i, eef[i], quat[i])
                    grip[i], self.timer[i] = -1.0, SETTLE_MAX  # planned: the phase ends this step
            else:
                turn[i] = _rotation_error(self.rot[i], quat[i])
            if name in ("above", "down"):  # the grasp follows the object while it still settles or slides
                rot = np.zeros(9)
                mujoco.mju_quat2Mat(rot, obj_quat[i])
                target[i] = obj[i] + rot.reshape(3, 3) @ self.grasp[i]
                if name == "above":
                    target[i, 2] = self.hover[i]
            elif name in ("close", "lift"):
                target[i], grip[i] = self.grasp_world[i], 1.0
                if name == "lift":
                    target[i, 2] = self.carry[i]
            elif name in ("carry", "lower"):
                # The place point plus the current grip-to-object offset in xy closes the loop on a
                # small slip; an object that fell out is not chased (the offset as grasped is kept).
                offset = eef[i] - obj[i]
                if np.linalg.norm(offset - self.held[i]) > SLIP:
                    offset = self.held[i]
                target[i, :2] = place[i, :2] + offset[:2]
                target[i, 2] = self.carry[i] if name == "carry" else max(place[i, 2] + self.held[i, 2], self.lowest[i])
                grip[i] = 1.0
            elif name in ("up", "done"):
                target[i, 2] = self.carry[i]
            self._advance(i, name, np.linalg.norm(target[i] - eef[i]), np.linalg.norm(turn[i]), eef[i], obj[i])
        action = np.zeros((len(eef), 7))
        holding = (grip > 0)[:, None]
        move = np.clip((target - eef) / self.ctl.output_max[:3], -CARRY_SPEED, CARRY_SPEED)
        move = np.where(holding, np.clip(move, self.last - CARRY_ACCEL, self.last + CARRY_ACCEL), move)
        action[:, :3] = np.where(holding, move, np.clip((target - eef) / self.ctl.output_max[:3], -1.0, 1.0))
        self.last = action[:, :3].copy()
        action[:, 3:6] = np.clip(turn / self.ctl.output_max[3:], -1.0, 1.0)
        action[:, 6] = grip
        return action

    def _advance(self, i: int, name: str, dist: float, turn: float, eef: np.ndarray, obj: np.ndarray) -> None:
        self.timer[i] += 1
        timed = {"settle": SETTLE_MAX, "close": CLOSE_STEPS, "open": OPEN_STEPS}
        limits = {"down": DOWN_STEPS, "lower": LOWER_STEPS, "carry": CARRY_STEPS}
        if name in timed:
            done = self.timer[i] >= timed[name]
        elif name == "done":
            done = False
        else:
            done = (dist < REACHED and (name != "above" or turn < TURNED)) or self.timer[i] >= limits.get(name, 1 << 30)
        if name == "down" and done:  # where the fingers close: held while closing and lifting
            self.grasp_world[i] = eef
        if name == "close" and done:  # how the hand holds the object (its height kept while lowering)
            self.held[i] = eef - obj
        if done:
            self.phase[i] += 1
            self.timer[i] = 0


class SpatialExpert(PickPlaceExpert):
    """LIBERO-Spatial: ``On(bowl, plate)``; grips the bowl's rim where the fingers' closing axis
    (world x or y) crosses it, one finger inside the bowl."""

    RELEASE = 0.01  # m: the bowl's origin is released this high above the plate's

    def __init__(self, sim: LiberoSim):
        """Raises: ValueError: the task's goal is not a single ``On(object, object)``."""
        goal = sim.task.goal
        if len(goal) != 1 or goal[0]["predicate"] != "on" or goal[0]["entities"][1]["kind"] != "body":
            raise ValueError(f"{sim.task.task_id} is not a pick-and-place-on-an-object task: goal {goal}")
        bowl, plate = (e["body"] for e in goal[0]["entities"])
        super().__init__(sim, bowl)
        self.plate = sim.model.body(plate).id

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        return rim_candidates(self.sim.model, d, self.obj, self._obj_geoms)

    def place_points(self) -> np.ndarray:
        plate = to_numpy(self.sim.field("xpos")[:, self.plate]).copy()
        plate[:, 2] += self.RELEASE
        return plate


class ObjectExpert(PickPlaceExpert):
    """LIBERO-Object: ``In(object, basket_contain_region)``; grips the object from above near its
    top, the fingers across its narrower side, and lets it go low over the region's centre."""

    DROP = 0.02  # m: the object's bottom is released this high above the region's floor

    def __init__(self, sim: LiberoSim):
        """Raises: ValueError: the task's goal is not a single ``In(object, region)``."""
        goal = sim.task.goal
        if len(goal) != 1 or goal[0]["predicate"] != "in" or goal[0]["entities"][1]["kind"] != "site":
            raise ValueError(f"{sim.task.task_id} is not a pick-and-place-in-a-region task: goal {goal}")
        obj, region = goal[0]["entities"]
        super().__init__(sim, obj["body"])
        self.site = sim.model.site(region["site"]).id
        self.region_half_z = float(region["size"][2])
        self.origin_height = np.zeros(sim.num_envs)  # the object's origin above its bottom, at the plan

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        out, self.origin_height[i] = top_candidates(self.sim.model, d, self.obj, self._obj_geoms)
        return out

    def place_points(self) -> np.ndarray:
        site = to_numpy(self.sim.field("site_xpos")[:, self.site]).copy()
        # The object's bottom DROP above the region's floor (its origin sits origin_height above it).
        site[:, 2] += -self.region_half_z + self.DROP + self.origin_height
        return site


class GoalExpert(PickPlaceExpert):
    """LIBERO-Goal's pick-and-place tasks, ``On(object, object or region)``: a bowl by its rim,
    anything else from above; released with its bottom just above the target's surface (the
    highest collision box of the target, or of the region's object, under the target point).
    Goal's other tasks (open a drawer, turn on the stove, push the plate, open-and-put-in) have
    no expert."""

    DROP = 0.01  # m: the object's bottom is released this high above the target's surface
    FOOTPRINT = 0.01  # m: half-size of the spot under the target point whose surface counts

    def __init__(self, sim: LiberoSim):
        """Raises: ValueError: the task's goal is not a single ``On(object, object or region)``."""
        goal = sim.task.goal
        if len(goal) != 1 or goal[0]["predicate"] != "on" or (goal[0]["entities"][1]["kind"] == "site"
                                                                and goal[0]["entities"][1]["parent_body"] is None):
            raise ValueError(f"{sim.task.task_id} is not a pick-and-place-on task (no Goal expert for it): "
                             f"goal {goal}")
        obj, target = goal[0]["entities"]
        super().__init__(sim, obj["body"])
        m = sim.model
        self.rim = "bowl" in obj["body"]
        self.site = m.site(target["site"]).id if target["kind"] == "site" else None
        self.target = m.body(target["body"]).id if self.site is None else None
        support = m.body(target["body"] if self.site is None else target["parent_body"]).id
        collide = (m.geom_contype > 0) | (m.geom_conaffinity > 0)
        self._support_geoms = np.flatnonzero(collide & (m.body_rootid[m.geom_bodyid] == m.body_rootid[support]))
        self.place_z = np.zeros(sim.num_envs)  # the object's origin when released

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        m = self.sim.model
        out, origin_height = top_candidates(m, d, self.obj, self._obj_geoms)
        if self.rim:
            out = rim_candidates(m, d, self.obj, self._obj_geoms)
        point = d.site_xpos[self.site] if self.site is not None else d.xpos[self.target]
        lo, hi = geom_boxes(m, d, self._support_geoms)
        under = ((lo[:, :2] < point[:2] + self.FOOTPRINT) & (hi[:, :2] > point[:2] - self.FOOTPRINT)).all(1)
        surface = hi[under, 2].max() if under.any() else point[2]
        self.place_z[i] = surface + self.DROP + origin_height
        return out

    def place_points(self) -> np.ndarray:
        xpos = self.sim.field("site_xpos")[:, self.site] if self.site is not None else self.sim.field("xpos")[:, self.target]
        point = to_numpy(xpos).copy()
        point[:, 2] = self.place_z
        return point


def expert_for(sim: LiberoSim) -> PickPlaceExpert:
    """The expert of the sim's suite.

    Raises:
        ValueError: a suite without an expert (10), or a Goal task that is not pick-and-place.
    """
    suite = sim.task.task_id.split("/")[0]
    experts = {"spatial": SpatialExpert, "object": ObjectExpert, "goal": GoalExpert}
    if suite not in experts:
        raise ValueError(f"no scripted expert for LIBERO suite {suite!r} ({sim.task.task_id}); experts exist for "
                         f"{', '.join(experts)}")
    return experts[suite](sim)


def run_episodes(sim: LiberoSim, state_index: np.ndarray, max_steps: int | None = None,
                 on_step: Callable[[], None] | None = None) -> np.ndarray:
    """Run the suite's expert from initial states ``state_index`` [N] for at most ``max_steps``
    (default: the suite's LIBERO limit, :data:`sims.libero.suites.MAX_STEPS`), calling ``on_step``
    after the reset and after every control step (to record frames); returns success at the end,
    bool [N]."""
    max_steps = MAX_STEPS[sim.task.task_id.split("/")[0]] if max_steps is None else max_steps
    sim.reset(state_index)
    expert = expert_for(sim)
    expert.reset()
    if on_step is not None:
        on_step()
    for _ in range(max_steps):
        sim.step(expert.ctl(sim, expert.act()))
        if on_step is not None:
            on_step()
        if (expert.phase == len(PHASES) - 1).all():
            break
    return to_numpy(sim.success())
