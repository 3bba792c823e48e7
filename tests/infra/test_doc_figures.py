"""The scheduler figures README.md, docs/results.md and docs/scheduler.md quote equal the committed JSONs
they cite (as printed: rounded to the digits shown), and every row of docs/results.md names its command
and links a JSON that exists (or says it has none). Needs no trace: the JSONs are in docs/figures/."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()
SCHEDULER = (ROOT / "docs" / "scheduler.md").read_text()
FIGURES = ROOT / "docs" / "figures"
NUMBER = r"[-+]?\d[\d,]*\.?\d*"


def results(path: str) -> dict:
    return json.loads((FIGURES / path).read_text())["results"]


def table(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped of ``**``) of the markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header_start)), None)
    assert start is not None, f"no table starting {header_start!r}: update the test with the docs"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in line.strip("|").split("|")])
    return rows


def numbers(cell: str) -> list[str]:
    return re.findall(NUMBER, cell)


def printed(value: float, shown: str) -> bool:
    """``value`` rounded to the digits of ``shown`` is ``shown`` (half-way cases either way)."""
    digits = len(shown.partition(".")[2])
    return abs(value - float(shown.replace(",", ""))) <= 0.5 * 10**-digits + 1e-9


def delta_printed(ours: float, theirs: float, shown: str) -> bool:
    """A printed difference: of the raw means or of the means as printed (2 decimals)."""
    return printed(ours - theirs, shown) or printed(round(ours, 2) - round(theirs, 2), shown)


def check_mean_std(cell: str, r: dict, key: str) -> None:
    mean, std = numbers(cell)[:2]
    assert printed(r[f"{key}_mean"], mean) and printed(r[f"{key}_std"], std), (cell, key, r[f"{key}_mean"])


VARIANT_HEADER = "| workload | fgd @100 | **fgd-strand @100** | fgd @130 |"


def test_variant_table_equals_its_jsons():
    rows = table(SCHEDULER, VARIANT_HEADER)
    assert len(rows) == 8
    for workload, f100, s100, f130, s130, frag, failed in rows:
        r = results(f"scheduler_variants/{re.sub('[:.]', '_', workload)}.json")
        fgd, ours = r["fgd"], r["fgd-strand"]
        for cell, res, key in ((f100, fgd, "alloc_pct_at_100"), (s100, ours, "alloc_pct_at_100"),
                               (f130, fgd, "alloc_pct_at_130"), (s130, ours, "alloc_pct_at_130")):
            check_mean_std(cell, res, key)
        for cell, key in ((s100, "alloc_pct_at_100_mean"), (s130, "alloc_pct_at_130_mean")):
            assert delta_printed(ours[key], fgd[key], numbers(cell)[2]), (workload, cell)
        frag_f, frag_o = numbers(frag)
        assert printed(fgd["frag_pct_at_100_mean"], frag_f) and printed(ours["frag_pct_at_100_mean"], frag_o)
        fail_f, fail_o = numbers(failed)
        assert round(fgd["failed_pods_mean"]) == int(fail_f) and round(ours["failed_pods_mean"]) == int(fail_o)


def summary_rows() -> dict[str, list[str]]:
    """The constrained-workload table of docs/scheduler.md by workload key of summary.json."""
    rows = table(SCHEDULER, "| workload | fgd | **fgd-strand** | fgd-strand@c933b0c |")
    return {row[0].split(" ")[0]: row[1:] for row in rows}


def test_constrained_workload_table_equals_the_summary_json():
    summary = results("scheduler_gpuspec/summary.json")
    rows = summary_rows()
    assert set(rows) == set(summary) and len(rows) == 9
    for workload, (fgd, ours, before) in rows.items():
        r = summary[workload]
        check_mean_std(fgd, r["fgd"], "alloc_pct_at_100")
        check_mean_std(ours, r["fgd-strand"], "alloc_pct_at_100")
        key = "alloc_pct_at_100_mean"
        assert delta_printed(r["fgd-strand"][key], r["fgd"][key], numbers(ours)[2]), workload
        if "fgd-strand@c933b0c" in r:
            check_mean_std(before, r["fgd-strand@c933b0c"], "alloc_pct_at_100")
            assert delta_printed(r["fgd-strand@c933b0c"][key], r["fgd"][key], numbers(before)[2]), workload


def test_readme_headline_equals_the_json():
    row = next(line for line in README.splitlines() if "alloc % at 100 % arrival" in line)
    default = results("scheduler_variants/default.json")
    ours, fgd = re.search(r"`fgd-strand` (\S+) vs FGD (\S+);", row).groups()
    assert printed(default["fgd-strand"]["alloc_pct_at_100_mean"], ours)
    assert printed(default["fgd"]["alloc_pct_at_100_mean"], fgd)
    ratio, submit, cpu = re.search(r"`submit` p99 .*\| (\S+)x FGD \((\S+) ms on a 2-core (.+?), load", README).groups()
    bench = json.loads((FIGURES / "bench" / "bench_scheduler_quiet.json").read_text())
    assert printed(bench["results"]["fill"]["ratio_submit_latency_p99_ms_vs_fgd"], ratio)
    assert printed(bench["results"]["fill"]["submit_latency_p99_ms"], submit)
    assert bench["machine"]["cpu_model"] == cpu


def test_results_scheduler_table_equals_the_json_and_the_scheduler_page():
    rows = {r[0].split(" ")[0]: r[1:] for r in table(RESULTS, "| policy | alloc % at 100 % arrived (FGD simulator)")}
    assert list(rows) == ["random", "bestfit", "fgd", "fgd-strand"]
    default = results("scheduler_variants/default.json")
    for policy in ("fgd", "fgd-strand"):
        for cell, key in zip(rows[policy], ("alloc_pct_at_100_mean", "alloc_pct_at_130_mean")):
            assert printed(default[policy][key], numbers(cell)[0]), (policy, cell)
    gap = numbers(rows["fgd-strand"][0])[1]  # "(+0.51 over FGD)"
    assert delta_printed(default["fgd-strand"]["alloc_pct_at_100_mean"], default["fgd"]["alloc_pct_at_100_mean"], gap)
    # Random and bestfit have no committed JSON: the README quotes the scheduler page's table.
    page = {r[0]: r for r in table(SCHEDULER, "| policy | alloc % @100% arrived | FGD simulator |")}
    for policy in ("random", "bestfit", "fgd"):
        ours100, sim100, ours130, sim130 = page[policy][1:5]
        assert numbers(rows[policy][0]) == [numbers(ours100)[0], sim100], policy
        assert numbers(rows[policy][1]) == [numbers(ours130)[0], sim130], policy
    for policy in ("fgd", "fgd-strand"):  # the page's rows of the two policies are the JSON's too
        check_mean_std(page[policy][1], default[policy], "alloc_pct_at_100")
        check_mean_std(page[policy][3], default[policy], "alloc_pct_at_130")


def test_results_variant_gains_equal_the_summary_json():
    summary = results("scheduler_gpuspec/summary.json")
    key = "alloc_pct_at_100_mean"
    means = {w: (r["fgd-strand"][key], r["fgd"][key]) for w, r in summary.items()}
    rows = table(RESULTS, "| workload | fgd-strand - fgd |")
    *per_workload, average = rows
    shown = {row[0].split(" ")[0]: row[1] for row in per_workload}
    assert set(shown) == set(means) - {"default"}, "docs/results.md's gain table lists other workloads than summary.json"
    for workload, gain in shown.items():
        assert delta_printed(*means[workload], gain), (workload, gain)
    assert average[0].startswith("average over the nine workloads"), average
    raw = np.mean([a - b for a, b in means.values()])
    as_printed = np.mean([round(a, 2) - round(b, 2) for a, b in means.values()])
    assert len(means) == 9 and (printed(float(raw), average[1]) or printed(float(as_printed), average[1])), average


@pytest.mark.parametrize("text", [RESULTS, SCHEDULER], ids=["results.md", "scheduler.md"])
def test_latency_figures_equal_their_jsons(text):
    bench = results("bench/bench_scheduler_quiet.json")
    replay = results("bench/replay_latency_1523_nodes_seed42.json")
    if text is RESULTS:
        speed = {row[0].split(",")[0]: re.findall(r"([\d.]+) m?s\b", row[1])
                 for row in table(text, "| speed | value (target) | command | JSON |") if row[3] != "no JSON kept"}
        quoted = speed["policy decision"][:3]  # fgd-strand p50, p99; FGD p99
        submit, release, dynamic = (speed[k][0] for k in ("`submit` over the whole inflated fill", "`release` while ~980 gangs wait",
                                                          "dynamic replay of the whole trace's arrivals and departures"))
        assert printed(replay["fgd-strand"]["replay_seconds_per_seed"], speed["one whole replay (10.8k pods)"][0])
    else:
        quoted = re.search(r"fgd-strand p50 (\S+) ms, \*\*p99 (\S+) ms\*\*.*?FGD\s+p50 \S+ ms, p99 (\S+) ms",
                           text, re.S).groups()
        submit, release, dynamic = re.search(
            r"whole inflated fill .*?\*\*p99 (\S+) ms\*\*.*?\*\*p99 (\S+) ms\*\*.*?\| \*\*(\S+) s\*\*", text, re.S
        ).groups()
    p50, p99, fgd_p99 = quoted
    assert printed(replay["fgd-strand"]["decision_latency_p50_ms"], p50)
    assert printed(replay["fgd-strand"]["decision_latency_p99_ms"], p99)
    assert printed(replay["fgd"]["decision_latency_p99_ms"], fgd_p99)
    assert printed(bench["fill"]["submit_latency_p99_ms"], submit)
    assert printed(bench["release"]["release_latency_p99_ms"], release)
    assert printed(bench["dynamic"]["speedup_1"]["wall_s"], dynamic)


LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")


def local_links(text: str) -> list[str]:
    return [target for target in LINK.findall(text) if "://" not in target]


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md"])
def test_every_local_link_exists(doc):
    path = ROOT / doc
    missing = [t for t in local_links(path.read_text()) if not (path.parent / t).exists()]
    assert not missing, f"{doc} links files that do not exist: {missing}"


def figure_rows() -> list[list[str]]:
    """Body rows of every docs/results.md table whose last two columns are ``command | JSON``."""
    rows, in_table = [], False
    for line in RESULTS.splitlines():
        if line.startswith("|") and line.rstrip().endswith("| command | JSON |"):
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif not line.startswith("|"):
            in_table = False
    return rows


def test_every_results_row_names_its_command_and_a_json_or_none():
    rows = figure_rows()
    assert len(rows) > 50, "docs/results.md's figure tables changed shape: update figure_rows"
    for *figure, command, cell in rows:
        assert "`" in command, f"row {figure[0]!r}: give its whole command (not \"same\")"
        jsons = [t for t in local_links(cell) if t.endswith(".json")]
        assert jsons or "no JSON kept" in cell, f"row {figure[0]!r}: link its JSON or say 'no JSON kept'"
        for target in jsons:
            json.loads((ROOT / "docs" / target).read_text())  # a JSON that parses, not a renamed file
