"""A scripted expert for LIBERO-Spatial: pick the black bowl by its rim, place it on the plate.

A phase machine per simulation on the privileged state (body positions), acting through LIBERO's
action space (:class:`sims.libero.controller.PandaController`): above the rim, down onto it,
close, lift, over the plate, down, open, up. The rim is gripped where the fingers' closing axis
(world y at LIBERO's initial hand pose) crosses it, so the hand never turns.
"""

from __future__ import annotations

import mujoco
import numpy as np

from sims.libero.controller import PandaController
from sims.libero.sim import LiberoSim

HOVER = 0.08  # m above the rim before descending
GRIP_DEPTH = 0.025  # m below the rim top where the fingertips close (the rim wall is 3.75 cm tall)
LIFT = 0.12  # m lift before carrying
CLOSE_STEPS, OPEN_STEPS = 8, 6
REACHED = 0.008  # m: a waypoint counts as reached
DOWN_STEPS = 20  # the fingers may rest on a neighbour before reaching the grasp point: close anyway
CARRY_SPEED = 0.6  # fraction of the largest action while holding the bowl (fast moves shake it loose)
SETTLE_STEPS = 10  # LIBERO's evaluation waits 10 steps for the objects to settle
PHASES = ("settle", "above", "down", "close", "lift", "carry", "lower", "open", "up", "done")


class SpatialExpert:
    """Picks ``On(bowl, plate)``'s bowl and places it on the plate, batched over a LiberoSim (numpy)."""

    def __init__(self, sim: LiberoSim):
        """Raises: ValueError: the task's goal is not a single ``On(object, object)``."""
        goal = sim.task.goal
        if len(goal) != 1 or goal[0]["predicate"] != "on" or goal[0]["entities"][1]["kind"] != "body":
            raise ValueError(f"{sim.task.task_id} is not a pick-and-place-on-an-object task: goal {goal}")
        self.sim, self.ctl = sim, PandaController(sim.layout)
        bowl, plate = (e["body"] for e in goal[0]["entities"])
        self.bowl, self.plate = sim.model.body(bowl).id, sim.model.body(plate).id
        m = sim.model
        free = m.jnt_bodyid[m.jnt_type == mujoco.mjtJoint.mjJNT_FREE]
        self.others = np.array([b for b in free if b not in (self.bowl, self.plate)] + [self.plate])
        n = sim.num_envs
        self.phase = np.zeros(n, np.int64)
        self.timer = np.zeros(n, np.int64)
        self.grasp = np.zeros((n, 3))  # the grip site's target on the rim
        self.offset = np.zeros((n, 3))  # grip site minus bowl origin once grasped

    def reset(self) -> None:
        """Start every simulation's episode (call after ``sim.reset``): settle, then plan the grasp."""
        self.phase[:] = 0
        self.timer[:] = 0

    def _plan(self, i: int, eef: np.ndarray) -> None:
        """Grasp simulation ``i``'s bowl at a rim segment on its y axis (the fingers' closing axis),
        the side farther from other objects, from the settled pose (the segment's own position, so
        the bowl's yaw and origin offset do not matter)."""
        m = self.sim.model
        d = mujoco.MjData(m)
        d.qpos[:] = self.sim.qpos[i]
        mujoco.mj_kinematics(m, d)
        geoms = np.flatnonzero((m.geom_bodyid == self.bowl) & (m.geom_contype > 0))
        tops = d.geom_xpos[geoms, 2] + m.geom_size[geoms, 2]
        rim = geoms[tops > tops.max() - 0.005]  # the ring of segments at the top
        centre = d.xpos[self.bowl]
        best, clearance = None, -1.0
        for side in (-1.0, 1.0):  # the rim's two ends along y: take the one with more room for a finger
            seg = rim[np.argmax(side * (d.geom_xpos[rim, 1] - centre[1]) - np.abs(d.geom_xpos[rim, 0] - centre[0]))]
            room = np.linalg.norm(d.xpos[self.others, :2] - d.geom_xpos[seg, :2], axis=1).min()
            if room > clearance:
                best, clearance = seg, room
        self.grasp[i] = [d.geom_xpos[best, 0], d.geom_xpos[best, 1], tops.max() - GRIP_DEPTH]

    def act(self) -> np.ndarray:
        """Actions [N, 7] for the current state; advances each simulation's phase."""
        sim = self.sim
        eef = sim.proprio()["eef_pos"]
        bowl, plate = sim.field("xpos")[:, self.bowl], sim.field("xpos")[:, self.plate]
        target, grip = eef.copy(), np.full(len(eef), -1.0)
        for i, phase in enumerate(self.phase):
            name = PHASES[phase]
            if name == "settle":
                grip[i] = 0.0 if self.timer[i] < SETTLE_STEPS - 1 else -1.0
                if self.timer[i] == SETTLE_STEPS - 1:
                    self._plan(i, eef[i])
            elif name == "above":
                target[i] = self.grasp[i] + _up(HOVER + GRIP_DEPTH)
            elif name == "down":
                target[i] = self.grasp[i]
            elif name in ("close", "lift"):
                target[i], grip[i] = self.grasp[i] + _up(LIFT if name == "lift" else 0.0), 1.0
            elif name in ("carry", "lower"):
                target[i], grip[i] = plate[i] + self.offset[i] + _up(LIFT if name == "carry" else 0.01), 1.0
            elif name == "open":
                target[i] = eef[i]
            elif name in ("up", "done"):
                target[i] = plate[i] + self.offset[i] + _up(LIFT)
            self._advance(i, name, np.linalg.norm(target[i] - eef[i]), eef[i], bowl[i])
        action = np.zeros((len(eef), 7))
        limit = np.where(grip > 0, CARRY_SPEED, 1.0)[:, None]
        action[:, :3] = np.clip((target - eef) / self.ctl.output_max[:3], -limit, limit)
        action[:, 6] = grip
        return action

    def _advance(self, i: int, name: str, dist: float, eef: np.ndarray, bowl: np.ndarray) -> None:
        self.timer[i] += 1
        timed = {"settle": SETTLE_STEPS, "close": CLOSE_STEPS, "open": OPEN_STEPS}
        if name in timed:
            done = self.timer[i] >= timed[name]
        else:
            done = name != "done" and (dist < REACHED or (name == "down" and self.timer[i] >= DOWN_STEPS))
        if name == "close" and done:  # where the hand holds the bowl: carried over the plate as is
            self.offset[i] = eef - bowl
        if done:
            self.phase[i] += 1
            self.timer[i] = 0


def _up(height: float) -> np.ndarray:
    return np.array([0.0, 0.0, height])


def run_episodes(sim: LiberoSim, state_index: np.ndarray, max_steps: int = 220) -> np.ndarray:
    """Run the expert from initial states ``state_index`` [N]; returns success at the end, bool [N]."""
    sim.reset(state_index)
    expert = SpatialExpert(sim)
    expert.reset()
    for _ in range(max_steps):
        sim.step(expert.ctl(sim, expert.act()))
        if (expert.phase == len(PHASES) - 1).all():
            break
    return np.asarray(sim.success())


def main() -> None:
    """``python -m sims.libero.expert [--tasks spatial/0 ...] [--states 50]``: success per task, one JSON line each."""
    import argparse
    import json
    import time

    from sims.libero.scene import load_task

    parser = argparse.ArgumentParser(description="Run the LIBERO-Spatial expert from the fixed initial states.")
    parser.add_argument("--tasks", nargs="+", default=[f"spatial/{i}" for i in range(10)])
    parser.add_argument("--states", type=int, default=50, help="initial states 0..states-1 (LIBERO: 50)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    for task_id in args.tasks:
        start = time.perf_counter()
        sim = LiberoSim(load_task(task_id), args.states, num_threads=args.threads)
        ok = run_episodes(sim, np.arange(args.states))
        print(json.dumps({"task": task_id, "success": int(ok.sum()), "episodes": len(ok),
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
