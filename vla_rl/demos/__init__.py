"""Demonstrations as LeRobot v3.0 datasets: recorded from the scripted experts, read back as TensorDicts.

- :func:`collect_demos` (:class:`CollectConfig`): run the experts and write a dataset
  (``scripts/collect_demos.py``).
- :class:`DemoDataset`: load any LeRobot v3.0 dataset folder (ours or a user's) and serve
  TensorDict batches, with optional action chunks; :class:`DatasetError` names what is wrong with one.
- :class:`LeRobotWriter`: the layout writer under both.

See docs/demos.md.
"""

from vla_rl.demos.collect import CollectConfig, collect_demos
from vla_rl.demos.lerobot import LeRobotWriter
from vla_rl.demos.reader import DatasetError, DemoDataset

__all__ = ["CollectConfig", "DatasetError", "DemoDataset", "LeRobotWriter", "collect_demos"]
