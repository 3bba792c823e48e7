"""A cached LIBERO task as a MuJoCo model the project's backends run (no robosuite, no libero).

:func:`load_task` reads ``<cache>/<suite>/<index>/`` (written by :mod:`sims.libero.toolchain.export`);
:func:`build_model` compiles its MJCF with three changes to LIBERO's model, all made with
``mujoco.MjSpec`` at load time:

- **Joint servos instead of OSC torques.** LIBERO drives the Panda's seven torque motors with
  robosuite's operational-space controller, recomputed on the host at every 2 ms substep (mass
  matrix, Jacobian, bias forces). Batched and on a GPU that is a host round trip per substep.
  Here the motors become position servos (``kp``/``kv`` below, LIBERO's torque limits kept as
  force limits) on gravity-compensated links, so the 20 Hz controller
  (:mod:`sims.libero.controller`) only sets joint targets and the physics runs 25 substeps alone.
- **Contact sensors for the goal.** LIBERO's ``On``/``In`` test contact between two objects'
  geoms; neither ``mujoco.batch`` nor the predicates should walk contact lists, so each pair the
  goal needs becomes a ``contact`` sensor (``subtree1``/``subtree2`` = the objects' root bodies,
  ``data="found"``): ``sensordata`` holds 1 where they touch.
- **Colliders out of the cameras.** robosuite keeps collision geoms in group 0 and hides that
  group when it renders (``render_collision_mesh=False``); the project's renderers draw groups
  0-2 and hide group 3, so the colliders move to group 3 (and the compiler's
  ``inertiagrouprange`` with them: the bodies' inertia still comes from the colliders). The frames then show what LIBERO's
  show (drawn, the Panda's coloured collision capsules cover its white links).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from sims.libero.suites import cache_dir, parse_task_id, setup_hint
from sims.libero.toolchain.lod import apply_visual_lod

# Panda joint servos (N m / rad, N m s / rad): stiff enough to hold a 5 cm step within a control
# period; torque limits are LIBERO's motor ranges (80 N m, 12 N m for the wrist joints).
ARM_KP = (4500.0, 4500.0, 3500.0, 3500.0, 2000.0, 2000.0, 2000.0)
ARM_KV = (450.0, 450.0, 350.0, 350.0, 200.0, 200.0, 200.0)
CAMERAS = ("agentview", "robot0_eye_in_hand")
HAND_BODY = "robot0_right_hand"  # robosuite's eef body: LIBERO's robot0_eef_quat is its orientation
#: Triangle budget of a visual-only mesh (:mod:`sims.libero.toolchain.lod`); None draws LIBERO's full meshes.
VISUAL_FACES = 2000
#: The smallest budget an env config accepts: below it a scanned object keeps too few triangles to show its shape.
MIN_VISUAL_FACES = 100


@dataclass(frozen=True)
class LiberoTask:
    """One cached LIBERO task.

    Attributes:
        task_id: ``"suite/index"``.
        name: LIBERO's task name; instruction: the BDDL's ``:language``; benchmark_language: the
            benchmark's ``task.language`` (the name in words, what LIBERO's evaluation scripts use).
        goal: the goal predicates with resolved arguments (see :mod:`sims.libero.toolchain.export`).
        robot: joint, actuator, site and camera names and LIBERO's controller settings.
        init_states: float64 ``[S, 1 + nq + nv]``: LIBERO's fixed initial states (time, qpos, qvel).
        model_path: the MJCF file.
    """

    task_id: str
    name: str
    instruction: str
    goal: list[dict[str, Any]]
    robot: dict[str, Any]
    init_states: np.ndarray
    model_path: Path
    benchmark_language: str = ""
    control_freq: float = 20.0


@dataclass(frozen=True)
class LiberoLayout:
    """Addresses into the compiled model.

    Attributes:
        arm_qpos, arm_dof: qpos / qvel addresses of the seven arm joints, [7].
        arm_joint: their joint ids [7]; finger_qpos, finger_dof: the two finger joints, [2].
        arm_act, gripper_act: actuator ids, [7] and [2].
        eef_site: the grip site (LIBERO's ``robot0_eef_pos``); hand_body: ``robot0_right_hand``.
        contact_sensor: sensordata address of each goal contact pair ``(body_a, body_b)``.
        frame_skip: physics substeps per control step (LIBERO: 25 x 2 ms = 20 Hz).
        torque_arm: the arm keeps LIBERO's torque motors (for :class:`sims.libero.osc.OscController`)
            instead of the joint servos.
    """

    arm_qpos: np.ndarray
    arm_dof: np.ndarray
    arm_joint: np.ndarray
    finger_qpos: np.ndarray
    finger_dof: np.ndarray
    arm_act: np.ndarray
    gripper_act: np.ndarray
    eef_site: int
    hand_body: int
    frame_skip: int
    contact_sensor: dict[tuple[str, str], int] = field(default_factory=dict)
    torque_arm: bool = False


def load_task(task_id: str, cache: str | Path | None = None) -> LiberoTask:
    """Read cached task ``task_id`` (``"spatial/0"``).

    Raises:
        ValueError: an unknown suite or task id.
        FileNotFoundError: the task is not cached (the message names the setup command).
    """
    suite, index = parse_task_id(task_id)
    folder = cache_dir(cache) / suite / str(index)
    meta_path = folder / "task.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"LIBERO task {suite}/{index} is not in the cache {cache_dir(cache)}; "
                                f"{setup_hint(f'{suite}/{index}')}")
    meta = json.loads(meta_path.read_text())
    with np.load(folder / "init_states.npz") as f:
        states = f["states"]
    return LiberoTask(task_id=f"{suite}/{index}", name=meta["name"], instruction=meta["instruction"],
                      goal=meta["goal"], robot=meta["robot"], init_states=states, model_path=folder / "model.xml",
                      benchmark_language=meta.get("benchmark_language", ""),
                      control_freq=float(meta["robot"]["control_freq"]))


def load_lan(task: LiberoTask, cache: str | Path | None = None) -> LiberoTask:
    """``task`` as LIBERO-PRO's ``_lan`` variant: the same scene, the variant's instruction and its own
    fixed initial states (written by :func:`sims.libero.toolchain.install.ensure_lan`).

    Raises:
        FileNotFoundError: the variant is not cached (the message names the setup command).
    """
    folder = task.model_path.parent
    if not (folder / "lan.json").is_file():
        raise FileNotFoundError(f"LIBERO-PRO's _lan variant of {task.task_id} is not in the cache {folder.parent.parent}; "
                                f"{setup_hint(task.task_id)}")
    with np.load(folder / "lan_init_states.npz") as f:
        states = f["states"]
    meta = json.loads((folder / "lan.json").read_text())
    return dataclasses.replace(task, instruction=meta["instruction"], init_states=states)


def contact_pairs(goal: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The ``(body, body)`` pairs whose contact the goal's ``On``/``In`` predicates read."""
    pairs = []
    for pred in goal:
        if pred["predicate"] not in ("on", "in"):
            continue
        a, b = pred["entities"]
        if b["kind"] == "body" and a["kind"] == "body":
            pairs.append((b["body"], a["body"]))
        elif b["kind"] == "site" and b["parent_body"] is not None and a["kind"] == "body" and pred["predicate"] == "on":
            pairs.append((b["parent_body"], a["body"]))
    return list(dict.fromkeys(pairs))


def _servo_arm(spec: mujoco.MjSpec, robot: dict[str, Any]) -> None:
    """Turn the arm's torque motors into position servos on gravity-compensated links."""
    for name, kp, kv in zip(robot["arm_actuators"], ARM_KP, ARM_KV):
        act = spec.actuator(name)
        limit = np.abs(act.ctrlrange).max()
        joint = spec.joint(act.target)
        act.set_to_position(kp=kp, kv=kv)
        act.ctrllimited, act.ctrlrange = True, joint.range
        act.forcelimited, act.forcerange = True, [-limit, limit]
    for body in spec.bodies:
        if body.name.startswith(("robot0_", "gripper0_")):
            body.gravcomp = 1.0


def _shrink_textures(spec: mujoco.MjSpec, folder: Path, max_size: int) -> None:
    """Replace every 2D texture file wider or taller than ``max_size`` by its downscaled pixels (the scanned
    objects' 4096 x 4096 textures are 150 of a Spatial scene's 189 MB; a camera of 128 x 128 samples them at
    far coarser mipmap levels anyway)."""
    from PIL import Image

    for tex in spec.textures:
        if not tex.file or tex.type != mujoco.mjtTexture.mjTEXTURE_2D:
            continue
        with Image.open(folder / tex.file) as img:
            if max(img.size) <= max_size:
                continue
            rgb = img.convert("RGB")
            rgb.thumbnail((max_size, max_size), Image.LANCZOS)
            pixels = np.asarray(rgb)
        tex.file = ""
        tex.width, tex.height, tex.nchannel = pixels.shape[1], pixels.shape[0], 3
        tex.data = pixels.tobytes()


ARMS = ("servo", "torque")


def build_model(task: LiberoTask, max_texture: int | None = None, visual_faces: int | None = VISUAL_FACES,
                arm: str = "servo") -> tuple[mujoco.MjModel, LiberoLayout]:
    """Compile the task's scene with joint servos and goal contact sensors (see module docstring); with
    ``max_texture``, 2D textures larger than that many pixels a side are downscaled to it; its visual-only
    meshes decimated to at most ``visual_faces`` triangles (None: full meshes); ``arm="torque"`` keeps LIBERO's
    torque motors and its links without gravity compensation (robosuite's OSC compensates in its torques).

    Raises:
        ValueError: an unknown ``arm``.
    """
    if arm not in ARMS:
        raise ValueError(f"arm={arm!r}; valid: {', '.join(ARMS)}")
    spec = mujoco.MjSpec.from_file(str(task.model_path))
    if max_texture is not None:
        _shrink_textures(spec, task.model_path.parent, max_texture)
    if visual_faces is not None:  # before the colliders move: the raw model's inertia group is robosuite's
        apply_visual_lod(spec, task.model_path.parent, task.model_path.parents[2], visual_faces)
    torque_arm = arm == "torque"
    if not torque_arm:
        _servo_arm(spec, task.robot)
    for geom in spec.geoms:
        if geom.group == 0:  # robosuite's collision group (see module docstring)
            geom.group = 3
    spec.compiler.inertiagrouprange = [3, 3]  # inertia still from the colliders alone, as robosuite's "0 0"
    pairs = contact_pairs(task.goal)
    for a, b in pairs:
        spec.add_sensor(name=f"contact:{a}:{b}", type=mujoco.mjtSensor.mjSENS_CONTACT,
                        objtype=mujoco.mjtObj.mjOBJ_XBODY, objname=a, reftype=mujoco.mjtObj.mjOBJ_XBODY,
                        refname=b, intprm=[1, 0, 1])  # data="found", reduce="none", num=1
    model = spec.compile()
    robot = task.robot
    arm = np.array([model.joint(j).id for j in robot["arm_joints"]])
    fingers = np.array([model.joint(j).id for j in robot["gripper_joints"]])
    layout = LiberoLayout(
        arm_qpos=model.jnt_qposadr[arm].copy(), arm_dof=model.jnt_dofadr[arm].copy(), arm_joint=arm,
        finger_qpos=model.jnt_qposadr[fingers].copy(), finger_dof=model.jnt_dofadr[fingers].copy(),
        arm_act=np.array([model.actuator(a).id for a in robot["arm_actuators"]]),
        gripper_act=np.array([model.actuator(f"gripper0_gripper_{j.removeprefix('gripper0_')}").id
                              for j in robot["gripper_joints"]]),
        eef_site=model.site(robot["eef_site"]).id, hand_body=model.body(HAND_BODY).id,
        frame_skip=round(1.0 / (task.control_freq * model.opt.timestep)),
        contact_sensor={p: int(model.sensor_adr[model.sensor(f"contact:{p[0]}:{p[1]}").id]) for p in pairs},
        torque_arm=torque_arm)
    return model, layout
