"""Scripted experts for LIBERO-Spatial (a bowl onto the plate), LIBERO-Object (an object into the
basket), LIBERO-Goal (an object onto an object or a region; a drawer opened; the stove turned
on; the bowl put in the top drawer) and LIBERO-10 (those, one after another), batched over a
:class:`sims.libero.sim.LiberoSim`.

A phase machine per simulation on the privileged state (body poses, geom boxes), acting through
LIBERO's action space (:class:`sims.libero.controller.PandaController`): settle, over the grasp
point, down, close, lift, carry over the place point, lower, open, up. The plan is made once per
episode, from the settled scene:

- **Grasp candidates** (:func:`rim_candidates`: the bowl's rim where the fingers' closing axis
  crosses it; :func:`top_candidates`: the object's top with the fingers across a side that fits
  the opening), with the hand's yaw (0 or a quarter turn
  about the vertical) and the grip depth. Those the arm can reach (:func:`wrist_reach`) go first;
  then each is scored by how much the hand's and the fingers' boxes at the grasp overlap other
  objects' collision boxes (a cabinet's top, a neighbour), then by reach from the shoulder; the
  least-overlapping, nearest one wins.
- **Heights from the corridor.** The hand travels to the grasp, and carries the object to the
  place point, above every collision box under its path (plus the hanging object), so it never
  sweeps through a cabinet or a basket wall; it descends and lifts vertically.
- **Closed-loop placing.** While carrying and lowering, the target is the place point plus the
  *current* grip-to-object offset, so an object that slipped in the fingers still lands on target.
- The hand's orientation is held (or turned to the planned yaw) by the rotation part of the action.

LIBERO-Goal's articulation tasks run a script of steps instead (:class:`MotionExpert`, planned
once from the settled scene, same controller): :class:`DrawerExpert` opens a drawer by its
handle (the hand turned to face the drawer, fingers closing vertically on the bar, pulled along
the slide joint), :class:`KnobExpert` turns the stove's knob (gripped on the hinge's axis, the
hand twisted about it). "Open the top drawer and put the bowl inside" chains three experts
(:class:`SequenceExpert`): the bowl set aside off the drawer's path (:class:`AsideExpert`), the
drawer opened, the bowl put in (:class:`DrawerPlaceExpert`); "push the plate to the front of the
stove" (goal/5) pushes it with the closed fingers (:class:`PushExpert`). LIBERO-10's goals are conjunctions: :func:`long_expert` chains each predicate's expert
(:func:`predicate_expert`), closing a drawer (:class:`DrawerCloseExpert`) or a door
(:class:`DoorCloseExpert`) last; into the microwave the mug goes through the doorway, gripped by its handle with
the fingers leaning in (:class:`DoorwayPlaceExpert`), after a door open too narrow for the hand is swung out
(:class:`DoorOpenExpert`).
:func:`expert_for` picks the expert of a task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mujoco
import numpy as np

from sims.backends import to_numpy
from sims.libero.osc import make_controller
from sims.libero.regions import RegionStarts
from sims.libero.sim import LiberoSim
from sims.libero.suites import MAX_STEPS

HOVER = 0.08  # m above the grasp point before descending
LIFT = 0.08  # m lifted at least before carrying (more where the corridor needs it; high carries leave the reach)
CLEARANCE = 0.03  # m between the fingertips (or a held object's bottom) and a box under the path
HAND_MARGIN = 0.01  # m between the hand's hull and a box under it
# robosuite's gripper ramps from open to closed in 8 control steps (0.01 per 2 ms substep); the
# fingers close on the object about 3 steps later: lifting sooner pinches a rim with half the grip.
CLOSE_STEPS = 12
# Opening ramps as long: lifting sooner, half-open fingers still pinch a wide object (object/9's
# carton rose out of the basket with them).
OPEN_STEPS = 10
# The fingers' close and open holds of the experts chained around a drawer (set aside, put in): goal/3's three skills
# fill LIBERO's 300 steps, and a bowl held by its rim at the ramp's end (8) is carried as surely (on goal/3's region
# starts 0-39: 90 % succeed with either; within 300 steps 75 % with 12 and 10, 82.5 % with 8 and 6).
SEQUENCE_CLOSE_STEPS, SEQUENCE_OPEN_STEPS = 8, 6
REACHED = 0.008  # m: a waypoint counts as reached
TURNED = 0.05  # rad: the hand's orientation counts as reached
DOWN_STEPS = 20  # the fingers may rest on a neighbour before reaching the grasp point: close anyway
LOWER_STEPS = 30  # the object may touch down before its target: open anyway
# The compliant arm stops short of a target it is pressed against (the fingers on a neighbour, the
# object on its support): going down or lowering, a hand that moved less than STALLED in a step
# after STALL_AFTER steps has arrived.
STALLED, STALL_AFTER = 0.001, 4  # m, steps
CARRY_STEPS = 60  # a carry that has not arrived by then is at the edge of the reach: lower from there
# While holding: the largest position action (a fraction of the controller's; LIBERO's OSC moves the
# hand about 1.1 cm a step at 1, slow enough to keep a rim pinch) and its largest change per step
# (jerks shake the object loose).
CARRY_SPEED, CARRY_ACCEL = 1.0, 0.15
SLIP = 0.02  # m: the object moved this far in the hand since the grasp: it is no longer held as grasped
SETTLE_STEPS = 10  # LIBERO's evaluation waits 10 steps for the objects to settle
# Some initial states hold an object in the air (spatial/5's bowl lands tilted on the ramekin at
# step ~15): the plan waits until the object rests, at most SETTLE_MAX steps.
SETTLE_MAX, AT_REST = 30, 0.01  # steps; m/s and rad/s
# Nor while another object flies: LIBERO-10's living-room states sink the ketchup 2.9 cm into the table, and
# MuJoCo 4's box-box contact (the true depth; MuJoCo 2.3.7 reports half) throws it 70 cm up for 15 steps.
FLYING = 0.05  # m/s
PHASES = ("settle", "above", "down", "close", "lift", "carry", "lower", "open", "up", "done")
# The Panda hand's collision hull and open fingers relative to the grip site, fingers closing along
# local y (half-widths in x, y; z range), measured on the model: the hull's bottom is flat 2.4 cm
# above the grip site across its 21 cm width.
HAND_BOX = (0.045, 0.11, 0.022, 0.15)
FINGER_BOX = (0.015, 0.05, -0.014, 0.05)
ROBOT_PREFIXES = ("robot0_", "gripper0_", "mount0_")
NEGLIGIBLE_OVERLAP = 2e-6  # m^3 (2 cm^3): AABBs of rotated meshes overlap a little where nothing touches
OVERLAP_STEP = 1e-9  # m^3 (1 mm^3)
UP = np.array([0.0, 0.0, 1.0])
SHOULDER_HEIGHT = 0.333  # m: the Panda's second joint above its base
# Beyond about 0.8 m from the shoulder the elbow straightens onto its joint limit and the
# least-squares step (which knows no limits) lets the hand sag: such grasps cost extra.
COMFORT_REACH, REACH_COST = 0.80, 3.0
# Held from above, the hand puts the wrist's centre (joint 6's axis) WRIST_UP above the grip site and WRIST_BACK
# (the flange's offset from that axis) nearer the shoulder; with the elbow straight on its joint limit the
# shoulder reaches it at most ARM_REACH away (the model's link offsets). A grasp, or the hover over it, that asks
# for more leaves the arm straining short of it with the fingers over the rim (spatial/4's bowl in the drawer,
# gripped at its far side): any grasp within reach goes first.
WRIST_UP, WRIST_BACK, ARM_REACH = 0.204, 0.088, 0.705
WRIST_TOP = 0.35  # m above the grip site that the wrist and forearm occupy over a grasp from above
ASIDE_MARGIN = 0.03  # m an object set aside keeps off its neighbours and off a drawer's path


def geom_boxes(m: mujoco.MjModel, d: mujoco.MjData, geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """World-axis-aligned bounding boxes (lo, hi) [G, 3] of ``geoms`` at ``d``'s pose."""
    mat = d.geom_xmat[geoms].reshape(-1, 3, 3)
    centre = d.geom_xpos[geoms] + np.einsum("gij,gj->gi", mat, m.geom_aabb[geoms, :3])
    half = np.einsum("gij,gj->gi", np.abs(mat), m.geom_aabb[geoms, 3:])
    return centre - half, centre + half


def _overlap(lo: np.ndarray, hi: np.ndarray, box_lo: np.ndarray, box_hi: np.ndarray) -> float:
    """Summed overlap of boxes [G, D] with one box [D]: volume in 3-d, area of footprints in 2-d."""
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


def _column_clear(lo: np.ndarray, hi: np.ndarray, grip: np.ndarray, yaw: float) -> bool:
    """Whether the column over the hand's box (the wrist and forearm, up to :data:`WRIST_TOP` above
    the grip site ``grip`` [3]) meets none of boxes (lo, hi) [G, 3]."""
    (hand_lo, hand_hi), _ = _hand_boxes(grip, yaw)
    hand_lo[2], hand_hi[2] = hand_hi[2], grip[2] + WRIST_TOP
    return _overlap(lo, hi, hand_lo, hand_hi) == 0.0


def wrist_reach(grip: np.ndarray, shoulder: np.ndarray) -> float:
    """How far [m] the shoulder ``shoulder`` [3] must reach the wrist's centre for the hand to hold grip site
    position ``grip`` [3] from above, and :data:`HOVER` above it, whichever is further (compare :data:`ARM_REACH`)."""
    out = grip[:2] - shoulder[:2]
    wrist = grip[:2] - WRIST_BACK * out / max(float(np.linalg.norm(out)), 1e-9)
    return max(float(np.linalg.norm([*(wrist - shoulder[:2]), grip[2] + WRIST_UP + up - shoulder[2]]))
               for up in (0.0, HOVER))


def _rotation_error(target: np.ndarray, quat_wxyz: np.ndarray) -> np.ndarray:
    """World-frame axis-angle [3] turning orientation ``quat_wxyz`` into rotation matrix ``target``."""
    tq = np.zeros(4)
    mujoco.mju_mat2Quat(tq, (target @ _quat_mat(quat_wxyz).T).reshape(-1))
    vel = np.zeros(3)
    mujoco.mju_quat2Vel(vel, tq if tq[0] >= 0 else -tq, 1.0)
    return vel


def _snapshot(sim: LiberoSim, i: int) -> mujoco.MjData:
    """Simulation ``i``'s current positions with body, geom and site poses (no contacts)."""
    d = mujoco.MjData(sim.model)
    d.qpos[:] = to_numpy(sim.qpos[i])
    mujoco.mj_kinematics(sim.model, d)
    return d


def _quat_mat(quat_wxyz: np.ndarray) -> np.ndarray:
    """The rotation matrix [3, 3] of a unit quaternion (w, x, y, z)."""
    out = np.zeros(9)
    mujoco.mju_quat2Mat(out, quat_wxyz)
    return out.reshape(3, 3)


def _turn(axis: np.ndarray, angle: float) -> np.ndarray:
    """The rotation matrix [3, 3] of ``angle`` [rad] about unit ``axis`` [3]."""
    quat = np.zeros(4)
    mujoco.mju_axisAngle2Quat(quat, axis, angle)
    return _quat_mat(quat)


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


HANDLE_GRASPED = ("moka_pot",)  # held by the handle: across its body the open fingers are too narrow
HANDLE_OUT = 0.05  # m: collision boxes whose centres lie further than this from the object's axis are its handle


def _handle_boxes(lo: np.ndarray, hi: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """Which of an object's collision boxes (``lo``, ``hi`` [G, 3]) are its handle, bool [G]: their centres stand
    more than :data:`HANDLE_OUT` off the vertical through its ``origin``."""
    return np.linalg.norm((lo[:, :2] + hi[:, :2]) / 2 - origin[:2], axis=1) > HANDLE_OUT


def handle_side(m: mujoco.MjModel, d: mujoco.MjData, obj: int, geoms: np.ndarray) -> np.ndarray:
    """The horizontal direction [2] from object ``obj``'s origin to its handle (zeros: it has none)."""
    lo, hi = geom_boxes(m, d, geoms)
    off = _handle_boxes(lo, hi, d.xpos[obj])
    if not off.any():
        return np.zeros(2)
    out = ((lo[off, :2] + hi[off, :2]) / 2).mean(0) - d.xpos[obj, :2]
    return out / max(float(np.linalg.norm(out)), 1e-9)


def handle_candidates(m: mujoco.MjModel, d: mujoco.MjData, obj: int, geoms: np.ndarray) -> list[Candidate]:
    """The grasp of an object (body ``obj``, collision ``geoms``) by its handle from above: the boxes whose
    centres stand more than :data:`HANDLE_OUT` off the body's vertical axis and reach within 2 cm of the
    handle's top, the fingers across their narrower side, half of GRIP_BELOW_TOP under that top."""
    lo, hi = geom_boxes(m, d, geoms)
    off = _handle_boxes(lo, hi, d.xpos[obj])
    if not off.any():
        return top_candidates(m, d, obj, geoms)[0]
    top = hi[off, 2].max()
    bar = off & (hi[:, 2] > top - 0.02)
    blo, bhi = lo[bar].min(0), hi[bar].max(0)
    grip = np.array([*(blo[:2] + bhi[:2]) / 2, top - GRIP_BELOW_TOP / 2])
    width = bhi - blo
    return [(grip, 0.0 if width[1] <= width[0] else np.pi / 2, 0.0)]


def rim_grasped(body: str) -> bool:
    """Whether the experts hold object ``body`` by its rim (:func:`rim_candidates`): bowls, and mugs, whose open
    top is wider than the fingers' opening and whose body slips from a grip across it."""
    return any(kind in body for kind in ("bowl", "mug"))


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

    CLOSE, OPEN = CLOSE_STEPS, OPEN_STEPS  # control steps the fingers close and open for
    CARRY_EXTRA = 0.0  # m added to the carry height the corridor asks
    # Whether the carry may start before the carry height, rising on the way where what it must clear
    # lies ahead (a high obstacle near the place point only: less time lifting).
    RISING_CARRY = False

    def __init__(self, sim: LiberoSim, obj_body: str):
        """Args: sim; obj_body: the body the expert picks (the goal's first argument)."""
        self.sim, self.ctl = sim, make_controller(sim)
        m = sim.model
        self.obj = m.body(obj_body).id
        self._obj_dof = m.jnt_dofadr[m.body_jntadr[self.obj]] + np.arange(6)  # its free joint
        free = np.flatnonzero(m.jnt_type == mujoco.mjtJoint.mjJNT_FREE)
        self._others_dof = (m.jnt_dofadr[free[m.jnt_bodyid[free] != self.obj]][:, None] + np.arange(3)).ravel()
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
        self.lift = np.zeros(n)  # grip site height at which the carry starts (rising to ``carry`` on the way)
        self.lowest = np.zeros(n)  # the lowest grip site height over the place point (the hand rests above)
        self.rot = np.tile(np.eye(3), (n, 1, 1))  # the hand's target orientation
        self.held = np.zeros((n, 3))  # grip site minus object origin once grasped
        self.last = np.zeros((n, 3))  # the previous position action
        self.prev_eef = np.zeros((n, 3))  # the grip site at the previous step
        # The hand's orientation at the episode's start, where the candidates' yaws count from (set by a
        # SequenceExpert for the experts after its first: the hand is then as the one before left it).
        self.base_rot: np.ndarray | None = None

    def reset(self, ids: np.ndarray | None = None, settle: bool = True) -> None:
        """Start simulations ``ids``' (default all) episodes (call after ``sim.reset``): settle
        (LIBERO's steps; ``settle=False``: only until the object rests), then plan."""
        ids = slice(None) if ids is None else ids
        self.phase[ids] = 0
        self.timer[ids] = 0 if settle else SETTLE_STEPS - 1
        self.last[ids] = 0.0

    def finished(self) -> np.ndarray:
        """Whether each simulation's script has ended, bool [N]."""
        return self.phase == len(PHASES) - 1

    # ------------------------------------------------------------------ subclasses
    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        """Grasp candidates for simulation ``i`` at its settled pose ``d``: (grip site position [3], yaw [rad], cost [m])."""
        raise NotImplementedError

    def place_points(self) -> np.ndarray:
        """Where the object's origin should be released, [N, 3] (current state)."""
        raise NotImplementedError

    def upright(self, i: int, quat: np.ndarray) -> np.ndarray:
        """The hand's orientation [3, 3] with the fingers down that simulation ``i``'s grasp turns about the
        vertical (by the grasp's yaw): the hand's at the episode's start (:attr:`base_rot`), else when planned,
        ``quat`` (w, x, y, z)."""
        return self.base_rot[i] if self.base_rot is not None else _quat_mat(quat)

    # ------------------------------------------------------------------ planning
    def _plan(self, i: int, eef: np.ndarray, quat: np.ndarray) -> None:
        """Choose simulation ``i``'s grasp and heights from its settled state (see module docstring)."""
        m = self.sim.model
        d = _snapshot(self.sim, i)
        lo, hi = geom_boxes(m, d, self._scene_geoms)
        shoulder = d.xpos[self._shoulder] + np.array([0.0, 0.0, SHOULDER_HEIGHT])
        best, best_key = None, None
        for grip, yaw, cost in self.candidates(i, d):
            hit = sum(_overlap(lo, hi, blo, bhi) for blo, bhi in _hand_boxes(grip, yaw))
            reach = np.linalg.norm(grip - shoulder)
            # Overlaps in whole OVERLAP_STEPs: candidates whose hulls touch the same boxes differ in float noise only,
            # and reach and cost then decide.
            key = (wrist_reach(grip, shoulder) > ARM_REACH, round(max(hit, NEGLIGIBLE_OVERLAP) / OVERLAP_STEP),
                   reach + REACH_COST * max(reach - COMFORT_REACH, 0.0) + cost)
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

        def carry_over(part: float) -> float:  # the carry height over the first ``part`` of the path
            return self.CARRY_EXTRA + max(
                grip[2] + LIFT, _corridor_top(lo, hi, grip, grip[:2] + part * shift, hand) + HAND_MARGIN - HAND_BOX[2],
                _corridor_top(lo, hi, centre, centre + part * shift, (ohi[:2] - olo[:2]) / 2) + CLEARANCE + hang)

        self.carry[i] = self.lift[i] = carry_over(1.0)
        if self.RISING_CARRY:  # the hand rises at least half as fast as it travels: lift what the way there needs
            length = max(float(np.linalg.norm(shift)), 1e-6)
            for z in np.arange(grip[2] + LIFT, self.carry[i], 0.01):
                if carry_over(min(1.0, (self.carry[i] - z) / (2 * length))) <= z:
                    self.lift[i] = z
                    break
        # A hand wider than the basket rests on its walls: lower only until the hand is just above them.
        held = np.append(grip[:2] + shift, grip[2])
        self.lowest[i] = _under_hand_top(lo, hi, held, yaw) - HAND_BOX[2] + HAND_MARGIN
        self.rot[i] = _turn(UP, yaw) @ self.upright(i, quat)

    # ------------------------------------------------------------------ acting
    def act(self) -> np.ndarray:
        """Actions [N, 7] for the current state; advances each simulation's phase."""
        sim = self.sim
        eef = to_numpy(sim.proprio()["eef_pos"])
        quat = to_numpy(sim.field("xquat")[:, sim.layout.hand_body])
        obj = to_numpy(sim.field("xpos")[:, self.obj])
        obj_quat = to_numpy(sim.field("xquat")[:, self.obj])
        moving = np.zeros(len(self.phase), bool)
        if (self.phase == 0).any():  # only the settle phase asks whether the scene still moves
            qvel = to_numpy(sim.qvel)
            moving = np.abs(qvel[:, self._obj_dof]).max(1) > AT_REST
            if len(self._others_dof):
                moving |= np.abs(qvel[:, self._others_dof]).max(1) > FLYING
        place = self.place_points()
        target, grip = eef.copy(), np.full(len(eef), -1.0)
        turn = np.zeros((len(eef), 3))
        for i, phase in enumerate(self.phase):
            name = PHASES[phase]
            if name == "settle":
                grip[i] = -1.0  # LIBERO's wait action: zero motion, the gripper opening
                if self.timer[i] >= SETTLE_STEPS - 1 and (not moving[i] or self.timer[i] >= SETTLE_MAX - 1):
                    self._plan(i, eef[i], quat[i])
                    grip[i], self.timer[i] = -1.0, SETTLE_MAX  # planned: the phase ends this step
            else:
                turn[i] = _rotation_error(self.rot[i], quat[i])
            if name in ("above", "down"):  # the grasp follows the object while it still settles or slides
                target[i] = obj[i] + _quat_mat(obj_quat[i]) @ self.grasp[i]
                if name == "above":
                    target[i, 2] = self.hover[i]
            elif name in ("close", "lift"):
                target[i], grip[i] = self.grasp_world[i], 1.0
                if name == "lift":
                    target[i, 2] = self.lift[i]
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
        self.prev_eef = eef
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
        timed = {"settle": SETTLE_MAX, "close": self.CLOSE, "open": self.OPEN}
        limits = {"down": DOWN_STEPS, "lower": LOWER_STEPS, "carry": CARRY_STEPS}
        if name in timed:
            done = self.timer[i] >= timed[name]
        elif name == "done":
            done = False
        else:
            done = (dist < REACHED and (name != "above" or turn < TURNED)) or self.timer[i] >= limits.get(name, 1 << 30)
            done |= (name in ("down", "lower") and self.timer[i] >= STALL_AFTER
                     and np.linalg.norm(eef - self.prev_eef[i]) < STALLED)
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
    """LIBERO-Goal's pick-and-place tasks, ``On``/``In(object, object or an object's region)``: a
    bowl by its rim, anything else from above; released with its bottom just above the target's
    surface (the highest collision box of the target, or of the region's object, under the target
    point). Goal's other tasks: :func:`goal_expert`."""

    DROP = 0.01  # m: the object's bottom is released this high above the target's surface
    FOOTPRINT = 0.01  # m: half-size of the spot under the target point whose surface counts
    SLOT = 0.6  # of a region's half-sizes: how far off its centre each of two objects put onto it goes

    def __init__(self, sim: LiberoSim, pred: dict | None = None):
        """Args: sim; pred: the ``On``/``In`` predicate it makes hold (default: the task's single goal).

        Raises: ValueError: ``pred`` (the task's goal) is not one ``On``/``In(object, object or region)``.
        """
        goal = sim.task.goal
        pred = pred if pred is not None else goal[0] if len(goal) == 1 else None
        if pred is None or pred["predicate"] not in ("on", "in"):
            raise ValueError(f"{sim.task.task_id}: {pred or goal} is not a pick-and-place task onto or into "
                             "something")
        obj, target = pred["entities"]
        super().__init__(sim, obj["body"])
        m = sim.model
        self.rim = rim_grasped(obj["body"])
        self.handle = any(kind in obj["body"] for kind in HANDLE_GRASPED)
        self.site = m.site(target["site"]).id if target["kind"] == "site" else None
        self.target = m.body(target["body"]).id if self.site is None else None
        if self.site is None:
            support = self.target
        else:  # a region of an object, or of the table itself (the site's own body)
            support = m.body(target["parent_body"]).id if target["parent_body"] else m.site_bodyid[self.site]
        collide = (m.geom_contype > 0) | (m.geom_conaffinity > 0)
        self._support_geoms = np.flatnonzero(collide & (m.body_rootid[m.geom_bodyid] == m.body_rootid[support]))
        self.place_z = np.zeros(sim.num_envs)  # the object's origin when released
        self.place_shift = np.zeros((sim.num_envs, 2))  # the release point off the region's centre
        # Where in a region target to release, in fractions of its half-sizes along world x and y off its centre.
        self.slot = np.zeros((sim.num_envs, 2))
        # The expert that puts another object onto the same region next (LIBERO-10's second moka pot): planning
        # the first chooses both sides, across the handles' direction, so neither hangs over the other.
        self.next_onto: GoalExpert | None = None
        self._region_size = np.array(target.get("size", (0.0, 0.0, 0.0)), float)

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        m = self.sim.model
        out, origin_height = top_candidates(m, d, self.obj, self._obj_geoms)
        if self.rim:
            out = rim_candidates(m, d, self.obj, self._obj_geoms)
        elif self.handle:
            out = handle_candidates(m, d, self.obj, self._obj_geoms)
        point = d.site_xpos[self.site].copy() if self.site is not None else d.xpos[self.target]
        if self.next_onto is not None:  # the two sides along the axis the handles point across, the second's away
            later = self.next_onto
            mine, its = handle_side(m, d, self.obj, self._obj_geoms), handle_side(m, d, later.obj, later._obj_geoms)
            axis = int(np.argmin(np.abs(mine) + np.abs(its)))
            side = np.zeros(2)
            side[axis] = self.SLOT * (1.0 if its[axis] >= 0 else -1.0)
            self.slot[i], later.slot[i] = -side, side
        if self.site is not None:
            self.place_shift[i] = self.slot[i] * np.abs(d.site_xmat[self.site].reshape(3, 3) @ self._region_size)[:2]
            point[:2] += self.place_shift[i]
        lo, hi = geom_boxes(m, d, self._support_geoms)
        under = ((lo[:, :2] < point[:2] + self.FOOTPRINT) & (hi[:, :2] > point[:2] - self.FOOTPRINT)).all(1)
        surface = hi[under, 2].max() if under.any() else point[2]
        self.place_z[i] = surface + self.DROP + origin_height
        return out

    def place_points(self) -> np.ndarray:
        xpos = self.sim.field("site_xpos")[:, self.site] if self.site is not None else self.sim.field("xpos")[:, self.target]
        point = to_numpy(xpos).copy()
        if self.site is not None:
            point[:, :2] += self.place_shift
        point[:, 2] = self.place_z
        return point


@dataclass(frozen=True)
class Step:
    """One step of a :class:`MotionExpert`'s script: the gripper action held through it (-1 open,
    1 closed), the control steps after which it ends anyway (``limit``) and before which it does
    not (``hold``: the fingers closing or opening), and its largest position action (``speed``, a
    fraction of the controller's)."""

    name: str
    grip: float = -1.0
    limit: int = 60
    hold: int = 0
    speed: float = 1.0
    reached: float = REACHED  # m from the target that counts as reached (a via point needs less)


class MotionExpert:
    """A script of :class:`Step` s per simulation for the tasks that move an articulation or push:
    after LIBERO's settle steps, :meth:`plan` reads the settled scene once; then each step drives
    the grip site to :meth:`target`'s point with the hand turned to its orientation, and ends where
    both are reached (or :meth:`arrived` says so, or at its limit). Subclasses: :class:`DrawerExpert`
    (a handle pull), :class:`KnobExpert` (a knob turn)."""

    STEPS: tuple[Step, ...] = ()

    def __init__(self, sim: LiberoSim):
        """Args: sim: the simulations the script acts on (one plan per simulation)."""
        self.sim, self.ctl = sim, make_controller(sim)
        m, n = sim.model, sim.num_envs
        collide = (m.geom_contype > 0) | (m.geom_conaffinity > 0)
        robot = np.array([m.body(b).name.startswith(ROBOT_PREFIXES) for b in range(m.nbody)])
        self._collide = collide & ~robot[m.geom_bodyid]  # the scene's collision geoms (no robot)
        self.phase = np.zeros(n, np.int64)  # 0: settling; k: STEPS[k - 1]; len(STEPS) + 1: done
        self.timer = np.zeros(n, np.int64)
        self.start_rot = np.tile(np.eye(3), (n, 1, 1))  # the hand's orientation when planned

    def _joint(self, name: str, kind: mujoco.mjtJoint, what: str) -> int:
        """The id of joint ``name``, which must be of type ``kind`` (``what`` names it in the error)."""
        joint = self.sim.model.joint(name).id
        if self.sim.model.jnt_type[joint] != kind:
            raise ValueError(f"{name} is not {what} joint (type {self.sim.model.jnt_type[joint]})")
        return joint

    def reset(self, ids: np.ndarray | None = None, settle: bool = True) -> None:
        """Start simulations ``ids``' (default all) scripts (call after ``sim.reset``), after
        LIBERO's settle steps (``settle=False``: at once)."""
        ids = slice(None) if ids is None else ids
        self.phase[ids] = 0
        self.timer[ids] = 0 if settle else SETTLE_STEPS - 1

    def finished(self) -> np.ndarray:
        """Whether each simulation's script has ended, bool [N]."""
        return self.phase > len(self.STEPS)

    def plan(self, i: int, d: mujoco.MjData) -> None:
        """Plan simulation ``i``'s script from its settled pose ``d`` (``self.start_rot[i]`` is set)."""
        raise NotImplementedError

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Simulation ``i``'s grip site target [3] and hand orientation [3, 3] in ``step`` (grip site at ``eef``)."""
        raise NotImplementedError

    def arrived(self, i: int, step: Step) -> bool:
        """Whether ``step`` has done its work in simulation ``i`` before reaching its target."""
        return False

    def act(self) -> np.ndarray:
        """Actions [N, 7] for the current state; advances each simulation's script."""
        sim = self.sim
        eef = to_numpy(sim.proprio()["eef_pos"])
        quat = to_numpy(sim.field("xquat")[:, sim.layout.hand_body])
        n = len(eef)
        target, grip, speed, turn = eef.copy(), np.full(n, -1.0), np.ones(n), np.zeros((n, 3))
        for i in range(n):
            if self.phase[i] == 0:  # LIBERO's settle steps, the gripper idle
                self.timer[i] += 1
                if self.timer[i] >= SETTLE_STEPS:
                    self.start_rot[i] = _quat_mat(quat[i])
                    self.plan(i, _snapshot(sim, i))
                    self.phase[i], self.timer[i] = 1, 0
                continue
            step = self.STEPS[min(self.phase[i], len(self.STEPS)) - 1]  # done: hold the last step
            target[i], rot = self.target(i, step, eef[i])
            turn[i] = _rotation_error(rot, quat[i])
            grip[i], speed[i] = step.grip, step.speed
            if self.phase[i] > len(self.STEPS):
                continue
            self.timer[i] += 1
            reached = np.linalg.norm(target[i] - eef[i]) < step.reached and np.linalg.norm(turn[i]) < TURNED
            if self.timer[i] >= step.limit or (self.timer[i] >= step.hold and (reached or self.arrived(i, step))):
                self.phase[i] += 1
                self.timer[i] = 0
        action = np.zeros((n, 7))
        move = (target - eef) / self.ctl.output_max[:3]
        action[:, :3] = np.clip(move, -speed[:, None], speed[:, None])
        action[:, 3:6] = np.clip(turn / self.ctl.output_max[3:], -1.0, 1.0)
        action[:, 6] = grip
        return action


class DrawerExpert(MotionExpert):
    """Opens a drawer (a slide joint) by its handle: the hand turned to face the drawer's front,
    fingers pointing at it and closing vertically on the handle's bar (the drawers' handles sit one
    above another, so the bar is reached from the front, not from above), pulled out along the
    joint to its open end, let go, and backed off and up (still facing the drawer).
    Facing the drawer, the hand's hull stands 21 cm tall about the bar: it turns above the objects
    on the table under its way (:meth:`plan`'s ``over``) and comes down in front of the handle, so
    it does not sweep them along (the compliant arm would then rest on them short of the bar)."""

    FRONT = 0.10  # m in front of the handle where the hand comes down facing the drawer
    BACK = 0.06  # m the hand backs off after letting go
    RISE = 0.05  # m it rises as it backs off
    OPENED = 0.01  # m (of joint travel) before the end counts as open
    # m past the bar's centre, into the drawer, that the grip site aims at to close on it: the compliant arm stops
    # short, and fingers closing on a bar at their tips squeezed it out (goal/0's region starts 0-39: 27 of 40
    # opened at 0 on an AVX-512 machine, 35 at 1 cm, 39 at 2 cm).
    GRIP_DEPTH = 0.02
    RELEASE_STEPS = 6  # backing off slides the fingers off the bar: they need not be fully open (time is short in goal/3)
    STEPS = (Step("over", limit=60, reached=0.03), Step("front", limit=40, reached=0.02), Step("reach", limit=40),
             Step("close", grip=1.0, hold=CLOSE_STEPS, limit=CLOSE_STEPS),
             Step("pull", grip=1.0, limit=80), Step("open", hold=RELEASE_STEPS, limit=RELEASE_STEPS),
             Step("back", limit=20, reached=0.03))

    def __init__(self, sim: LiberoSim, joint: str):
        """Args: sim; joint: the drawer's slide joint (opening moves it to its range's far end).

        Raises: ValueError: ``joint`` is not a slide joint.
        """
        super().__init__(sim)
        m, n = sim.model, sim.num_envs
        self.joint = self._joint(joint, mujoco.mjtJoint.mjJNT_SLIDE, "a drawer's slide")
        lo, hi = m.jnt_range[self.joint]
        self.sign = -1.0 if abs(lo) > abs(hi) else 1.0  # closed near 0: opening goes to the far end
        self.end, self.near = (lo, hi) if self.sign < 0 else (hi, lo)  # the open end, the closed one
        self.start_q = np.zeros(n)  # the joint's position when planned
        self._qadr = m.jnt_qposadr[self.joint]
        self._geoms = np.flatnonzero(self._collide & (m.geom_bodyid == m.jnt_bodyid[self.joint]))
        free = np.isin(m.body_rootid, m.jnt_bodyid[m.jnt_type == mujoco.mjtJoint.mjJNT_FREE])
        self._object_geoms = np.flatnonzero(self._collide & free[m.geom_bodyid])  # what lies loose on the table
        self.grasp = np.zeros((n, 3))  # the handle bar's centre: the grip site closes there
        self.over = np.zeros(n)  # grip site height at which the hand turns on its way to the front
        self.out = np.zeros((n, 3))  # the drawer's opening direction (horizontal unit)
        self.pull_rot = np.tile(np.eye(3), (n, 1, 1))

    def plan(self, i: int, d: mujoco.MjData) -> None:
        self.start_q[i] = d.qpos[self._qadr]
        out = self.sign * d.xaxis[self.joint]
        out[2] = 0.0
        self.out[i] = out / np.linalg.norm(out)
        lo, hi = geom_boxes(self.sim.model, d, self._geoms)
        centre = (lo + hi) / 2
        self.grasp[i] = centre[np.argmax(centre @ self.out[i])]  # the bar: the drawer's part furthest out
        # Turning, the hull reaches HAND_BOX's half-length (its width) from the grip site any way.
        lo, hi = geom_boxes(self.sim.model, d, self._object_geoms)
        reach = np.full(2, HAND_BOX[1])
        front = self.grasp[i] + self.FRONT * self.out[i]
        eef = d.site_xpos[self.sim.layout.eef_site]
        self.over[i] = max(front[2], _corridor_top(lo, hi, eef, front, reach) + HAND_MARGIN + HAND_BOX[1])
        # Fingers (the hand's z) pointing into the drawer, closing (its y) vertically: of the two
        # such orientations, the one nearer the current one.
        best = None
        for up in (UP, -UP):
            rot = np.stack([np.cross(up, -self.out[i]), up, -self.out[i]], axis=1)
            angle = np.arccos(np.clip((np.trace(rot @ self.start_rot[i].T) - 1) / 2, -1.0, 1.0))
            if best is None or angle < best[0]:
                best = (angle, rot)
        self.pull_rot[i] = best[1]

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        travel = self.sign * (self.end - self.start_q[i]) * self.out[i]  # along the joint, from where it was
        front = self.grasp[i] + self.FRONT * self.out[i]
        grip = self.grasp[i] - self.GRIP_DEPTH * self.out[i]
        point = {"over": np.append(front[:2], self.over[i]), "front": front, "reach": grip, "close": grip,
                 "pull": self.grasp[i] + travel, "open": self.grasp[i] + travel,
                 "back": self.grasp[i] + travel + self.BACK * self.out[i] + self.RISE * UP}[step.name]
        return point, self.pull_rot[i]

    def arrived(self, i: int, step: Step) -> bool:
        q = float(to_numpy(self.sim.qpos[i, self._qadr]))
        return step.name == "pull" and abs(q - self.end) < self.OPENED


class DrawerCloseExpert(DrawerExpert):
    """Closes an open drawer (LIBERO-10's start open) by pushing its handle's bar in: the hand faces
    the drawer as :class:`DrawerExpert`'s does, but turned a quarter about the fingers, so its 21 cm
    hull lies along the drawer's front, not up and down (in front of a bottom drawer it would stand
    on the table; fingers down, it would run into the cabinet above the drawer); the closed fingers
    come down in front of the bar, push it along the joint past the closed end, and back off and up."""

    BAR_GAP = 0.02  # m from the bar's centre, outwards, where the grip site presses (the fingertips lead it)
    TILT = np.pi / 4  # rad the fingers lean from pointing down into the drawer: the hand's hull stays out of the cabinet
    PUSH_PAST = 0.02  # m the push aims beyond the closed end (the compliant arm stops short of it)
    CLOSED = 0.005  # m from the closed end that counts as closed (LIBERO's Close of a drawer asks 1 cm)
    STEPS = (Step("over", grip=1.0, limit=60, reached=0.03), Step("front", grip=1.0, limit=40, reached=0.02),
             Step("reach", grip=1.0, limit=30), Step("push", grip=1.0, limit=60), Step("back", grip=1.0, limit=20,
                                                                                     reached=0.03))

    def plan(self, i: int, d: mujoco.MjData) -> None:
        super().plan(i, d)
        into = -self.out[i]
        fingers = np.cos(self.TILT) * -UP + np.sin(self.TILT) * into  # down, leaning into the drawer
        rots = []
        for side in (1.0, -1.0):  # the closing axis horizontal, either way: the one nearer the current hand
            y = side * np.cross(UP, into)
            rots.append(np.stack([np.cross(y, fingers), y, fingers], axis=1))
        self.pull_rot[i] = min(rots, key=lambda r: -np.trace(r @ self.start_rot[i].T))

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        front = self.grasp[i] + self.FRONT * self.out[i]
        touch = self.grasp[i] + self.BAR_GAP * self.out[i]
        push = abs(self.near - self.start_q[i]) + self.PUSH_PAST
        point = {"over": np.append(front[:2], self.over[i]), "front": front, "reach": touch,
                 "push": touch - push * self.out[i], "back": front + self.RISE * UP}[step.name]
        return point, self.pull_rot[i]

    def arrived(self, i: int, step: Step) -> bool:
        q = float(to_numpy(self.sim.qpos[i, self._qadr]))
        return step.name == "push" and self.sign * (q - self.near) < self.CLOSED


def _closed_end(m: mujoco.MjModel, hinge: int) -> float:
    """The end of a door hinge's range nearer 0, where the door is shut [rad]."""
    lo, hi = m.jnt_range[hinge]
    return float(lo if abs(lo) < abs(hi) else hi)


def _leaning_hand(ahead: np.ndarray, tilt: float) -> np.ndarray:
    """The hand's orientation [3, 3] leaning towards horizontal unit ``ahead`` [3]: the fingers (its z)
    pointing down, leaning ``tilt`` rad that way, closing (its y) across it, so the hand's 21 cm width
    stays level."""
    fingers = np.cos(tilt) * -UP + np.sin(tilt) * ahead
    side = np.cross(ahead, fingers)
    side /= np.linalg.norm(side)
    return np.stack([np.cross(side, fingers), side, fingers], axis=1)


class DoorCloseExpert(MotionExpert):
    """Closes a hinged door (the microwave's, about the vertical) by pushing its face round the hinge:
    the closed fingers, leaning into the push, come down beside the door's face away from where it
    closes, at :data:`REACH` of its width from the hinge and mid-height, then follow the arc with the
    target :data:`LEAD` ahead of the door's angle until it is within :data:`CLOSED` of its closed end,
    and back off and up."""

    REACH = 0.75  # of the door's width from the hinge, where the fingers push
    HEIGHT = 0.5  # of the door's height, where the fingers push
    GAP = 0.03  # m from the door's face to the grip site
    LEAD = 0.35  # rad ahead of the door's current angle the push aims
    TILT = np.pi / 4  # rad the fingers lean from pointing down into the push
    CLOSED = 0.004  # rad from the closed end that counts as closed (LIBERO's Close of the microwave asks 5 mrad)
    OVER = 0.10  # m above the door's top where the hand travels to the push's start
    BACK, RISE = 0.06, 0.05  # m the hand backs off from the door and rises, after the push
    STEPS = (Step("over", grip=1.0, limit=60, reached=0.03), Step("down", grip=1.0, limit=40, reached=0.02),
             Step("push", grip=1.0, limit=120), Step("back", grip=1.0, limit=20, reached=0.03))

    def __init__(self, sim: LiberoSim, joint: str):
        """Args: sim; joint: the door's hinge (closing moves it to its range's end nearer 0).

        Raises: ValueError: ``joint`` is not a hinge.
        """
        super().__init__(sim)
        m, n = sim.model, sim.num_envs
        self.joint = self._joint(joint, mujoco.mjtJoint.mjJNT_HINGE, "a door's hinge")
        self.closed = _closed_end(m, self.joint)
        self._qadr = m.jnt_qposadr[self.joint]
        self._geoms = np.flatnonzero(self._collide & (m.geom_bodyid == m.jnt_bodyid[self.joint]))
        self.anchor = np.zeros((n, 3))
        self.axis = np.tile(UP, (n, 1))
        self.arm = np.zeros((n, 3))  # horizontal, from the hinge to the push point, at the planned angle
        self.start_q = np.zeros(n)
        self.goal = np.full(n, self.closed)  # the angle the push ends at
        self.height = np.zeros(n)  # the push point's height
        self.over = np.zeros(n)
        self.sense = np.ones(n)  # +1: the push increases the joint's angle

    def plan(self, i: int, d: mujoco.MjData) -> None:
        self.anchor[i], self.axis[i] = d.xanchor[self.joint], d.xaxis[self.joint]
        self.start_q[i] = d.qpos[self._qadr]
        self.sense[i] = 1.0 if self.goal[i] > self.start_q[i] else -1.0
        lo, hi = geom_boxes(self.sim.model, d, self._geoms)
        lo, hi = lo.min(0), hi.max(0)
        arm = (lo + hi) / 2 - self.anchor[i]
        arm[2] = 0.0
        self.arm[i] = arm * 2 * self.REACH  # the door's centre lies half its width out
        self.height[i] = lo[2] + self.HEIGHT * (hi[2] - lo[2])
        self.over[i] = hi[2] + self.OVER

    def _point(self, i: int, angle: float) -> tuple[np.ndarray, np.ndarray]:
        """The push point at door angle ``angle`` (off the face by GAP, behind it) and the closing direction [3]."""
        spin = _turn(self.axis[i], angle - self.start_q[i])
        arm = spin @ self.arm[i]
        ahead = self.sense[i] * np.cross(self.axis[i], arm)
        ahead /= np.linalg.norm(ahead)
        point = self.anchor[i] + arm - self.GAP * ahead
        point[2] = self.height[i]
        return point, ahead

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = float(to_numpy(self.sim.qpos[i, self._qadr]))
        if step.name in ("over", "down"):
            point, ahead = self._point(i, self.start_q[i])
            if step.name == "over":
                point[2] = self.over[i]
        elif step.name == "push":
            aim = q + self.sense[i] * self.LEAD
            aim = min(aim, self.goal[i]) if self.sense[i] > 0 else max(aim, self.goal[i])
            point, ahead = self._point(i, aim)
        else:
            point, ahead = self._point(i, q)
            point += -self.BACK * ahead + self.RISE * UP
        return point, _leaning_hand(ahead, self.TILT)

    def arrived(self, i: int, step: Step) -> bool:
        q = float(to_numpy(self.sim.qpos[i, self._qadr]))
        return step.name == "push" and abs(q - self.goal[i]) < self.CLOSED


class DoorOpenExpert(DoorCloseExpert):
    """Swings a door that stands open less than :data:`WIDE` out to that angle, pushing its inner face the way
    :class:`DoorCloseExpert` pushes its outer one, higher up (over what stands before the doorway); a door open
    wide enough is left as it is (each step ends at once). LIBERO-10's microwave starts open 74-119 degrees: at
    the least of those the door's edge stands where the hand carrying the mug in must pass."""

    WIDE = 1.75  # rad from closed
    HEIGHT = 0.8  # of the door's height, where the fingers push
    SLACK = 0.05  # rad: a door open within this of WIDE is wide enough

    def __init__(self, sim: LiberoSim, joint: str):
        super().__init__(sim, joint)
        lo, hi = sim.model.jnt_range[self.joint]
        self.wide = self.closed + self.WIDE * (1.0 if abs(hi - self.closed) > abs(lo - self.closed) else -1.0)
        self.skip = np.zeros(sim.num_envs, bool)

    def plan(self, i: int, d: mujoco.MjData) -> None:
        q = d.qpos[self._qadr]
        self.skip[i] = abs(q - self.closed) >= self.WIDE - self.SLACK
        self.goal[i] = self.wide
        super().plan(i, d)

    def arrived(self, i: int, step: Step) -> bool:
        return bool(self.skip[i]) or super().arrived(i, step)


def _spans(lo: np.ndarray, hi: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each box's (``lo``, ``hi`` [B, 3]) extent along unit ``v`` [3]: its least and greatest projection, [B] each."""
    centre, half = (lo + hi) / 2 @ v, (hi - lo) / 2 @ np.abs(v)
    return centre - half, centre + half


class DoorwayPlaceExpert(MotionExpert):
    """Puts an object into a region inside a container entered through a hinged door (LIBERO-10's mug into the
    microwave, whose 14 cm-tall inside a hand from above does not fit into): the object is gripped from above by
    its part furthest from the doorway (the mug's handle, which faces away from the microwave), the fingers leaning
    :data:`TILT` towards the doorway so that the hand's hull tilts back out of it; lifted until its bottom clears
    the container's floor, slid in straight until it stands :data:`DEPTH` inside the region (no deeper than the
    hull, which stays outside, allows), let go; the hand backs out and rises, turning the fingers down again (the
    door is closed after, by :class:`DoorCloseExpert`). Planned once from the settled scene."""

    TILT = np.radians(55)  # rad the fingers lean from pointing down towards the doorway
    HANDLE = 0.03  # m: the object's boxes this close (along the doorway) to its furthest-back one are its handle
    CLEAR = 0.015  # m the object's bottom clears the container's floor when it slides in
    DEPTH = 0.02  # m the object's origin goes past the region's front (less where the hull stops it)
    WALL_MARGIN = 0.015  # m the object keeps off the container's side walls
    OVER_DOOR = 0.08  # m above the door's top that the grip site travels to over the grasp
    SEARCH = 0.04  # m either side of the region's centre (across the doorway) where the object may go in
    BACK, RISE = 0.10, 0.15  # m the hand backs out of the doorway and then rises
    STEPS = (Step("over", limit=80, reached=0.02), Step("down", limit=50),
             Step("close", grip=1.0, hold=CLOSE_STEPS, limit=CLOSE_STEPS), Step("lift", grip=1.0, limit=40),
             Step("insert", grip=1.0, limit=80, speed=0.5), Step("open", hold=OPEN_STEPS, limit=OPEN_STEPS),
             Step("back", limit=40, reached=0.02), Step("rise", limit=60, reached=0.03))

    def __init__(self, sim: LiberoSim, pred: dict, door: str):
        """Args: sim; pred: the ``In(object, region)`` it makes hold; door: the container's door hinge.

        Raises: ValueError: ``door`` is not a hinge.
        """
        super().__init__(sim)
        m, n = sim.model, sim.num_envs
        obj, region = pred["entities"]
        self.obj = m.body(obj["body"]).id
        self.site = m.site(region["site"]).id
        self._half = np.array(region["size"], float)
        self.door = self._joint(door, mujoco.mjtJoint.mjJNT_HINGE, "a door's hinge")
        door_body = m.jnt_bodyid[self.door]
        self.container = m.body_rootid[door_body]
        self.door_closed = _closed_end(m, self.door)
        self._door_geoms = np.flatnonzero(self._collide & (m.geom_bodyid == door_body) & (m.geom_type == mujoco.mjtGeom.mjGEOM_BOX))
        self._obj_geoms = np.flatnonzero(self._collide & (m.body_rootid[m.geom_bodyid] == self.obj))
        self._box_geoms = np.flatnonzero(self._collide & (m.body_rootid[m.geom_bodyid] == self.container)
                                         & (m.geom_bodyid != door_body))  # the container less its door
        self.inward = np.zeros((n, 3))  # horizontal unit through the doorway into the container
        self.grasp = np.zeros((n, 3))  # the grip site at the grasp
        self.over = np.zeros(n)  # the grip site's height on its way to over the grasp
        self.place = np.zeros((n, 3))  # the grip site when the object stands in the region
        self.lean_rot = np.tile(np.eye(3), (n, 1, 1))  # the fingers leaning TILT towards the doorway
        # The hand's orientation as the episode started (set by a SequenceExpert for an expert after its first).
        self.base_rot: np.ndarray | None = None

    def _inward(self, d: mujoco.MjData) -> np.ndarray:
        """The doorway's normal into the container, horizontal unit [3]: the door panel's (its largest box's) thinnest
        axis turned about the hinge to the closed angle, then the nearest of the container's horizontal frame axes
        (the doorway is square to its body), in the sense from the hinge to the region."""
        m = self.sim.model
        panel = self._door_geoms[np.argmax(np.prod(m.geom_size[self._door_geoms], axis=1))]
        normal = d.geom_xmat[panel].reshape(3, 3)[:, int(np.argmin(m.geom_size[panel]))]
        normal = _turn(d.xaxis[self.door], self.door_closed - d.qpos[m.jnt_qposadr[self.door]]) @ normal
        axes = d.xmat[self.container].reshape(3, 3).T[:2].copy()  # its x and y axes
        axes[:, 2] = 0.0
        axis = axes[int(np.argmax(np.abs(axes @ normal)))]
        axis /= np.linalg.norm(axis)
        return axis if axis @ (d.site_xpos[self.site] - d.xanchor[self.door]) > 0 else -axis

    def plan(self, i: int, d: mujoco.MjData) -> None:
        m = self.sim.model
        u = self.inward[i] = self._inward(d)
        w = np.cross(UP, u)  # across the doorway
        olo, ohi = geom_boxes(m, d, self._obj_geoms)
        ou, ow = _spans(olo, ohi, u), _spans(olo, ohi, w)
        handle = ou[0] < ou[0].min() + self.HANDLE
        top = ohi[handle, 2].max()
        back = int(np.argmin(ou[0]))  # the handle's outermost box: the fingers close across its top
        self.grasp[i] = np.array([*(olo[back, :2] + ohi[back, :2]) / 2, top - GRIP_BELOW_TOP / 2])
        bottom = olo[:, 2].min()
        # The hand starts over the open door's edge: it travels above the door, not through it.
        self.over[i] = max(self.grasp[i, 2] + HOVER, geom_boxes(m, d, self._door_geoms)[1][:, 2].max() + self.OVER_DOOR)
        blo, bhi = geom_boxes(m, d, self._box_geoms)
        site = d.site_xpos[self.site]
        under = ((blo[:, :2] <= site[:2]) & (bhi[:, :2] >= site[:2])).all(1) & (bhi[:, 2] < site[2])
        lift = max(bhi[under, 2].max() + self.CLEAR - bottom if under.any() else 0.0, 0.02)
        origin = d.xpos[self.obj]
        half_u = float(np.abs(d.site_xmat[self.site].reshape(3, 3) @ self._half) @ np.abs(u))
        wanted = float(site @ u) - half_u + self.DEPTH - float(origin @ u)  # the origin's travel along u
        carried = self.grasp[i] + lift * UP
        bu, bw = _spans(blo, bhi, u), _spans(blo, bhi, w)
        # Across the doorway: between the walls beside the object where it will stand (WALL_MARGIN off them),
        # nearest the region's centre where the hull lets it go as deep as wanted, else where it goes deepest.
        beside = ((bu[0] < ou[1].max() + wanted) & (bu[1] > ou[0].min() + wanted)
                  & (blo[:, 2] < ohi[:, 2].max() + lift) & (bhi[:, 2] > bottom + lift))
        at = float(site @ w)
        left = max(bw[1][beside & (bw[1] <= at)], default=-np.inf)
        right = min(bw[0][beside & (bw[0] >= at)], default=np.inf)
        lowest = left + float(origin @ w - ow[0].min()) + self.WALL_MARGIN
        highest = right - float(ow[1].max() - origin @ w) - self.WALL_MARGIN
        options = sorted(np.clip(at + np.linspace(-self.SEARCH, self.SEARCH, 9), lowest, highest), key=lambda x: abs(x - at))
        shifts = [(x - float(origin @ w)) * w for x in options]
        depths = [min(wanted, self._hull_depth(carried + shift, u, blo, bhi, bu, bw)) for shift in shifts]
        best = next((k for k, depth in enumerate(depths) if depth >= wanted - 1e-9), int(np.argmax(depths)))
        self.place[i] = carried + shifts[best] + depths[best] * u
        lean = _leaning_hand(u, self.TILT)
        spun = lean * np.array([-1.0, -1.0, 1.0])  # the same lean, the hand spun half a turn about its fingers
        start = self.base_rot[i] if self.base_rot is not None else self.start_rot[i]
        self.lean_rot[i] = max((lean, spun), key=lambda r: np.trace(r @ start.T))

    def _hull_depth(self, carried: np.ndarray, u: np.ndarray, blo: np.ndarray, bhi: np.ndarray,
                    bu: tuple[np.ndarray, np.ndarray], bw: tuple[np.ndarray, np.ndarray]) -> float:
        """How far along ``u`` the grip site may go from ``carried`` [3] before the leaning hand's hull meets a box of
        the container (``blo``, ``bhi`` [B, 3]; their spans along ``u`` and across, ``bu``, ``bw``): the hull's front
        face runs from its bottom corner back and up; where it meets the lowest box above that corner it must stay
        :data:`HAND_MARGIN` short of that box's front."""
        fingers = np.cos(self.TILT) * -UP + np.sin(self.TILT) * u
        corner = carried - HAND_BOX[2] * fingers + HAND_BOX[0] * np.cross(np.cross(u, UP), fingers)
        at = float(carried @ np.cross(UP, u))
        ahead = (bw[0] < at + HAND_BOX[1]) & (bw[1] > at - HAND_BOX[1]) & (bhi[:, 2] > corner[2])
        if not ahead.any():
            return np.inf
        k = np.flatnonzero(ahead)[np.argmin(bu[0][ahead])]  # the nearest face in the hull's way
        face = float(corner @ u) - max(float(blo[k, 2]) - corner[2], 0.0) * np.tan(self.TILT)
        return float(bu[0][k]) - HAND_MARGIN - face

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u, grasp, place = self.inward[i], self.grasp[i], self.place[i]
        point = {"over": np.append(grasp[:2], self.over[i]), "down": grasp, "close": grasp, "lift": np.append(grasp[:2], place[2]),
                 "insert": place, "open": place, "back": place - self.BACK * u,
                 "rise": place - self.BACK * u + self.RISE * UP}[step.name]
        if step.name == "rise":  # the fingers down as the episode started: the wrist unwinds for what comes next
            return point, self.base_rot[i] if self.base_rot is not None else self.start_rot[i]
        return point, self.lean_rot[i]


class PushExpert(MotionExpert):
    """Pushes a dish across the table onto a region of the table itself (LIBERO-Goal's "push the plate
    to the front of the stove", goal/5). The dish lies at the edge of the reach with the cabinet behind
    it, so there is no room for the hand beyond its far rim: the closed fingers, pointing down, come down
    into the dish's middle and, pressed lightly onto its floor, push its rim from inside. The dish's
    origin goes to the region's point nearest it (:data:`MARGIN` inside its edges) straight or by an
    L along the world's axes, whichever sweeps the dish's footprint over the least of the other objects'
    (the plate would ride up onto the cream cheese); the push is re-aimed at every step from where the dish
    has slid (the target :data:`LEAD` beyond its rim), each leg ending within :data:`AIM` of its end; then
    the hand lifts out."""

    LEAD = 0.03  # m beyond the rim where the push aims
    AIM = 0.01  # m from a leg's end, in the plane, that ends it
    MARGIN = 0.01  # m inside the region's edges where the path ends
    LOW = 0.012  # m above the dish's lowest point where the grip site comes down into it
    # m above that point where the push aims: pressed harder (-15 mm) the dish drags on the table and stays;
    # less, the fingertips ride over its low rim
    PRESS = -0.0075
    OVER = 0.06  # m above the dish's top where the hand travels to the push's start
    RISE = 0.08  # m above the dish's top the hand rises to after the push
    SWEEP_STEP = 0.01  # m between the dish's footprints checked along a path
    STEPS = (Step("over", grip=1.0, limit=80, reached=0.02), Step("down", grip=1.0, limit=40, reached=0.01),
             Step("push", grip=1.0, limit=200, reached=0.0), Step("back", grip=1.0, limit=20, reached=0.03))

    def __init__(self, sim: LiberoSim, pred: dict):
        """Args: sim; pred: ``On(dish, region of the table)``, the goal it makes hold.

        Raises: ValueError: ``pred`` is not an ``On`` of an object onto a site.
        """
        super().__init__(sim)
        obj, region = pred["entities"]
        if pred["predicate"] != "on" or region["kind"] != "site":
            raise ValueError(f"{sim.task.task_id}: {pred['predicate']}({', '.join(pred['args'])}) is not an object "
                             "pushed onto a region")
        m, n = sim.model, sim.num_envs
        self.obj = m.body(obj["body"]).id
        self.site = m.site(region["site"]).id
        self._region_size = np.array(region["size"], float)
        own = m.body_rootid[m.geom_bodyid] == m.body_rootid[self.obj]
        self._geoms = np.flatnonzero(self._collide & own)
        table = m.body_rootid[m.geom_bodyid] == m.body_rootid[m.site_bodyid[self.site]]
        self._others = np.flatnonzero(self._collide & ~own & ~table)  # what the dish may run into
        self.path = np.zeros((n, 2, 3))  # the dish's origin's legs' ends (an L's corner, the end; or the end twice)
        self.leg = np.zeros(n, np.int64)
        self.low = np.zeros(n)  # the dish's lowest point's height
        self.over = np.zeros(n)
        self.rim = np.zeros(n)  # m from the dish's origin to its farthest collision geom's centre
        self.rot = np.tile(np.eye(3), (n, 1, 1))  # the hand's: fingers down, closing across the way from the robot
        self._base = m.body("robot0_base").id

    def plan(self, i: int, d: mujoco.MjData) -> None:
        m, pos = self.sim.model, d.xpos[self.obj]
        half = np.abs(d.site_xmat[self.site].reshape(3, 3) @ self._region_size)[:2] - self.MARGIN
        end = d.site_xpos[self.site].copy()
        end[:2] += np.clip(pos[:2] - end[:2], -half, half)
        end[2] = pos[2]
        lo, hi = geom_boxes(m, d, self._geoms)
        lo, hi = lo.min(0), hi.max(0)
        self.low[i], self.over[i] = lo[2], hi[2] + self.OVER
        self.rim[i] = np.linalg.norm((d.geom_xpos[self._geoms] - pos)[:, :2], axis=1).max()
        olo, ohi = geom_boxes(m, d, self._others)
        level = (ohi[:, 2] > lo[2] + self.SWEEP_STEP) & (olo[:, 2] < hi[2])  # what stands where the dish slides
        others = (olo[level], ohi[level])
        paths = [np.stack([end, end]), np.stack([[pos[0], end[1], pos[2]], end]),
                 np.stack([[end[0], pos[1], pos[2]], end])]  # straight, along y first, along x first
        self.path[i] = min(paths, key=lambda p: self._swept(pos, p, (hi - lo)[:2] / 2, others))
        self.leg[i] = 0
        outward = pos - d.xpos[self._base]
        outward[2] = 0.0
        self.rot[i] = _leaning_hand(outward / np.linalg.norm(outward), 0.0)

    def _swept(self, start: np.ndarray, path: np.ndarray, half: np.ndarray,
               others: tuple[np.ndarray, np.ndarray]) -> float:
        """The area (m^2, summed over footprints every SWEEP_STEP) where the dish's footprint (half-sizes
        ``half`` [2]) moved along ``path`` [2, 3] from ``start`` overlaps the boxes ``others``."""
        lo, hi = others[0][:, :2], others[1][:, :2]
        total, here = 0.0, start
        for corner in path:
            for t in np.linspace(0.0, 1.0, max(2, int(np.linalg.norm(corner - here) / self.SWEEP_STEP) + 1)):
                c = (here + t * (corner - here))[:2]
                total += _overlap(lo, hi, c - half, c + half)
            here = corner
        return total

    def _ahead(self, i: int, pos: np.ndarray) -> np.ndarray:
        """The horizontal unit direction [3] from ``pos`` to the current leg's end (nowhere once there)."""
        ahead = self.path[i, self.leg[i]] - pos
        ahead[2] = 0.0
        norm = np.linalg.norm(ahead)
        return ahead / norm if norm > 1e-6 else np.zeros(3)

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = to_numpy(self.sim.field("xpos")[i, self.obj])
        if step.name == "push" and self.leg[i] == 0 and np.linalg.norm((pos - self.path[i, 0])[:2]) < self.AIM:
            self.leg[i] = 1
        point = pos.copy()
        if step.name == "push":
            point += (self.rim[i] + self.LEAD) * self._ahead(i, pos)
        elif step.name == "back":  # straight up out of the dish
            point = eef.copy()
        point[2] = {"over": self.over[i], "back": self.over[i] - self.OVER + self.RISE,
                    "push": self.low[i] + self.PRESS}.get(
            step.name, self.low[i] + self.LOW)
        return point, self.rot[i]

    def arrived(self, i: int, step: Step) -> bool:
        pos = to_numpy(self.sim.field("xpos")[i, self.obj])
        return step.name == "push" and self.leg[i] == 1 and np.linalg.norm((pos - self.path[i, 1])[:2]) < self.AIM


class KnobExpert(MotionExpert):
    """Turns a knob (a hinge about the vertical) past its threshold: grips it from above on the
    hinge's axis near its top, the fingers across its narrower side (:func:`top_candidates`),
    twists the hand about the axis, lets go and lifts."""

    TWIST = 1.0  # rad the hand turns (LIBERO's TurnOn asks 0.5)
    STEPS = (Step("above", limit=80), Step("down", limit=DOWN_STEPS),
             Step("close", grip=1.0, hold=CLOSE_STEPS, limit=CLOSE_STEPS), Step("twist", grip=1.0, limit=40),
             Step("open", hold=OPEN_STEPS, limit=OPEN_STEPS), Step("up", limit=30), Step("untwist", limit=30))

    def __init__(self, sim: LiberoSim, joint: str, direction: float):
        """Args: sim; joint: the knob's hinge; direction: +1 to turn it to larger angles, -1 smaller.

        Raises: ValueError: ``joint`` is not a hinge about the vertical.
        """
        super().__init__(sim)
        m, n = sim.model, sim.num_envs
        self.joint = self._joint(joint, mujoco.mjtJoint.mjJNT_HINGE, "a knob's hinge")
        self.body = m.jnt_bodyid[self.joint]
        self.direction = direction
        self._geoms = np.flatnonzero(self._collide & (m.geom_bodyid == self.body))
        self.grasp = np.zeros((n, 3))
        self.grip_rot = np.tile(np.eye(3), (n, 1, 1))  # the hand's orientation at the grasp
        self.twist_rot = np.tile(np.eye(3), (n, 1, 1))

    def plan(self, i: int, d: mujoco.MjData) -> None:
        axis = d.xaxis[self.joint]
        if abs(axis[2]) < 0.9:
            raise ValueError(f"{self.sim.model.joint(self.joint).name} turns about {axis.round(2)}, not the "
                             "vertical: the knob expert twists the hand about the vertical only")
        candidates, _ = top_candidates(self.sim.model, d, self.body, self._geoms)
        grip, yaw, _ = min(candidates, key=lambda c: c[2])
        self.grasp[i] = [*d.xanchor[self.joint, :2], grip[2]]  # on the axis: the twist turns the knob in place
        self.grip_rot[i] = _turn(UP, yaw) @ self.start_rot[i]
        self.twist_rot[i] = _turn(axis * self.direction, self.TWIST) @ self.grip_rot[i]

    def target(self, i: int, step: Step, eef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        point = self.grasp[i] + (HOVER * UP if step.name in ("above", "up", "untwist") else 0.0)
        # Lifted clear of the knob, the hand turns back (untwist) for the expert after it (LIBERO-10).
        return point, self.twist_rot[i] if step.name in ("twist", "open", "up") else self.grip_rot[i]


class AsideExpert(PickPlaceExpert):
    """Moves an object off a drawer's path before the drawer opens (goal/3's bowl lies in front of
    the cabinet, under where the opened top drawer would hang over it): picks it (a bowl by its
    rim, anything else from above) and sets it down on the table at the nearest free spot, one
    whose footprint stays :data:`NEIGHBOUR_MARGIN` off every other object's collision box and
    :data:`ASIDE_MARGIN` off the drawer's footprint swept over its travel, within the arm's reach,
    nearest the object and the drawer (:data:`TOWARDS`)."""

    DROP = 0.01  # m: the object's origin is released this high above where it rested
    # m between its footprint and a neighbour's box (goal/3's crowded table leaves no spot 3 cm off every
    # neighbour in the arm's reach in a third of LIBERO's region-sampled scenes)
    NEIGHBOUR_MARGIN = 0.015
    # Of the free spots, the one nearest the object plus TOWARDS times its distance to the drawer's swept footprint's
    # centre: the hand goes there next (to open it), and then carries the object there.
    TOWARDS = 1.0
    CLOSE, OPEN = SEQUENCE_CLOSE_STEPS, SEQUENCE_OPEN_STEPS
    GRID = np.arange(-0.24, 0.2401, 0.02)  # m: offsets of the spots tried, each axis
    MIN_REACH, MAX_REACH = 0.5, 0.65  # m from the shoulder to a spot (nearer, the arm folds onto its
    # limits and cannot lift; further, the placing hand sags)

    def __init__(self, sim: LiberoSim, obj_body: str, drawer: DrawerExpert):
        """Args: sim; obj_body: the object moved; drawer: the expert that opens the drawer next."""
        super().__init__(sim, obj_body)
        self.drawer = drawer
        self.rim = rim_grasped(obj_body)
        self.place = np.zeros((sim.num_envs, 3))

    def _free_spot(self, d: mujoco.MjData) -> np.ndarray:
        """The chosen spot's origin [3] (see the class docstring). Where every spot in reach and off the drawer's
        way meets a neighbour's margin, the one overlapping the neighbours' boxes least; the object's own place if
        none is off the drawer's way."""
        m, dr = self.sim.model, self.drawer
        olo, ohi = geom_boxes(m, d, self._obj_geoms)
        olo, ohi = olo.min(0), ohi.max(0)
        lo, hi = geom_boxes(m, d, self._scene_geoms)
        keep = hi[:, 2] > olo[2] + 0.005  # not the table under it
        lo, hi = lo[keep, :2], hi[keep, :2]
        out = dr.sign * d.xaxis[dr.joint, :2] * abs(dr.end)  # the hand pulls above the table's objects
        slo, shi = geom_boxes(m, d, dr._geoms)
        slo, shi = slo.min(0)[:2], shi.max(0)[:2]
        slo, shi = np.minimum(slo, slo + out), np.maximum(shi, shi + out)
        half = (ohi[:2] - olo[:2]) / 2
        near = half + self.NEIGHBOUR_MARGIN
        centre = (olo[:2] + ohi[:2]) / 2
        shoulder = d.xpos[self._shoulder, :2]
        best = None
        for dx in self.GRID:
            for dy in self.GRID:
                c = centre + np.array([dx, dy])
                in_way = ((slo < c + half + ASIDE_MARGIN) & (shi > c - half - ASIDE_MARGIN)).all()
                if in_way or not self.MIN_REACH < np.linalg.norm(c - shoulder) < self.MAX_REACH:
                    continue
                cost = (_overlap(lo, hi, c - near, c + near),  # m^2 within the neighbours' margin
                        np.hypot(dx, dy) + self.TOWARDS * np.linalg.norm(c - (slo + shi) / 2))  # m travelled
                if best is None or cost < best[0]:
                    best = (cost, np.array([dx, dy, self.DROP]))
        return d.xpos[self.obj] + (best[1] if best is not None else np.array([0.0, 0.0, self.DROP]))

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        m = self.sim.model
        self.place[i] = self._free_spot(d)
        if self.rim:
            return rim_candidates(m, d, self.obj, self._obj_geoms)
        return top_candidates(m, d, self.obj, self._obj_geoms)[0]

    def place_points(self) -> np.ndarray:
        return self.place


class DrawerPlaceExpert(GoalExpert):
    """:class:`GoalExpert` into a region inside an opened drawer: the release point moves out of
    the region's centre along the drawer's opening until the object's footprint clears the
    cabinet's front (its fixed frame), so the object drops through the opening instead of onto
    the cabinet's top."""

    # m between the object's side and the cabinet's front: a bowl released from its rim lands up to 1.5 cm deeper
    # than aimed; at 1 cm its far rim caught the cabinet's frame in 18 of 40 of 10/3's region starts and it came to
    # rest tilted about 35 degrees, which jams the drawer it must then close (3 cm: 1 of 40).
    MARGIN = 0.03
    # A bowl held by its rim sags about 1.5 cm in the fingers while carried: over the opened
    # drawer's front panel it would push the drawer shut.
    CARRY_EXTRA = 0.015
    RISING_CARRY = True  # the opened drawer is the high obstacle, at the end of the way
    CLOSE, OPEN = SEQUENCE_CLOSE_STEPS, SEQUENCE_OPEN_STEPS

    def __init__(self, sim: LiberoSim, drawer: DrawerExpert, pred: dict | None = None, opened: bool = True):
        """Args: sim; drawer: the expert of the drawer (its joint and opening direction); pred: as
        :class:`GoalExpert`'s; opened: ``drawer`` opened it just before (the drawer started open: ``False``)."""
        super().__init__(sim, pred)
        self.opened = opened
        m = sim.model
        self.drawer = drawer
        frame = m.body_parentid[m.jnt_bodyid[drawer.joint]]
        self._frame_geoms = np.flatnonzero(drawer._collide & (m.geom_bodyid == frame))
        self.place_xy = np.zeros((sim.num_envs, 2))

    def candidates(self, i: int, d: mujoco.MjData) -> list[Candidate]:
        m, dr = self.sim.model, self.drawer
        # The opened drawer's handle hangs above the table at the height of the wrist over a grasp
        # next to it, which the hand's box does not reach: such grasps go where others are left.
        lo, hi = geom_boxes(m, d, self._scene_geoms)
        out = [c for c in super().candidates(i, d) if _column_clear(lo, hi, c[0], c[1])] or super().candidates(i, d)
        u = dr.sign * d.xaxis[dr.joint, :2]
        u /= np.linalg.norm(u)
        lo, hi = geom_boxes(m, d, self._frame_geoms)
        face = float(((lo[:, :2] + hi[:, :2]) / 2 @ u + (hi[:, :2] - lo[:, :2]) / 2 @ np.abs(u)).max())
        olo, ohi = geom_boxes(m, d, self._obj_geoms)
        reach = float((ohi.max(0)[:2] - olo.min(0)[:2]) / 2 @ np.abs(u))  # the object's half-size along u
        point = d.site_xpos[self.site, :2]
        along = max(float(point @ u), face + reach + self.MARGIN)
        self.place_xy[i] = point + u * (along - float(point @ u))
        return out

    def place_points(self) -> np.ndarray:
        return np.concatenate([self.place_xy, self.place_z[:, None]], axis=1)

    def upright(self, i: int, quat: np.ndarray) -> np.ndarray:
        # The hand still faces the drawer: it turns back to where it was before opening it on its way to the grasp.
        return self.drawer.start_rot[i] if self.opened else super().upright(i, quat)


class SequenceExpert:
    """Experts one after another in each simulation: the next one's script starts (and plans from
    the scene as it then is) where the previous one's has ended."""

    def __init__(self, sim: LiberoSim, experts: list[PickPlaceExpert | MotionExpert]):
        """Args: sim; experts: built on ``sim``, in the order they act."""
        self.sim, self.experts, self.ctl = sim, experts, experts[0].ctl
        self.stage = np.zeros(sim.num_envs, np.int64)
        # A grasp's yaw counts from the hand as the episode started, not as the expert before left it turned.
        self.start_rot = np.tile(np.eye(3), (sim.num_envs, 1, 1))
        for expert in experts[1:]:
            if isinstance(expert, PickPlaceExpert | DoorwayPlaceExpert) and not isinstance(expert, DrawerPlaceExpert):
                expert.base_rot = self.start_rot

    def reset(self, ids: np.ndarray | None = None, settle: bool = True) -> None:
        """Start simulations ``ids``' (default all) first expert (call after ``sim.reset``; ``settle`` as its own)."""
        ids = slice(None) if ids is None else ids
        self.stage[ids] = 0
        quat = to_numpy(self.sim.field("xquat")[:, self.sim.layout.hand_body])
        self.start_rot[ids] = np.stack([_quat_mat(q) for q in quat])[ids]
        self.experts[0].reset(ids, settle)

    def finished(self) -> np.ndarray:
        """Whether each simulation's last expert has ended, bool [N]."""
        return (self.stage == len(self.experts) - 1) & self.experts[-1].finished()

    def act(self) -> np.ndarray:
        """Actions [N, 7]: each simulation's from its current expert (the others' are not used)."""
        for k, expert in enumerate(self.experts[:-1]):
            handover = np.flatnonzero((self.stage == k) & expert.finished())
            self.stage[handover] = k + 1
            self.experts[k + 1].reset(handover, settle=False)  # the scene settled before the first
        actions = [expert.act() if (self.stage == k).any() else None for k, expert in enumerate(self.experts)]
        return np.stack([actions[k][i] for i, k in enumerate(self.stage)])


Expert = PickPlaceExpert | MotionExpert | SequenceExpert


def _joints_of_region(sim: LiberoSim, pred: dict, kind: mujoco.mjtJoint) -> list[int]:
    """The joints of type ``kind`` of the object whose region ``pred`` (an ``On``/``In``) puts something in: a slide
    of the region's own body (a drawer's), a hinge of any other body of that object (a door's); [] for a region of
    the table or an object."""
    m = sim.model
    region = pred["entities"][1]
    if region["kind"] != "site" or region["parent_body"] is None:
        return []
    body = m.site_bodyid[m.site(region["site"]).id]
    root = m.body_rootid[m.body(region["parent_body"]).id]
    if kind == mujoco.mjtJoint.mjJNT_SLIDE:
        return [j for j in range(m.njnt) if m.jnt_bodyid[j] == body and m.jnt_type[j] == kind]
    return [j for j in range(m.njnt) if m.jnt_type[j] == kind and m.body_rootid[m.jnt_bodyid[j]] == root
            and m.jnt_bodyid[j] != root]


def _drawer_joint(sim: LiberoSim, pred: dict) -> int | None:
    """The slide joint of the drawer whose region ``pred`` (an ``On``/``In``) puts something in; ``None``: none."""
    slides = _joints_of_region(sim, pred, mujoco.mjtJoint.mjJNT_SLIDE)
    return slides[0] if slides else None


def _door_joint(sim: LiberoSim, pred: dict) -> int | None:
    """The hinge of the door of the container whose region ``pred`` (an ``In``) puts something in; ``None``: none."""
    hinges = _joints_of_region(sim, pred, mujoco.mjtJoint.mjJNT_HINGE)
    return hinges[0] if hinges else None


def predicate_expert(sim: LiberoSim, pred: dict, drawer_open: bool = False) -> Expert:
    """The expert that makes one goal predicate ``pred`` hold, by its form: ``Open`` or ``Close`` a
    drawer: :class:`DrawerExpert`, :class:`DrawerCloseExpert`; ``Close`` a door: :class:`DoorCloseExpert`; ``TurnOn``/``TurnOff`` a knob: :class:`KnobExpert`; into a region
    of a container with a door (the microwave): the door swung wide enough (:class:`DoorOpenExpert`), the object
    slid in through the doorway (:class:`DoorwayPlaceExpert`); into a region
    of a drawer: the object set aside off the drawer's path (:class:`AsideExpert`), the drawer opened,
    the object put in (:class:`DrawerPlaceExpert`; only the last where ``drawer_open``: the task's
    drawer starts open); any other ``On``/``In``: :class:`GoalExpert`.

    Raises:
        ValueError: a predicate of another form.
    """
    kind, m = pred["predicate"], sim.model
    if kind in ("open", "close", "turnon", "turnoff"):
        rule = pred["joints"]
        joint = int(np.flatnonzero(m.jnt_qposadr == rule["qpos_adr"][0])[0])
        if kind in ("turnon", "turnoff"):
            return KnobExpert(sim, m.joint(joint).name, 1.0 if rule["op"] in (">", ">=") else -1.0)
        if m.jnt_type[joint] == mujoco.mjtJoint.mjJNT_SLIDE:
            return (DrawerCloseExpert if kind == "close" else DrawerExpert)(sim, m.joint(joint).name)
        if kind == "close":
            return DoorCloseExpert(sim, m.joint(joint).name)
        raise ValueError(f"no expert for {sim.task.task_id}'s {kind}({', '.join(pred['args'])}): experts open "
                         "drawers and close drawers and doors, not open doors")
    if kind not in ("on", "in"):
        raise ValueError(f"no expert for {sim.task.task_id}'s {kind}({', '.join(pred['args'])}): experts open and "
                         "close drawers, close doors, turn knobs, pick and place onto or into objects and regions")
    slide = _drawer_joint(sim, pred)
    if slide is None and kind == "in" and (door := _door_joint(sim, pred)) is not None:
        return SequenceExpert(sim, [DoorOpenExpert(sim, m.joint(door).name),
                                    DoorwayPlaceExpert(sim, pred, m.joint(door).name)])
    if slide is None:
        return GoalExpert(sim, pred)
    drawer = DrawerExpert(sim, m.joint(slide).name)
    if drawer_open:
        return DrawerPlaceExpert(sim, drawer, pred, opened=False)
    return SequenceExpert(sim, [AsideExpert(sim, pred["entities"][0]["body"], drawer), drawer,
                                DrawerPlaceExpert(sim, drawer, pred)])


def goal_expert(sim: LiberoSim) -> Expert:
    """LIBERO-Goal's expert for the sim's task: :func:`predicate_expert` of its one goal predicate, but an
    object onto a region of the table itself is pushed there (:class:`PushExpert`: Goal's one such task,
    goal/5, pushes the plate).

    Raises:
        ValueError: a goal of another form (more than one predicate, one no expert makes hold).
    """
    goal = sim.task.goal
    if len(goal) != 1:
        raise ValueError(f"no Goal expert for {sim.task.task_id}'s goal of {len(goal)} predicates")
    pred = goal[0]
    region = pred["entities"][1] if pred["predicate"] in ("on", "in") else {}
    if pred["predicate"] == "on" and region["kind"] == "site" and region.get("parent_body") is None:
        return PushExpert(sim, pred)
    return predicate_expert(sim, pred)


# The order a LIBERO-10 expert makes its goal's predicates hold: knobs first (a pot put on the stove stands by
# its knob), then what is carried, in the goal's order; a door or drawer closes last, on what was put in.
_LONG_ORDER = {"turnon": 0, "turnoff": 0, "open": 0, "on": 1, "in": 1, "close": 2}


def long_expert(sim: LiberoSim) -> Expert:
    """LIBERO-10's expert: each goal predicate's :func:`predicate_expert` one after another
    (:class:`SequenceExpert`, in :data:`_LONG_ORDER`), each planned from the scene the previous one left.

    Raises:
        ValueError: a predicate no expert makes hold.
    """
    goal = sorted(sim.task.goal, key=lambda p: _LONG_ORDER.get(p["predicate"], 3))
    # A drawer the goal closes starts open (LIBERO-10's BDDL opens it): what goes in needs no opening first.
    closed = {a for p in goal if p["predicate"] == "close" for a in p["joints"]["qpos_adr"]}
    adr = sim.model.jnt_qposadr
    experts = []
    onto: dict[int, GoalExpert] = {}  # the first expert putting something onto each region
    for p in goal:
        drawer_open = p["predicate"] in ("on", "in") and (j := _drawer_joint(sim, p)) is not None and adr[j] in closed
        expert = predicate_expert(sim, p, drawer_open)
        # Two objects onto one region (both moka pots onto the stove) go to two sides of it, which the first's plan
        # picks across their handles; into a container the second may lean on the first, so they share its centre.
        if p["predicate"] == "on" and isinstance(expert, GoalExpert) and expert.site is not None:
            if expert.site in onto:
                onto[expert.site].next_onto = expert
            else:
                onto[expert.site] = expert
        experts.append(expert)
    return experts[0] if len(experts) == 1 else SequenceExpert(sim, experts)


def expert_for(sim: LiberoSim) -> Expert:
    """The expert of the sim's task (Spatial, Object: one each; Goal: :func:`goal_expert`; 10: :func:`long_expert`).

    Raises:
        ValueError: a suite without an expert, a Goal goal of another form, a LIBERO-10 predicate without one.
    """
    suite = sim.task.task_id.split("/")[0]
    experts = {"spatial": SpatialExpert, "object": ObjectExpert, "goal": goal_expert, "10": long_expert}
    if suite not in experts:
        raise ValueError(f"no scripted expert for LIBERO suite {suite!r} ({sim.task.task_id}); experts exist for "
                         f"{', '.join(experts)}")
    return experts[suite](sim)


def run_episodes(sim: LiberoSim, state_index: np.ndarray, max_steps: int | None = None,
                 on_step: Callable[[], None] | None = None, regions: RegionStarts | None = None) -> np.ndarray:
    """Run the suite's expert from initial states ``state_index`` [N] (LIBERO's fixed states, or with ``regions``
    those region-sampled starts: :meth:`~sims.libero.sim.LiberoSim.reset_regions`) for at most ``max_steps``
    (default: the suite's LIBERO limit, :data:`sims.libero.suites.MAX_STEPS`) after LIBERO's
    :data:`SETTLE_STEPS` wait steps (the expert's settle phase; LIBERO's limit counts after them), calling ``on_step``
    after the reset and after every control step (to record frames); returns whether the goal held at any
    step, bool [N] (LIBERO's evaluation ends an episode at its first success, as the vector env does)."""
    max_steps = MAX_STEPS[sim.task.task_id.split("/")[0]] if max_steps is None else max_steps
    if regions is None:
        sim.reset(state_index)
    else:
        sim.reset_regions(regions, state_index)
    expert = expert_for(sim)
    expert.ctl.reset(sim, np.arange(sim.num_envs))
    expert.reset()
    if on_step is not None:
        on_step()
    success = np.zeros(sim.num_envs, bool)
    for _ in range(SETTLE_STEPS + max_steps):  # LIBERO's limit counts from after its settle steps
        expert.ctl.step(sim, expert.act())
        success |= to_numpy(sim.success())
        if on_step is not None:
            on_step()
        if expert.finished().all():
            break
    return success
