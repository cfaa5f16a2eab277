"""Turns run_suite.py's results.json into BENCHMARKS.md and one SVG chart per suite.

    python3 benchmarks/report.py build-bench/suite/results.json docs

The markdown lists, for every workload, xgrad's fastest implementation against the fastest peer
(LibTorch, PyTorch eager and torch.compile, JAX eager and jit, MindSpore PyNative and GRAPH),
and says plainly where xgrad is behind; then each suite's times (median over the rounds, with
min-max), its targets met or missed (TARGETS), heap allocations per call and peak memory. A chart shows, per workload, each side's
time divided by xgrad's fastest on a log axis: bars left of 1 are faster than xgrad.
"""

import html
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import BY_KEY, PEER_REFERENCES, SUITES  # noqa: E402

# Every side, in table order: (id, label, chart colour). Peers are the sides after the references.
SIDES = [
    ("xgrad:eager", "xgrad eager", "#7fb2e5"),
    ("xgrad:jit_O0", "xgrad jit O0", None),
    ("xgrad:jit_O1", "xgrad jit O1", None),
    ("xgrad:jit_O2", "xgrad jit O2", "#1f5fa8"),
    ("xgrad-thrust:eager", "xgrad thrust eager", "#a9cce3"),
    ("xgrad-thrust:jit_O0", "xgrad thrust jit O0", None),
    ("xgrad-thrust:jit_O1", "xgrad thrust jit O1", None),
    ("xgrad-thrust:jit_O2", "xgrad thrust jit O2", "#5d8aa8"),
    ("xgrad:dp_1x2", "xgrad 1 process x 2 threads", "#1f5fa8"),
    ("xgrad:dp_2x1", "xgrad 2 processes x 1 thread", "#7fb2e5"),
    ("ref:hand", "hand loop", "#9a9a9a"),
    ("ref:openblas", "OpenBLAS", "#9a9a9a"),
    ("ref:loop", "xgrad loop of grad", "#9a9a9a"),
    ("ref:forward", "xgrad forward", "#9a9a9a"),
    ("ref:fd_pair", "xgrad finite difference", "#c8c8c8"),
    ("libtorch", "LibTorch", "#e8743b"),
    ("pytorch:eager", "PyTorch eager", "#f5b041"),
    ("pytorch:compile", "torch.compile", "#c0392b"),
    ("pytorch:loop", "PyTorch loop of grad", "#fad7a0"),
    ("jax:eager", "JAX eager", "#82c99b"),
    ("jax:jit", "JAX jit", "#1e8449"),
    ("mindspore:pynative", "MindSpore PyNative", "#c39bd3"),
    ("mindspore:graph", "MindSpore GRAPH", "#6c3483"),
]
LABEL = {side: label for side, label, _ in SIDES}
XGRAD = [s for s, _, _ in SIDES if s.startswith("xgrad")]
# A peer's references (its loop of gradients) are baselines, not the peer's own implementation.
PEER_REFERENCE_SIDES = [f"{peer}:{mode}" for peer, modes in PEER_REFERENCES.items() for mode in modes]
PEERS = [s for s, _, _ in SIDES if not s.startswith(("xgrad", "ref:")) and s not in PEER_REFERENCE_SIDES]
# The tables leave out the Thrust device's O0 and O1 (results.json has them) and the data_parallel
# suite's sides, which that suite alone has (and only they: its comparison is xgrad's two launches).
TABLE_SIDES = [s for s, _, _ in SIDES
               if not (s.startswith("xgrad-thrust:") and s.endswith(("O0", "O1"))) and not s.startswith("xgrad:dp_")]
OWN_SIDES = {"data_parallel": ["xgrad:dp_1x2", "xgrad:dp_2x1"]}


def side_of(impl, device):
    """The side of an xgrad_bench row: its impl on a device ("eager", "thrust") -> "xgrad-thrust:eager"."""
    if impl == "libtorch":
        return impl
    if impl.startswith(("eager", "jit_")):
        return ("xgrad:" if device == "cpu" else f"xgrad-{device}:") + impl
    return f"ref:{impl}"


def peer_of(side):
    return side.split(":")[0]


def format_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def format_count(value):
    if value is None:
        return "–"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def absent(results, side, entry):
    """Why a side has no time for a workload ("not installed", "n/a", ...), or None if it has one."""
    if side in entry["sides"] and "median_ns" in entry["sides"][side]:
        return None
    if side == "libtorch" and not results["libtorch_built"]:
        return "not installed"
    if side.startswith("xgrad-") and side.split(":")[0][len("xgrad-"):] not in results["devices"]:
        return "not built"
    if side in PEER_REFERENCE_SIDES and side.split(":")[1] not in entry.get("references", []):
        return "n/a"
    if side != "libtorch" and not side.startswith(("xgrad", "ref:")):
        status = results["peers"][peer_of(side)]["status"]
        if status != "installed":
            return status
    got = entry["sides"].get(side)
    if got is None or "unsupported" in got:
        return "n/a"
    return "error" if "error" in got else "missing"


def fastest(entry, sides):
    timed = [(entry["sides"][s]["median_ns"], s) for s in sides if "median_ns" in entry["sides"].get(s, {})]
    return min(timed) if timed else None


def verdict(entry):
    """(xgrad best, best peer, ratio, words) for a workload; None parts where a side is missing.
    For the compile suite xgrad's side is its default level, O2, not the fastest (O0 optimizes nothing)."""
    mine = fastest(entry, ["xgrad:jit_O2"] if entry["suite"] == "compile" else XGRAD)
    theirs = fastest(entry, PEERS)
    if mine is None or theirs is None:
        return mine, theirs, None, "no peer measured" if mine else "xgrad not measured"
    ratio = mine[0] / theirs[0]
    if ratio <= 1:
        words = f"ahead: {1 / ratio:.2f}x faster than {LABEL[theirs[1]]}" if ratio > 0.01 else \
            f"ahead: {1 / ratio:.0f}x faster than {LABEL[theirs[1]]}"
    elif ratio < 1.01:  # "1.00x slower" would read as a tie
        words = f"**behind {LABEL[theirs[1]]} by {100 * (ratio - 1):.1f}%**"
    else:
        words = f"**behind {LABEL[theirs[1]]}: {ratio:.2f}x slower**"
    return mine, theirs, ratio, words


def time_cell(results, side, entry):
    why = absent(results, side, entry)
    if why:
        return why
    got = entry["sides"][side]
    return f"{format_time(got['median_ns'])}<br><sub>{format_time(got['min_ns'])} – {format_time(got['max_ns'])}</sub>"


def markdown(results, chart_dir_name):
    machine = results["machine"]
    lines = [
        "# xgrad benchmarks",
        "",
        "<!-- Generated by benchmarks/report.py from the suite's results.json: edit the generator, not this file. -->",
        "",
        f"Generated {results['date']} by `{results['command']}`"
        f" ({results['rounds']} rounds, {results['min_time_s']} s per measurement, {results['seconds']} s in all"
        f"{', quick mode' if results['quick'] else ''}); xgrad's rows on {' and '.join(results['devices'])}"
        f"{' (Thrust on the host: its OpenMP or serial system)' if 'thrust' in results['devices'] else ''}."
        " The CUDA build (`-DXGRAD_THRUST_SYSTEM=CUDA`) has no GPU here: its figures on an NVIDIA H200"
        " (scripts/gpu_check.sh) are in BENCHMARK_HISTORY.md, \"GPU\"; compile times in COMPILE_TIME.md."
        " `--devices cpu,thrust` picks xgrad's devices.",
        "",
        f"Machine: {machine['cpu']}, {machine['cpus']} CPUs ({machine['threads_per_core']} thread(s) per core)"
        f"{', AVX-512' if machine['flags_avx512'] else ''}; {machine['caches']}; Linux {machine['kernel']};"
        f" {machine['compiler']}; xgrad {machine['commit']}.",
        "",
        "Peers: LibTorch (C++, Debian's libtorch-dev) "
        + ("built" if results["libtorch_built"] else "not installed")
        + "; "
        + "; ".join(f"{name} {info.get('version', '')} ({info['status']})".replace("  ", " ")
                    for name, info in results["peers"].items())
        + ". `benchmarks/peers/setup_venv.sh` installs the Python peers.",
        "",
        "How to read: every time is the median over the rounds (min – max below it), wall clock per call, on the",
        "workload's thread count; the rounds alternate all sides (A B C A B C ...), so a drifting machine moves them",
        "alike. *allocs* are heap allocations (malloc and friends) per call, *peak* the resident memory the workload",
        "needs (inputs, warm-up and loop) in MiB. benchmarks/README.md defines every workload and counter;",
        "docs/BENCHMARK_HISTORY.md keeps the analyses and figures of earlier sessions.",
        "",
    ]
    for problem in results["problems"]:
        lines += [f"> Problem during the run: {problem.splitlines()[0]}", ""]

    lines += ["## xgrad against the fastest peer", "",
              "xgrad's fastest implementation (eager or a jit level, on either device; for `compile`, jit O2) against",
              "the fastest peer implementation (LibTorch, PyTorch eager or torch.compile, JAX eager or jit, MindSpore",
              "PyNative or GRAPH). Below 1, xgrad takes less time.", "",
              "| workload | xgrad's fastest | fastest peer | xgrad / peer time | verdict |", "|---|---|---|---|---|"]
    for key, entry in results["workloads"].items():
        if entry["suite"] in OWN_SIDES or entry["suite"] == "roofline":
            continue
        mine, theirs, ratio, words = verdict(entry)
        lines.append("| " + " | ".join([
            f"`{key}`",
            f"{LABEL[mine[1]]} {format_time(mine[0])}" if mine else "–",
            f"{LABEL[theirs[1]]} {format_time(theirs[0])}" if theirs else "–",
            f"{ratio:.2f}" if ratio and ratio >= 0.01 else f"{ratio:.2g}" if ratio else "–", words]) + " |")
    lines.append("")

    lines += headline(results)
    lines += roofline_section(results)
    lines += regressions_section(results)
    for suite, description in SUITES.items():
        entries = {k: e for k, e in results["workloads"].items() if e["suite"] == suite}
        if not entries:
            continue
        sides = [s for s in OWN_SIDES.get(suite, TABLE_SIDES) if any(absent(results, s, e) != "n/a" for e in entries.values())]
        lines += [f"## {suite}", "", description + ".", "", f"![{suite}]({chart_dir_name}/{suite}.svg)", ""]
        lines += ["| workload | " + " | ".join(LABEL[s] for s in sides) + " |", "|---" * (len(sides) + 1) + "|"]
        for key, entry in entries.items():
            name = f"`{key.split('/')[1]}`<br><sub>{html.escape(entry['what'])}</sub>"
            lines.append("| " + " | ".join([name] + [time_cell(results, s, entry) for s in sides]) + " |")
        if suite in OWN_SIDES:
            lines += [""] + data_parallel_summary(entries)
            continue
        lines += targets(results, suite)
        lines += ["", "allocs / call · peak MiB:", ""]
        lines += ["| workload | " + " | ".join(LABEL[s] for s in sides) + " |", "|---" * (len(sides) + 1) + "|"]
        for key, entry in entries.items():
            cells = []
            for side in sides:
                got = entry["sides"].get(side, {})
                if "median_ns" not in got:
                    cells.append("–")
                    continue
                peak = got.get("peak_MiB")
                cells.append(f"{format_count(got.get('allocs'))} · {'–' if peak is None else f'{peak:.1f}'}")
            lines.append("| " + " | ".join([f"`{key.split('/')[1]}`"] + cells) + " |")
        lines.append("")
    return "\n".join(lines)


def data_parallel_summary(entries):
    """Per workload: 2 processes' step time over 1 process's, and each side's comm share."""
    lines = ["2 processes x 1 thread against 1 process x 2 threads (same global batch), and the part of the step",
             "a rank spends in collectives (comm share, waiting included):", "",
             "| workload | 2x1 / 1x2 time | comm share, 1x2 | comm share, 2x1 |", "|---|---|---|---|"]
    for key, entry in entries.items():
        one, two = entry["sides"].get("xgrad:dp_1x2", {}), entry["sides"].get("xgrad:dp_2x1", {})
        ratio = f"{two['median_ns'] / one['median_ns']:.2f}" if "median_ns" in one and "median_ns" in two else "–"

        def share(side):
            value = side.get("comm_share")
            return "–" if value is None else f"{100 * value:.0f}%"
        lines.append(f"| `{key.split('/')[1]}` | {ratio} | {share(one)} | {share(two)} |")
    return lines + [""]


# A suite's targets, as the ratio of two sides' times on a workload: (workload, side, reference side, what is
# compared, the largest ratio that meets the target, or None for a row that gives context).
TARGETS = {"transforms": [
    ("transforms/per_example_grads_mlp_b64", "xgrad:eager", "ref:loop",
     "vmap(grad) at least 10x faster than a loop of grad", 0.1),
    ("transforms/per_example_grads_mlp_b64", "xgrad:jit_O2", "ref:loop", "the same, jit(vmap(grad))", None),
    ("transforms/per_example_grads_mlp_b64", "pytorch:eager", "pytorch:loop",
     "PyTorch: torch.func.vmap against its loop of torch.autograd.grad", None),
    ("transforms/per_example_grads_mlp_b64", "xgrad:eager", "pytorch:eager",
     "vmap(grad) not slower than torch.func.vmap", 1.0),
    ("transforms/jvp_mlp_b64", "xgrad:eager", "ref:forward", "jvp within 1.5x of one forward call", 1.5),
    ("transforms/jvp_mlp_b64", "xgrad:eager", "ref:fd_pair", "jvp against a finite difference's two forward calls",
     None),
]}


def targets(results, suite):
    """The suite's TARGETS as a table, each met or missed (nothing for a suite without targets)."""
    rows = [t for t in TARGETS.get(suite, []) if t[0] in results["workloads"]]
    if not rows:
        return []
    lines = ["", "Targets, as time ratios (a row without a target gives context):", "",
             "| workload | compared | time / reference time | target | verdict |", "|---|---|---|---|---|"]
    for key, side, reference, what, limit in rows:
        entry = results["workloads"][key]
        times = [entry["sides"].get(s, {}).get("median_ns") for s in (side, reference)]
        if None in times:
            measured, verdict = "not measured", "–"
        else:
            ratio = times[0] / times[1]
            measured = (f"{LABEL[side]} {format_time(times[0])} / {LABEL[reference]} {format_time(times[1])}"
                        f" = {ratio:.2f}")
            verdict = "–" if limit is None else "met" if ratio <= limit else "**missed**"
        lines.append(f"| `{key.split('/')[1]}` | {what} | {measured} | "
                     f"{'–' if limit is None else f'at most {limit:g}'} | {verdict} |")
    return lines


# Suites whose jit rows time compiling, where a higher level is expected to take longer.
COMPILE_SUITES = {"compile"}
JIT_LEVELS = ["jit_O0", "jit_O1", "jit_O2"]


def level_regressions(results, margin=1.05):
    """Rows where a jit level is slower than a lower level on the same device beyond noise: its
    median more than `margin` times the lower level's, and its fastest round slower than the lower
    level's slowest. [(workload, side, lower side, time ratio)], worst first."""
    found = []
    for key, entry in results["workloads"].items():
        if entry["suite"] in COMPILE_SUITES:
            continue
        for device in ("xgrad", "xgrad-thrust"):
            timed = {level: entry["sides"].get(f"{device}:{level}", {}) for level in JIT_LEVELS}
            for i, low in enumerate(JIT_LEVELS):
                for high in JIT_LEVELS[i + 1:]:
                    a, b = timed[low], timed[high]
                    if "median_ns" not in a or "median_ns" not in b:
                        continue
                    ratio = b["median_ns"] / a["median_ns"]
                    if ratio > margin and b["min_ns"] > a["max_ns"]:
                        found.append((key, f"{device}:{high}", f"{device}:{low}", ratio))
    return sorted(found, key=lambda row: -row[3])


def regressions_section(results):
    """The rule that a higher jit level is never slower than a lower one, and the rows breaking it."""
    rows = level_regressions(results)
    lines = ["## Jit levels: a higher level is never slower", "",
             "Every row where a jit level takes longer than a lower level of the same device beyond noise (its median",
             "over 1.05x the lower one's and its fastest round slower than the lower one's slowest; the compile suite,",
             "which times compiling, aside). The tests' quick run of the suite fails on a row over 2x that is over",
             "2x again when measured 3 rounds of 10 times longer (`run_suite.py --fail-on-level-regression 2`).", ""]
    if not rows:
        return lines + ["None in this run.", ""]
    lines += ["| workload | slower | than | time ratio |", "|---|---|---|---|"]
    for key, side, lower, ratio in rows:
        lines.append(f"| `{key}` | {LABEL[side]} | {LABEL[lower]} | **{ratio:.2f}** |")
    return lines + [""]


# The roofline suite's rows, by thread count: (peak FLOP/s row, bandwidth row).
LIMIT_ROWS = {1: ("roofline/fma_peak", "roofline/triad_2p24"), 2: ("roofline/fma_peak_t2", "roofline/triad_2p24_t2")}


def measured_limits(results):
    """{threads: (FLOP/s, bytes/s)} from this run's roofline rows (None where one was not run): each
    from the row's fastest round, as a limit is what the machine can do. Its median can be far
    below: in a disturbed run on 2 vCPUs, 2 threads' FMA chains took 574 us in most rounds and
    292 us in one, as fast as 1 thread's, and against that median LeNet5's step read 159% of peak."""
    def rate(key, work):
        side = results["workloads"].get(key, {}).get("sides", {}).get("ref:hand", {})
        return work / (side["min_ns"] * 1e-9) if "min_ns" in side else None

    return {threads: (rate(fma, BY_KEY[fma].flops), rate(triad, BY_KEY[triad].bytes))
            for threads, (fma, triad) in LIMIT_ROWS.items()}


def roofline_rows(results):
    """[(workload key, Workload, xgrad's fastest (ns, side), rate, share of the limit or None)] for every
    row with a FLOP or byte count: FLOP/s against the peak, or bytes/s against the bandwidth, at the
    row's thread count."""
    limits = measured_limits(results)
    rows = []
    for key, entry in results["workloads"].items():
        workload = BY_KEY.get(key)
        if workload is None or workload.suite == "roofline" or not (workload.flops or workload.bytes):
            continue
        mine = fastest(entry, XGRAD)
        if mine is None:
            continue
        peak, bandwidth = limits.get(workload.threads, (None, None))
        rate = (workload.flops or workload.bytes) / (mine[0] * 1e-9)
        limit = peak if workload.flops else bandwidth
        rows.append((key, workload, mine, rate, rate / limit if limit else None))
    return rows


def roofline_section(results):
    """Every compute-bound row's share of the measured FLOP/s peak, every memory-bound row's share of
    the measured bandwidth (nothing when the roofline suite did not run)."""
    limits = measured_limits(results)
    if not any(peak for peak, _ in limits.values()):
        return []
    said = "; ".join(f"{threads} thread{'s' if threads > 1 else ''}: "
                     + (f"{peak / 1e9:.1f} GFLOP/s" if peak else "FMA peak not measured") + ", "
                     + (f"{bandwidth / 1e9:.1f} GB/s" if bandwidth else "bandwidth not measured")
                     for threads, (peak, bandwidth) in limits.items())
    lines = ["## Roofline: each row against the machine's measured limits", "",
             f"Measured in this run (the `roofline` suite, its fastest round): {said}.", "",
             "A compute-bound row's rate is its FLOPs per",
             "call (matmuls and convolutions, a multiply-add counted as two; workloads.py) over xgrad's fastest time;",
             "a memory-bound row's is the bytes it must move at the least (each input read once, the output written",
             "once). A row whose data fits the caches can pass 100% of the (memory) bandwidth.",
             "", "![roofline](bench/roofline.svg)", "",
             "| workload | threads | work per call | xgrad's fastest | rate | share of the measured limit |",
             "|---|---|---|---|---|---|"]
    for key, workload, (ns, side), rate, share in roofline_rows(results):
        compute = bool(workload.flops)
        amount = workload.flops or workload.bytes
        scale, prefix = (1e9, "G") if amount >= 1e9 else (1e6, "M")
        work = f"{amount / scale:.3g} {prefix}{'FLOP' if compute else 'B'}"
        rate_text = f"{rate / 1e9:.1f} {'GFLOP/s' if compute else 'GB/s'}"
        share_text = "–" if share is None else f"{share * 100:.0f}% of {'peak FLOP/s' if compute else 'bandwidth'}"
        lines.append(f"| `{key}` | {workload.threads} | {work} | {LABEL[side]} {format_time(ns)} | {rate_text} | "
                     f"{share_text} |")
    return lines + [""]


def roofline_chart(results):
    """An SVG: each row's share of the measured limit (peak FLOP/s or bandwidth), as bars."""
    rows = [(key, bool(w.flops), share) for key, w, _, _, share in roofline_rows(results) if share is not None]
    left, plot, bar, head = 250, 500, 16, 46
    top = max([1.0] + [share for _, _, share in rows])
    height, width = head + len(rows) * bar + 34, left + plot + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           '<text x="10" y="18" font-size="14" font-weight="bold">roofline: xgrad\'s fastest as a share of the '
           'measured peak FLOP/s (dark) or bandwidth (light)</text>',
           f'<text x="10" y="34" fill="#555">{html.escape(results["machine"]["cpu"])}, {results["date"]}</text>']
    for tick in [i / 4 for i in range(int(top * 4) + 1)]:
        x = left + plot * tick / top
        out.append(f'<line x1="{x:.1f}" y1="{head - 4}" x2="{x:.1f}" y2="{height - 24}" '
                   f'stroke="{"#333" if tick == 1 else "#ddd"}"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle" fill="#555">{tick * 100:.0f}%</text>')
    y = head
    for key, compute, share in rows:
        out.append(f'<text x="{left - 6}" y="{y + bar - 4}" text-anchor="end">{html.escape(key)}</text>')
        out.append(f'<rect x="{left}" y="{y + 1}" width="{max(plot * share / top, 1):.1f}" height="{bar - 3}" '
                   f'fill="{"#1f5fa8" if compute else "#7fb2e5"}"><title>{share * 100:.0f}%</title></rect>')
        out.append(f'<text x="{left + plot * share / top + 4:.1f}" y="{y + bar - 4}" fill="#333">'
                   f'{share * 100:.0f}%</text>')
        y += bar
    out.append("</svg>")
    return "\n".join(out) + "\n"


# The seed notebook's question, asked of every framework: how much faster is the LeNet5 train step
# compiled than op by op? (eager side, compiled side) per framework.
HEADLINE_PAIRS = [("xgrad", "xgrad:eager", "xgrad:jit_O2"), ("MindSpore", "mindspore:pynative", "mindspore:graph"),
                  ("PyTorch", "pytorch:eager", "pytorch:compile"), ("JAX", "jax:eager", "jax:jit")]


def headline(results):
    entries = {k: e for k, e in results["workloads"].items() if e["suite"] == "lenet5_step"}
    if not entries:
        return []
    lines = ["## The seed's headline: LeNet5, compiled against eager", "",
             "The seed notebook times MindSpore's LeNet5 train step in PyNative and in GRAPH_MODE on Fashion-MNIST;",
             "here every framework runs that step on the same batch, op by op and compiled (xgrad: eager and jit O2).",
             "", "| framework | workload | eager | compiled | compiled is faster by |", "|---|---|---|---|---|"]
    for key, entry in entries.items():
        for framework, eager, compiled in HEADLINE_PAIRS:
            cells = [time_cell(results, eager, entry), time_cell(results, compiled, entry)]
            both = all("median_ns" in entry["sides"].get(side, {}) for side in (eager, compiled))
            speedup = (entry["sides"][eager]["median_ns"] / entry["sides"][compiled]["median_ns"]) if both else None
            lines.append(f"| {framework} | `{key.split('/')[1]}` | " + " | ".join(cells) +
                         f" | {f'{speedup:.2f}x' if speedup else '–'} |")
    return lines + [""]


# ---- charts ---------------------------------------------------------------------------------------

CHART_SIDES = [(s, label, colour) for s, label, colour in SIDES if colour]


def chart(results, suite):
    """An SVG: per workload, each side's time / xgrad's fastest, as bars from 1 on a log axis."""
    entries = {k: e for k, e in results["workloads"].items() if e["suite"] == suite}
    rows = []  # (workload label, [(side label, colour, ratio or None, why)])
    ratios = [1.0]
    for key, entry in entries.items():
        mine = fastest(entry, XGRAD)
        bars = []
        for side, label, colour in CHART_SIDES:
            if (side in OWN_SIDES.get(suite, [])) != (suite in OWN_SIDES):
                continue
            why = absent(results, side, entry)
            if why == "n/a":
                continue
            ratio = entry["sides"][side]["median_ns"] / mine[0] if (why is None and mine) else None
            if ratio:
                ratios.append(ratio)
            bars.append((label, colour, ratio, why or "xgrad not measured"))
        rows.append((key.split("/")[1], bars))
    low = 10 ** math.floor(math.log10(min(ratios)) - 1e-9)
    high = 10 ** math.ceil(math.log10(max(ratios)) + 1e-9)
    if low == high:
        low, high = low / 10, high * 10

    left, plot, bar, gap, head = 170, 600, 13, 14, 52
    height = head + sum(18 + len(bars) * bar + gap for _, bars in rows) + 30
    width = left + plot + 70

    def x_of(ratio):
        return left + plot * (math.log10(ratio) - math.log10(low)) / (math.log10(high) - math.log10(low))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="14" font-weight="bold">{html.escape(suite)}: time relative to xgrad\'s '
           f'fastest (log scale; left of 1 = faster than xgrad)</text>',
           f'<text x="10" y="34" fill="#555">{html.escape(results["machine"]["cpu"])}, {results["date"]}; '
           f'median of {results["rounds"]} alternating rounds</text>']
    decade = low
    while decade <= high * 1.0001:
        x = x_of(decade)
        out.append(f'<line x1="{x:.1f}" y1="{head - 6}" x2="{x:.1f}" y2="{height - 24}" '
                   f'stroke="{"#333" if decade == 1 else "#ddd"}" stroke-width="{1.5 if decade == 1 else 1}"/>')
        out.append(f'<text x="{x:.1f}" y="{height - 10}" text-anchor="middle" fill="#555">{decade:g}</text>')
        decade *= 10
    y = head
    for workload, bars in rows:
        out.append(f'<text x="10" y="{y + 12}" font-weight="bold">{html.escape(workload)}</text>')
        y += 18
        for label, colour, ratio, why in bars:
            out.append(f'<text x="{left - 6}" y="{y + bar - 3}" text-anchor="end">{html.escape(label)}</text>')
            if ratio is None:
                out.append(f'<text x="{x_of(1) + 4:.1f}" y="{y + bar - 3}" fill="#999">{html.escape(why)}</text>')
            else:
                x0, x1 = sorted((x_of(1), x_of(ratio)))
                out.append(f'<rect x="{x0:.1f}" y="{y + 1}" width="{max(x1 - x0, 1):.1f}" height="{bar - 2}" '
                           f'fill="{colour}"><title>{html.escape(label)}: {ratio:.3g}x</title></rect>')
                out.append(f'<text x="{x1 + 4 if ratio >= 1 else x1 - 4:.1f}" y="{y + bar - 3}" '
                           f'text-anchor="{"start" if ratio >= 1 else "end"}" fill="#333">{ratio:.2g}x</text>')
            y += bar
        y += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_atomically(path, text):
    """Writes path through a temporary file and a rename, so a reader never sees half a file."""
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        file.write(text)
    os.replace(temporary, path)


def write(results, docs_dir):
    """Writes BENCHMARKS.md and bench/<suite>.svg under docs_dir; returns the paths."""
    chart_dir = os.path.join(docs_dir, "bench")
    os.makedirs(chart_dir, exist_ok=True)
    written = []
    for suite in SUITES:
        if any(e["suite"] == suite for e in results["workloads"].values()):
            path = os.path.join(chart_dir, f"{suite}.svg")
            write_atomically(path, roofline_chart(results) if suite == "roofline" else chart(results, suite))
            written.append(path)
    path = os.path.join(docs_dir, "BENCHMARKS.md")
    write_atomically(path, markdown(results, "bench"))
    return [path] + written


if __name__ == "__main__":
    import json

    if len(sys.argv) != 3:
        sys.exit("usage: report.py RESULTS_JSON DOCS_DIR")
    with open(sys.argv[1]) as source:
        print("\n".join(write(json.load(source), sys.argv[2])))
