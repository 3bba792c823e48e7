"""A slice of the LIBERO task cache in one tar archive: what building given tasks reads, for a machine
without the toolchain (the GPU machine: no libero package, no package index, 64 MiB per transfer).

:func:`bundle_files` lists, relative to the cache root, each task's folder (``model.xml``,
``task.json``, the initial states, the ``_lan`` files where exported), every asset file its model
references once its visual meshes point at their decimated copies for ``visual_faces``
(:func:`sims.libero.toolchain.lod.apply_visual_lod`: textures, collision and small visual meshes), those
copies, and the ``.full`` markers of the visual meshes within the budget (without them a build
would read and count each such mesh again). The originals of decimated meshes are left out, so an
unpacked bundle builds its tasks at that budget only. :func:`pack` writes them into a tar (``.tar``)
or xz-compressed tar (``.tar.xz``) with member paths relative to the cache root: unpacking it into
an empty folder (``tar -x``, or ``tarfile``'s ``extractall``) gives a cache that
:func:`sims.libero.scene.build_model` builds those tasks from, given as ``VLA_RL_LIBERO_CACHE``.

    python -m sims.libero.toolchain.bundle .dev4/libero_bundle.tar.xz spatial/0 spatial/1 ...
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
from pathlib import Path

import mujoco

from sims.libero.scene import VISUAL_FACES
from sims.libero.suites import cache_dir, parse_task_id, setup_hint
from sims.libero.toolchain.install import missing_tasks
from sims.libero.toolchain.lod import apply_visual_lod, lod_copy_path, visual_only_meshes


def _path(model_dir: Path, subdir: str, file: str) -> Path:
    """A file an MJCF names, as MuJoCo finds it (``<model dir>/<meshdir or texturedir>/<file>``), ``..`` folded."""
    return Path(os.path.normpath(file if os.path.isabs(file) else model_dir / subdir / file))


def model_files(model_path: Path, cache: Path, visual_faces: int | None = VISUAL_FACES) -> set[Path]:
    """The files compiling ``model_path`` reads at ``visual_faces`` (module docstring), absolute.

    Decimated copies missing from the cache are made first, as a build would make them.
    """
    spec = mujoco.MjSpec.from_file(str(model_path))
    model_dir = model_path.parent
    original = {mesh.name: mesh.file for mesh in spec.meshes}
    visual = set()
    if visual_faces is not None:
        visual = visual_only_meshes(spec)
        apply_visual_lod(spec, model_dir, cache, visual_faces)
    files = set()
    for mesh in spec.meshes:
        if not mesh.file:
            continue
        files.add(_path(model_dir, spec.meshdir, mesh.file))
        if mesh.name in visual and mesh.file == original[mesh.name]:  # within the budget: its marker
            source = _path(model_dir, spec.meshdir, mesh.file)
            files.add(lod_copy_path(source, cache / "assets", visual_faces, cache).with_suffix(".full"))
    for tex in spec.textures:
        files.update(_path(model_dir, spec.texturedir, f) for f in (tex.file, *tex.cubefiles) if f)
    files.update(_path(model_dir, spec.meshdir, h.file) for h in spec.hfields if h.file)
    files.update(_path(model_dir, spec.meshdir, s.file) for s in spec.skins if s.file)
    return files


def bundle_files(task_ids: list[str], visual_faces: int | None = VISUAL_FACES,
                 cache: str | os.PathLike | None = None) -> list[Path]:
    """Every file building ``task_ids`` at ``visual_faces`` reads, relative to the cache root, sorted.

    Raises:
        ValueError: an unknown suite or task id.
        FileNotFoundError: a task is not in the cache, or a file its model names is missing (one
            line naming the setup command).
    """
    root = cache_dir(cache)
    absent = missing_tasks(task_ids, root)
    if absent:
        raise FileNotFoundError(f"LIBERO tasks {' '.join(absent)} are not in the cache {root}; "
                                f"{setup_hint(' '.join(absent))}")
    files: set[Path] = set()
    for task_id in task_ids:
        suite, index = parse_task_id(task_id)
        folder = root / suite / str(index)
        files.update(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
        files.update(model_files(folder / "model.xml", root, visual_faces))
    lost = sorted(str(f) for f in files if not f.is_file())
    if lost:
        raise FileNotFoundError(f"{len(lost)} files the LIBERO tasks {' '.join(task_ids)} name are missing from the "
                                f"cache {root} (first: {lost[0]}); {setup_hint(' '.join(task_ids))}")
    base = Path(os.path.normpath(root))
    outside = sorted(str(f) for f in files if not f.is_relative_to(base))
    if outside:
        raise ValueError(f"{len(outside)} files of the LIBERO tasks lie outside the cache {root} (first: {outside[0]}); "
                         "a bundle holds only the cache's files")
    return sorted(f.relative_to(base) for f in files)


def pack(task_ids: list[str], archive: str | os.PathLike, visual_faces: int | None = VISUAL_FACES,
         cache: str | os.PathLike | None = None) -> dict:
    """Write :func:`bundle_files` of ``task_ids`` into ``archive`` (xz-compressed if its name ends in
    ``.xz``), members relative to the cache root, in sorted order with zero times and owners (the same
    cache gives the same bytes).

    Returns: ``{"tasks": [...], "visual_faces": int | None, "files": int, "bytes": int (the files),
    "archive_bytes": int}``.

    Raises:
        ValueError, FileNotFoundError: as :func:`bundle_files`.
    """
    root = cache_dir(cache)
    files = bundle_files(task_ids, visual_faces, root)
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    mode, kw = ("w:xz", {"preset": 9}) if archive.name.endswith(".xz") else ("w", {})
    total = 0
    with tarfile.open(archive, mode, format=tarfile.PAX_FORMAT, **kw) as tar:
        for rel in files:
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mode = (root / rel).stat().st_size, 0o644  # the content, even behind a link
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)
            total += info.size
    return {"tasks": list(task_ids), "visual_faces": visual_faces, "files": len(files), "bytes": total,
            "archive_bytes": archive.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="the archive to write (.tar, or .tar.xz for xz)")
    parser.add_argument("tasks", nargs="+", help="task ids (spatial/0 ...)")
    parser.add_argument("--visual-faces", type=lambda v: None if v == "full" else int(v), default=VISUAL_FACES,
                        help="the LOD budget the tasks will be built at ('full': LIBERO's meshes)")
    args = parser.parse_args(argv)
    try:
        summary = pack(args.tasks, args.archive, args.visual_faces)
    except (ValueError, FileNotFoundError) as err:
        print(f"sims.libero.toolchain.bundle: {err}", file=sys.stderr)
        return 2
    print(f"{args.archive}: {summary['files']} files of {len(args.tasks)} tasks, {summary['bytes'] / 2**20:.1f} MiB "
          f"-> {summary['archive_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
