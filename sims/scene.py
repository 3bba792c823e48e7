"""The tabletop scene, built from primitives with ``mujoco.MjSpec``.

One scene serves every task (so a multi-task suite runs in one batch of one model):

- a table (the plane ``z = 0``);
- a Cartesian gantry hand: slide joints x, y, z driven by position actuators, and a two-finger
  gripper (two slide joints, one position actuator each); the arm bodies are gravity compensated;
- five free objects: three cubes (``block``), a ``ball`` and a ``cylinder``;
- two flat target pads (mocap bodies), two push buttons (spring-loaded caps on a base) and a
  drawer cabinet. Buttons and cabinet are placed by *placement joints*: slides with a huge
  armature, which contacts cannot move, so that their placement is simulation state (qpos),
  randomised per episode. (Mocap bodies cannot carry jointed children: MJX places a mocap body's
  children from the model, not from ``mocap_pos``.)

Positions that the tasks read (tip, object centres, pads, button caps, drawer handle) are affine
in ``qpos`` and ``mocap_pos``, so every backend computes them without running kinematics; see
:class:`SceneLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

#: Geometry constants (metres).
CUBE_HALF = 0.025
BALL_RADIUS = 0.025
CYL_RADIUS = 0.024
CYL_HALF_HEIGHT = 0.025
PAD_RADIUS = 0.045
HAND_HOME_Z = 0.25  # hand body height at z-joint 0
FINGER_HALF = (0.012, 0.006, 0.03)
TIP_BELOW_HAND = 0.06  # tip site below the hand body origin
FINGER_OPEN = 0.045  # per-finger opening at the open limit
BUTTON_TRAVEL = 0.015
BUTTON_CAP_Z = 0.028  # cap body height above its base at rest
DRAWER_TRAVEL = 0.15
CABINET_Y = 0.33
PLACEMENT_ARMATURE = 1e6  # kg: 40 N of finger force moves a placed body ~1e-5 m in an episode
HANDLE_OFFSET = np.array([0.0, -0.125, 0.06])  # handle centre from the cabinet origin, drawer closed
ARM_RANGE = ((-0.3, 0.3), (-0.3, 0.32), (-0.21, 0.15))  # slide joint ranges x, y, z

#: Names of the free objects, their shape nouns (as instructions say them), and the colourable
#: entities in order: objects, pads, button caps.
OBJECT_NAMES = ("cube0", "cube1", "cube2", "ball", "cylinder")
OBJECT_NOUNS = ("block", "block", "block", "ball", "cylinder")
NUM_CUBES = 3
NUM_PADS = 2
NUM_BUTTONS = 2
CAMERAS = ("front", "wrist")


@dataclass(frozen=True)
class SceneLayout:
    """Addresses into the compiled model that the tasks and backends use.

    Attributes:
        arm_qpos: qpos addresses of the x, y, z slides, [3].
        finger_qpos: qpos addresses of the two finger slides, [2].
        object_qpos: first qpos address of each free object's joint, [5].
        button_qpos: qpos address of each button cap's slide, [2].
        button_place_qpos: qpos addresses of each button's placement slides x, y, [2, 2].
        cabinet_place_qpos: qpos address of the cabinet's placement slide x.
        drawer_qpos: qpos address of the drawer slide.
        arm_qvel: qvel addresses of the x, y, z slides, [3].
        finger_qvel: qvel addresses of the finger slides, [2].
        pad_mocap: mocap ids of the pads, [2].
        colour_geoms: geom ids recoloured per episode: objects (5), pads (2), button caps (2).
        qpos0: the model's default qpos, [nq].
    """

    arm_qpos: np.ndarray
    finger_qpos: np.ndarray
    object_qpos: np.ndarray
    button_qpos: np.ndarray
    button_place_qpos: np.ndarray
    cabinet_place_qpos: int
    drawer_qpos: int
    arm_qvel: np.ndarray
    finger_qvel: np.ndarray
    pad_mocap: np.ndarray
    colour_geoms: np.ndarray
    qpos0: np.ndarray


@dataclass(frozen=True)
class SceneConfig:
    """What the scene is built with.

    Attributes:
        timestep: physics timestep in seconds.
        sleep: let bodies at rest sleep (MuJoCo's island sleeping): a resting object costs no
            collision or constraint work until something touches it (about 2x faster physics
            here). The MJX backend, which has no sleeping, turns it off in its copy.
        fast_visual: fast rendering settings (no multisampling, no shadow map, coarse tessellation
            of round primitives); off gives MuJoCo's defaults, for the benchmark's baseline.
    """

    timestep: float = 0.01
    fast_visual: bool = True
    sleep: bool = True

    def validate(self) -> None:
        """Raise ``ValueError`` naming a bad field: ``timestep`` must be a finite number in (0, MAX_TIMESTEP]."""
        if not 0 < self.timestep <= MAX_TIMESTEP:  # NaN fails the comparison
            raise ValueError(f"timestep={self.timestep!r} must be in (0, {MAX_TIMESTEP}] seconds (the scene's "
                             "contacts are tuned for 0.01; smaller is more accurate and slower)")


MAX_TIMESTEP = 0.05
"""The largest physics timestep a scene is built with: five times the 0.01 s its contacts and actuator gains are
tuned for (a larger one is untested)."""


def _look_at_quat(pos: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Quaternion of a camera at ``pos`` looking at ``target`` with a horizontal x axis."""
    forward = target - pos
    forward /= np.linalg.norm(forward)
    z = -forward
    x = np.cross(np.array([0.0, 0.0, 1.0]), z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.stack([x, y, z], axis=1).ravel())
    return quat


def _box(body: mujoco.MjsBody, name: str, half: tuple[float, float, float], pos, rgba, **kw):
    return body.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_BOX, size=list(half), pos=list(pos),
                         rgba=list(rgba), **kw)


def _placed_body(parent: mujoco.MjsBody, name: str, axes: str, pos) -> mujoco.MjsBody:
    """A body positioned by slide joints along ``axes`` that contacts cannot move (see module doc)."""
    body = parent.add_body(name=name, pos=list(pos))
    for axis in axes:
        body.add_joint(name=f"{name}_place_{axis}", type=mujoco.mjtJoint.mjJNT_SLIDE,
                       axis=[float(axis == "x"), float(axis == "y"), 0.0], armature=PLACEMENT_ARMATURE,
                       damping=PLACEMENT_ARMATURE)
    return body


def _visual_cylinder(body: mujoco.MjsBody, name: str, radius: float, half_height: float, pos, rgba,
                     mass: float) -> None:
    """A cylinder seen as a cylinder but colliding as the box around it.

    MJX implements no cylinder-box collisions; a box collider keeps both backends on the same
    physics. The collider sits in geom group 3, which the renderer hides.
    """
    body.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[radius, half_height, 0],
                  pos=list(pos), rgba=list(rgba), contype=0, conaffinity=0, density=0.0)
    _box(body, f"{name}_collider", (radius, radius, half_height), pos, rgba, mass=mass, group=3)


_GREY = (0.5, 0.5, 0.5, 1.0)
_DARK = (0.25, 0.25, 0.28, 1.0)
_WOOD = (0.55, 0.38, 0.22, 1.0)


def build_spec(config: SceneConfig | None = None) -> mujoco.MjSpec:
    """Build the scene's MjSpec (uncompiled), so callers can edit it further.

    Raises:
        ValueError: ``config`` refuses one of its fields (:meth:`SceneConfig.validate`).
    """
    config = config or SceneConfig()
    config.validate()
    spec = mujoco.MjSpec()
    spec.modelname = "tabletop"
    _set_options(spec, config)
    # The order of the parts fixes the bodies', geoms' and joints' ids.
    _add_table(spec.worldbody)
    _add_gantry(spec)
    _add_objects(spec.worldbody)
    _add_drawer(spec.worldbody)
    _add_actuators(spec)
    return spec


def _set_options(spec: mujoco.MjSpec, config: SceneConfig) -> None:
    """Physics (timestep, implicit-fast integrator, solver iterations, sleep) and visual settings."""
    spec.option.timestep = config.timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.iterations = 20
    spec.option.ls_iterations = 10
    if config.sleep:
        spec.option.enableflags |= mujoco.mjtEnableBit.mjENBL_SLEEP
    spec.compiler.autolimits = True
    if config.fast_visual:
        spec.visual.quality.offsamples = 0
        spec.visual.quality.shadowsize = 0
        spec.visual.quality.numslices = 10
        spec.visual.quality.numstacks = 5
        spec.visual.quality.numquads = 1
    spec.visual.headlight.diffuse = [0.3, 0.3, 0.3]
    spec.visual.headlight.ambient = [0.05, 0.05, 0.05]
    spec.visual.global_.offwidth = 1024
    spec.visual.global_.offheight = 1024


def _add_table(wb: mujoco.MjsBody) -> None:
    """The table plane, the light and the front camera."""
    # A plane's third size is its rendering grid spacing: 1 m draws one quad, not thousands.
    wb.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0.6, 0.6, 1.0],
                rgba=[0.6, 0.55, 0.48, 1.0], friction=[1.0, 0.005, 0.0001])
    wb.add_light(name="sun", pos=[0.0, -0.3, 1.5], dir=[0.0, 0.2, -1.0], castshadow=False,
                 diffuse=[0.6, 0.6, 0.6], ambient=[0.25, 0.25, 0.25],
                 type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    front_pos = np.array([0.0, -0.42, 0.78])
    wb.add_camera(name="front", pos=front_pos.tolist(),
                  quat=_look_at_quat(front_pos, np.array([0.0, 0.05, 0.0])).tolist(), fovy=46.0)


def _add_gantry(spec: mujoco.MjSpec) -> None:
    """The gantry hand: slides x, y, z on nested bodies; the hand holds the palm, fingers and wrist camera."""
    hand_parent = spec.worldbody
    for axis, rng in zip("xyz", ARM_RANGE):
        link = hand_parent.add_body(name=f"slide_{axis}", pos=[0, 0, HAND_HOME_Z if axis == "x" else 0],
                                    gravcomp=1.0)
        link.add_joint(name=f"arm_{axis}", type=mujoco.mjtJoint.mjJNT_SLIDE,
                       axis=[float(axis == "x"), float(axis == "y"), float(axis == "z")],
                       range=list(rng), damping=5.0, armature=0.01)
        link.mass, link.explicitinertial = 0.2, True
        link.inertia = [1e-3, 1e-3, 1e-3]
        hand_parent = link
    hand = hand_parent.add_body(name="hand", gravcomp=1.0)
    _box(hand, "palm", (0.02, 0.06, 0.012), (0, 0, 0), _DARK, contype=0, conaffinity=0)
    hand.add_geom(name="column", type=mujoco.mjtGeom.mjGEOM_CAPSULE, fromto=[0, 0, 0.012, 0, 0, 0.3],
                  size=[0.012, 0, 0], rgba=list(_GREY), contype=0, conaffinity=0)
    hand.add_site(name="tip", pos=[0, 0, -TIP_BELOW_HAND], size=[0.005, 0, 0])
    wrist_pos = np.array([0.0, -0.1, 0.05])
    hand.add_camera(name="wrist", pos=wrist_pos.tolist(),
                    quat=_look_at_quat(wrist_pos, np.array([0.0, 0.08, -0.25])).tolist(), fovy=80.0)
    for side, sign in (("left", 1.0), ("right", -1.0)):
        finger = hand.add_body(name=f"finger_{side}", gravcomp=1.0)
        finger.add_joint(name=f"finger_{side}", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, sign, 0],
                         range=[0.0, FINGER_OPEN], damping=2.0, armature=0.005)
        _box(finger, f"finger_{side}", FINGER_HALF, (0, sign * FINGER_HALF[1], -0.012 - FINGER_HALF[2]),
             _DARK, friction=[1.5, 0.005, 0.0001], mass=0.03)
    spec.add_exclude(bodyname1="finger_left", bodyname2="finger_right")


def _add_objects(wb: mujoco.MjsBody) -> None:
    """The free objects resting on the table, the goal pads and the buttons; colours are set per episode."""
    for name in OBJECT_NAMES:
        body = wb.add_body(name=name, pos=[0, 0, 0.03])
        body.add_freejoint(name=name)
        if name == "ball":
            body.add_geom(name=name, type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[BALL_RADIUS, 0, 0],
                          rgba=list(_GREY), mass=0.04, friction=[1.0, 0.005, 0.001])
        elif name == "cylinder":
            _visual_cylinder(body, name, CYL_RADIUS, CYL_HALF_HEIGHT, (0, 0, 0), _GREY, mass=0.04)
        else:
            _box(body, name, (CUBE_HALF,) * 3, (0, 0, 0), _GREY, mass=0.04)

    for i in range(NUM_PADS):
        pad = wb.add_body(name=f"pad{i}", mocap=True, pos=[0, 0, 0])
        pad.add_geom(name=f"pad{i}", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[PAD_RADIUS, 0.001, 0],
                     pos=[0, 0, 0.001], rgba=list(_GREY), contype=0, conaffinity=0)

    for i in range(NUM_BUTTONS):
        base = _placed_body(wb, f"button{i}", "xy", (0, 0, 0))
        _box(base, f"button{i}_base", (0.035, 0.035, 0.0095), (0, 0, 0.0105), _GREY)  # clear of the table
        cap = base.add_body(name=f"button{i}_cap", pos=[0, 0, BUTTON_CAP_Z], gravcomp=1.0)
        cap.add_joint(name=f"button{i}", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, 0, 1],
                      range=[-BUTTON_TRAVEL, 0.004], stiffness=40.0, damping=1.0)
        _visual_cylinder(cap, f"button{i}_cap", 0.025, 0.008, (0, 0, 0), _GREY, mass=0.02)


def _add_drawer(wb: mujoco.MjsBody) -> None:
    """The drawer cabinet: opening faces -y (towards the camera); the drawer slides out along -y."""
    cab = _placed_body(wb, "cabinet", "x", (0, CABINET_Y, 0))
    # One solid block: the drawer (a child body, so the two never collide) disappears into it when
    # closed. Fewer geoms render faster; a hollow cabinet of walls would look the same from outside.
    _box(cab, "cabinet", (0.1, 0.08, 0.06), (0, 0, 0.061), _WOOD)
    drawer = cab.add_body(name="drawer", pos=[0, 0, 0])
    drawer.add_joint(name="drawer", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[0, -1, 0],
                     range=[0.0, DRAWER_TRAVEL], damping=3.0)
    _box(drawer, "drawer_bottom", (0.078, 0.07, 0.005), (0, 0, 0.01), _WOOD, mass=0.2)
    _box(drawer, "drawer_front", (0.08, 0.008, 0.045), (0, -0.078, 0.05), (0.65, 0.48, 0.3, 1.0), mass=0.1)
    _box(drawer, "handle", (0.04, 0.006, 0.006), tuple(HANDLE_OFFSET), _DARK, mass=0.02)
    for sx in (-0.035, 0.035):  # posts: physical, hidden (group 3) to save two geoms per frame
        _box(drawer, f"handle_post{'l' if sx < 0 else 'r'}", (0.005, 0.02, 0.005),
             (sx, HANDLE_OFFSET[1] + 0.02, HANDLE_OFFSET[2]), _DARK, mass=0.005, group=3)


def _add_actuators(spec: mujoco.MjSpec) -> None:
    """Position servos on the slides (targets = joint positions) and the fingers."""
    for axis, rng in zip("xyz", ARM_RANGE):
        act = spec.add_actuator(name=f"arm_{axis}", target=f"arm_{axis}",
                                trntype=mujoco.mjtTrn.mjTRN_JOINT, ctrlrange=list(rng), forcerange=[-40, 40])
        act.set_to_position(kp=600.0, kv=40.0)
    for side in ("left", "right"):
        act = spec.add_actuator(name=f"finger_{side}", target=f"finger_{side}",
                                trntype=mujoco.mjtTrn.mjTRN_JOINT, ctrlrange=[0.0, FINGER_OPEN],
                                forcerange=[-8, 8])
        act.set_to_position(kp=150.0, kv=4.0)


def build_model(config: SceneConfig | None = None) -> tuple[mujoco.MjModel, SceneLayout]:
    """Compile the scene; return the model and the addresses the tasks need."""
    model = build_spec(config).compile()

    def qadr(name: str) -> int:
        return int(model.jnt_qposadr[model.joint(name).id])

    def vadr(name: str) -> int:
        return int(model.jnt_dofadr[model.joint(name).id])

    def mocap(name: str) -> int:
        return int(model.body_mocapid[model.body(name).id])

    colour_geoms = [*OBJECT_NAMES, *(f"pad{i}" for i in range(NUM_PADS)),
                    *(f"button{i}_cap" for i in range(NUM_BUTTONS))]
    layout = SceneLayout(
        arm_qpos=np.array([qadr(f"arm_{a}") for a in "xyz"]),
        finger_qpos=np.array([qadr("finger_left"), qadr("finger_right")]),
        object_qpos=np.array([qadr(n) for n in OBJECT_NAMES]),
        button_qpos=np.array([qadr(f"button{i}") for i in range(NUM_BUTTONS)]),
        button_place_qpos=np.array([[qadr(f"button{i}_place_{a}") for a in "xy"] for i in range(NUM_BUTTONS)]),
        cabinet_place_qpos=qadr("cabinet_place_x"),
        drawer_qpos=qadr("drawer"),
        arm_qvel=np.array([vadr(f"arm_{a}") for a in "xyz"]),
        finger_qvel=np.array([vadr("finger_left"), vadr("finger_right")]),
        pad_mocap=np.array([mocap(f"pad{i}") for i in range(NUM_PADS)]),
        colour_geoms=np.array([model.geom(n).id for n in colour_geoms]),
        qpos0=model.qpos0.copy(),
    )
    return model, layout
