#!/usr/bin/env python3
"""Checks that xgrad's headers include downwards only (CONTRIBUTING.md, "Layers").

Each folder of include/xgrad is a layer; a header may include headers of its own folder and of
the folders below it, never above. The umbrella headers at the top (xgrad/core.hpp, ...) may
include anything, but each pulls in only the layers it names, and xgrad/core.hpp no file
format (zlib). No header may reach itself through its includes. A definitions file x-inl.hpp is
included only by its x.hpp and by other definitions files, and in compiled mode (no x.hpp
including its x-inl.hpp) no umbrella reaches a kernel, xsimd or Thrust; nor does a library source
(src/) that the CUDA build compiles with the host compiler. Exits 1 and names every offending
include; run from anywhere:
    python3 scripts/check_layers.py [INCLUDE_DIR]
"""

import os
import re
import sys

# Lowest first. ir sits below backend because the backend runs graphs (the executor, fused
# groups); autograd's engine above ops because it sums and adds gradients with ops; the tape
# node that ops record onto lives in core; distributed's collectives are ops with gradient rules.
LAYERS = ["core", "ir", "backend", "ops", "autograd", "distributed", "passes", "jit", "nn", "data", "models"]

# What each umbrella header may pull in, all the way down: layers, and system headers it must not.
EAGER = {"core", "ir", "backend", "ops", "autograd"}
UMBRELLAS = {
    "xgrad/core.hpp": (EAGER, {"zlib.h"}),
    "xgrad/jit.hpp": (EAGER | {"passes", "jit"}, {"zlib.h"}),
    "xgrad/nn.hpp": (EAGER | {"distributed", "passes", "jit", "nn"}, set()),
    "xgrad/data.hpp": ({"core", "backend", "data"}, set()),
    "xgrad/distributed.hpp": (EAGER | {"distributed"}, {"zlib.h"}),
    "xgrad/xgrad.hpp": (set(LAYERS), set()),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def read_includes(root):
    """{header: [(included, is_xgrad)]} for every header under root/xgrad, paths relative to root."""
    graph = {}
    for folder, _, files in os.walk(os.path.join(root, "xgrad")):
        for name in files:
            if not name.endswith(".hpp"):
                continue
            path = os.path.join(folder, name)
            header = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                text = f.read()
            graph[header] = [(target, target.startswith("xgrad/")) for _, target in INCLUDE.findall(text)]
    return graph


def layer_of(header):
    """The folder under xgrad/, or None for a top-level (umbrella) header."""
    parts = header.split("/")
    return parts[1] if len(parts) > 2 else None


def upward_includes(graph):
    problems = []
    for header, includes in sorted(graph.items()):
        layer = layer_of(header)
        if layer is None:
            continue
        if layer not in LAYERS:
            problems.append(f"{header}: folder '{layer}' is not in the layer order (scripts/check_layers.py LAYERS)")
            continue
        for target, ours in includes:
            if not ours:
                continue
            if target not in graph:
                problems.append(f"{header}: includes {target}, which does not exist")
                continue
            target_layer = layer_of(target)
            if target_layer is None:
                problems.append(f"{header}: includes the umbrella header {target}; include the layer's headers")
            elif target_layer in LAYERS and LAYERS.index(target_layer) > LAYERS.index(layer):
                problems.append(f"{header}: includes {target}, which is in layer '{target_layer}' above '{layer}'")
    return problems


def definitions_of(header):
    """x.hpp's definitions file, x-inl.hpp."""
    return header[: -len(".hpp")] + "-inl.hpp"


def definitions_files(graph):
    """Each x-inl.hpp included by a header other than x.hpp that is not itself a definitions
    file. Definitions (y-inl.hpp, compiled into the library) may include those of their own
    layer and of the layers below (the pass that matches op::Mul needs the struct, in
    ops/elementwise-inl.hpp); a plain header never includes another's definitions, which would
    bring them back into users' files in compiled mode."""
    problems = []
    for header, includes in sorted(graph.items()):
        for target, ours in includes:
            if not ours or not target.endswith("-inl.hpp") or definitions_of(header) == target:
                continue
            if not header.endswith("-inl.hpp"):
                problems.append(
                    f"{header}: includes {target}, which only its own header and other definitions "
                    "(-inl.hpp) files may include")
    return problems


def cycles(graph):
    """Every include cycle, as the chain of headers that closes it (each reported once). The
    edge from x.hpp to its definitions x-inl.hpp does not count: that file includes x.hpp back."""
    problems, state, stack = [], {}, []

    def visit(header):
        state[header] = "open"
        stack.append(header)
        for target, ours in graph[header]:
            if not ours or target not in graph or target == definitions_of(header):
                continue
            if state.get(target) == "open":
                chain = stack[stack.index(target):] + [target]
                problems.append("include cycle: " + " -> ".join(chain))
            elif target not in state:
                visit(target)
        stack.pop()
        state[header] = "done"

    for header in sorted(graph):
        if header not in state:
            visit(header)
    return problems


def closure(graph, header):
    """(xgrad headers, system headers) that header pulls in, itself included."""
    seen, system, todo = set(), set(), [header]
    while todo:
        h = todo.pop()
        if h in seen or h not in graph:
            continue
        seen.add(h)
        for target, ours in graph[h]:
            if ours:
                todo.append(target)
            else:
                system.add(target)
    return seen, system


def umbrella_contents(graph):
    problems = []
    for umbrella, (layers, banned_system) in UMBRELLAS.items():
        if umbrella not in graph:
            problems.append(f"{umbrella}: missing")
            continue
        headers, system = closure(graph, umbrella)
        for h in sorted(headers):
            layer = layer_of(h)
            if layer is not None and layer not in layers:
                problems.append(f"{umbrella}: pulls in {h} (layer '{layer}'), which it should not")
        for s in sorted(system & banned_system):
            problems.append(f"{umbrella}: pulls in <{s}>, which it should not")
    return problems


# What a user's file must not parse in compiled mode (XGRAD_COMPILED: no x.hpp includes its
# x-inl.hpp), through any umbrella header: the kernels, xsimd and Thrust, so that it compiles
# fast, and with a plain C++ compiler in the CUDA build. Only definitions (x-inl.hpp, compiled
# into the library) reach them.
COMPILED_UMBRELLAS = sorted(UMBRELLAS)
BACKEND_ONLY = ("xgrad/backend/cpu/", "xgrad/backend/thrust/", "xgrad/backend/map.hpp", "xgrad/backend/kernels.hpp",
                "xgrad/backend/math.hpp")
BACKEND_ONLY_SYSTEM = ("xsimd/", "thrust/", "cub/")


def compiled_closure(graph, header):
    """closure() as compiled mode sees it: without the edges from x.hpp to its x-inl.hpp."""
    cut = {h: [(t, ours) for t, ours in inc if t != definitions_of(h)] for h, inc in graph.items()}
    return closure(cut, header)


def compiled_contents(graph):
    problems = []
    for umbrella in COMPILED_UMBRELLAS:
        if umbrella not in graph:
            continue
        headers, system = compiled_closure(graph, umbrella)
        for h in sorted(headers):
            if h.startswith(BACKEND_ONLY):
                problems.append(f"{umbrella}: pulls in {h} in compiled mode; only definitions (-inl.hpp) may")
        for s in sorted(system):
            if s.startswith(BACKEND_ONLY_SYSTEM):
                problems.append(f"{umbrella}: pulls in <{s}> in compiled mode; only definitions (-inl.hpp) may")
    return problems


# The CUDA build compiles the library's sources that instantiate Thrust kernels with nvcc (those
# CMakeLists.txt names in xgrad_device_sources(xgrad_compiled ...)) and the rest with the host
# compiler, which has no Thrust or CUB: those must not reach them through any header, as compiled
# mode reads them (each source includes the definitions it compiles, x.hpp no x-inl.hpp).
DEVICE_SOURCES = re.compile(r"xgrad_device_sources\(\s*xgrad_compiled\s+([^)]*)\)")
DEVICE_ONLY_SYSTEM = ("thrust/", "cub/")


def host_sources(repo):
    """The library's sources (src/*.cpp, relative to repo) that nvcc does not compile."""
    with open(os.path.join(repo, "CMakeLists.txt"), encoding="utf-8") as f:
        match = DEVICE_SOURCES.search(f.read())
    device = set(match.group(1).split()) if match else set()
    return [f"src/{name}" for name in sorted(os.listdir(os.path.join(repo, "src")))
            if name.endswith(".cpp") and f"src/{name}" not in device]


def host_source_contents(graph, repo):
    """One problem per host source that reaches Thrust or CUB, with the include chain to the
    first header that does."""
    cut = {h: [(t, ours) for t, ours in inc if t != definitions_of(h)] for h, inc in graph.items()}
    problems = []
    for source in host_sources(repo):
        with open(os.path.join(repo, source), encoding="utf-8") as f:
            todo = [(t, [t]) for _, t in INCLUDE.findall(f.read()) if t.startswith("xgrad/")]
        seen, offenders = set(), []
        while todo:  # breadth first: the shortest chain to each header
            header, chain = todo.pop(0)
            if header in seen or header not in cut:
                continue
            seen.add(header)
            if any(not ours and t.startswith(DEVICE_ONLY_SYSTEM) for t, ours in cut[header]):
                offenders.append(chain)
            todo.extend((t, chain + [t]) for t, ours in cut[header] if ours)
        if offenders:
            more = f" (and {len(offenders) - 1} more headers)" if len(offenders) > 1 else ""
            problems.append(f"{source}: reaches Thrust through {' -> '.join(offenders[0])}{more}; the CUDA build "
                            "compiles it with the host compiler (only the sources in "
                            "xgrad_device_sources(xgrad_compiled ...) may reach Thrust)")
    return problems


def check(root, repo=None):
    """The problems of the include tree at root; with repo (holding CMakeLists.txt and src/), also
    those of the library's host sources."""
    graph = read_includes(root)
    problems = (upward_includes(graph) + definitions_files(graph) + cycles(graph) + umbrella_contents(graph) +
                compiled_contents(graph))
    return problems + (host_source_contents(graph, repo) if repo else [])


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include")
    repo = os.path.dirname(os.path.abspath(root))
    has_sources = os.path.isfile(os.path.join(repo, "CMakeLists.txt")) and os.path.isdir(os.path.join(repo, "src"))
    problems = check(root, repo if has_sources else None)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s); the order, lowest first: {' < '.join(LAYERS)}")
        return 1
    print(f"check_layers: every include goes down ({' < '.join(LAYERS)}), no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
