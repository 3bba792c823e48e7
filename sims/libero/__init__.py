"""LIBERO's tasks on the project's own MuJoCo backends, without robosuite or the libero package.

The runtime (what training, evaluation and the experts import):

- ``suites``: the four standard suites, task ids, the task cache folder (``VLA_RL_LIBERO_CACHE``);
- ``scene``: a cached task as a MuJoCo model (the robot on joint servos, visual level of detail);
- ``sim``: a batch of simulations of one task (batch or warp backend), with rendering;
- ``controller``: LIBERO's ``OSC_POSE`` action space on the Panda's joint servos;
- ``predicates``: LIBERO's goal predicates, batched;
- ``expert``: the scripted experts that record demonstrations;
- ``vec_env``: the suites as the trainer's vector environment (``libero_<suite>[/<i>]``).

The toolchain (:mod:`sims.libero.toolchain`, set-up time, and the mesh decimation the scene calls
when it builds a model): installing LIBERO's packages apart from the project's environment,
exporting tasks into the cache, decimating visual meshes, and packing a slice of the cache into one
archive for a machine without the toolchain.
"""
