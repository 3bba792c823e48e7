"""A synthetic language-conditioned pointing task for the VLA: coloured squares, point at the named one."""

from __future__ import annotations

import torch
from tensordict import TensorDict

COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (50, 80, 230), "yellow": (230, 220, 40)}
TRAIN_TEMPLATES = ("go to the {} square", "move to the {} block", "reach the {} one")
HELDOUT_TEMPLATES = ("touch the {} cube", "head toward the {} box")
SIZE, CELL, SQUARE = 64, 16, 8


def instructions(templates: tuple[str, ...]) -> list[str]:
    """All template x colour strings; string ``i`` names colour ``i % len(COLOURS)``."""
    return [t.format(c) for t in templates for c in COLOURS]


def batch(
    n: int, templates: tuple[str, ...], generator: torch.Generator, with_squares: bool = False
) -> tuple[torch.Tensor, ...]:
    """``n`` images with 3 of the 4 colours at distinct cells of a 4x4 grid; instruction names one.

    Returns the observation (``rgb`` uint8 [n, 1, 3, 64, 64], ``proprio`` [n, 2] noise,
    ``instruction`` int64 [n], ``target_point`` [n, 1, 2]: the named square's centre in image
    coordinates in [-1, 1], x right, y down) and the target unit vector [n, 2] from the image centre to the
    named square (x right, y down); with ``with_squares`` also the unit vectors to all three
    shown squares [n, 3, 2] (what a policy blind to language could at best choose from).
    """
    colours = torch.tensor(list(COLOURS.values()), dtype=torch.uint8)
    palette = torch.rand(n, len(COLOURS), generator=generator).argsort(dim=1)[:, :3]  # colour ids shown
    cells = torch.rand(n, (SIZE // CELL) ** 2, generator=generator).argsort(dim=1)[:, :3]
    jitter = torch.randint(0, CELL - SQUARE + 1, (n, 3, 2), generator=generator)
    corner = torch.stack([cells % (SIZE // CELL), cells // (SIZE // CELL)], dim=-1) * CELL + jitter  # x, y
    grid = torch.arange(SIZE)
    inside_x = (grid >= corner[..., 0:1]) & (grid < corner[..., 0:1] + SQUARE)  # [n, 3, W]
    inside_y = (grid >= corner[..., 1:2]) & (grid < corner[..., 1:2] + SQUARE)  # [n, 3, H]
    mask = inside_y.unsqueeze(-1) & inside_x.unsqueeze(-2)  # [n, 3, H, W]
    rgb = torch.full((n, 3, SIZE, SIZE), 90, dtype=torch.uint8)
    for k in range(3):
        rgb = torch.where(mask[:, k].unsqueeze(1), colours[palette[:, k]].view(n, 3, 1, 1), rgb)
    named = torch.randint(0, 3, (n,), generator=generator)
    colour = palette[torch.arange(n), named]
    template = torch.randint(0, len(templates), (n,), generator=generator)
    centres = corner.float() + SQUARE / 2 - SIZE / 2
    squares = centres / centres.norm(dim=-1, keepdim=True)
    target = squares[torch.arange(n), named]
    obs = TensorDict(
        {
            "rgb": rgb.unsqueeze(1),
            "proprio": torch.randn(n, 2, generator=generator),
            "instruction": template * len(COLOURS) + colour,
            "target_point": (centres[torch.arange(n), named] / (SIZE / 2)).unsqueeze(1),
        },
        batch_size=[n],
    )
    return (obs, target, squares) if with_squares else (obs, target)
