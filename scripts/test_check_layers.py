"""Tests of check_layers.py on made-up header trees: python3 -m unittest discover -s scripts -p 'test_*.py'."""

import os
import tempfile
import unittest

import check_layers

UMBRELLAS = {
    "core.hpp": '#include "xgrad/ops/add.hpp"\n',
    "jit.hpp": '#include "xgrad/core.hpp"\n',
    "nn.hpp": '#include "xgrad/jit.hpp"\n',
    "data.hpp": '#include "xgrad/data/idx.hpp"\n',
    "distributed.hpp": '#include "xgrad/core.hpp"\n',
    "xgrad.hpp": '#include "xgrad/nn.hpp"\n#include "xgrad/data.hpp"\n',
}


def tree(files):
    """A temporary include/ folder holding the umbrellas, a clean layered tree, and `files`."""
    root = tempfile.mkdtemp()
    base = {
        "core/tensor.hpp": "#include <memory>\n",
        "ops/add.hpp": '#include "xgrad/core/tensor.hpp"\n',
        "data/idx.hpp": '#include <zlib.h>\n#include "xgrad/core/tensor.hpp"\n',
    }
    base.update({k: v for k, v in UMBRELLAS.items()})
    base.update(files)
    for name, text in base.items():
        path = os.path.join(root, "xgrad", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return root


class CheckLayers(unittest.TestCase):
    def test_clean_tree_passes(self):
        self.assertEqual(check_layers.check(tree({})), [])

    def test_include_from_a_higher_layer_is_named(self):
        problems = check_layers.check(tree({"core/tensor.hpp": '#include "xgrad/ops/add.hpp"\n'}))
        self.assertIn("xgrad/core/tensor.hpp: includes xgrad/ops/add.hpp, which is in layer 'ops' above 'core'",
                      problems)

    def test_cycle_inside_a_folder_is_named(self):
        problems = check_layers.check(tree({
            "core/a.hpp": '#include "xgrad/core/b.hpp"\n',
            "core/b.hpp": '#include "xgrad/core/a.hpp"\n'}))
        self.assertIn("include cycle: xgrad/core/a.hpp -> xgrad/core/b.hpp -> xgrad/core/a.hpp", problems)

    def test_definitions_file_includes_its_header_but_no_one_else_includes_it(self):
        self.assertEqual(check_layers.check(tree({
            "ops/add.hpp": '#include "xgrad/core/tensor.hpp"\n#include "xgrad/ops/add-inl.hpp"\n',
            "ops/add-inl.hpp": '#include "xgrad/ops/add.hpp"\n'})), [])
        problems = check_layers.check(tree({
            "ops/add-inl.hpp": '#include "xgrad/ops/add.hpp"\n',
            "ops/mul.hpp": '#include "xgrad/ops/add-inl.hpp"\n'}))
        self.assertIn("xgrad/ops/mul.hpp: includes xgrad/ops/add-inl.hpp, which only its own header and other "
                      "definitions (-inl.hpp) files may include", problems)

    def test_definitions_may_include_definitions_of_their_layer_and_below(self):
        add = {"ops/add.hpp": '#include "xgrad/core/tensor.hpp"\n#include "xgrad/ops/add-inl.hpp"\n',
               "ops/add-inl.hpp": '#include "xgrad/ops/add.hpp"\n'}
        self.assertEqual(check_layers.check(tree({
            **add,
            "ops/mul.hpp": '#include "xgrad/ops/mul-inl.hpp"\n',
            "ops/mul-inl.hpp": '#include "xgrad/ops/mul.hpp"\n#include "xgrad/ops/add-inl.hpp"\n',
            "passes/fuse.hpp": '#include "xgrad/passes/fuse-inl.hpp"\n',
            "passes/fuse-inl.hpp": '#include "xgrad/passes/fuse.hpp"\n#include "xgrad/ops/add-inl.hpp"\n'})), [])
        # Still downwards only.
        problems = check_layers.check(tree({
            **add,
            "core/shape.hpp": '#include "xgrad/core/shape-inl.hpp"\n',
            "core/shape-inl.hpp": '#include "xgrad/core/shape.hpp"\n#include "xgrad/ops/add-inl.hpp"\n'}))
        self.assertIn("xgrad/core/shape-inl.hpp: includes xgrad/ops/add-inl.hpp, which is in layer 'ops' above 'core'",
                      problems)

    def test_compiled_mode_umbrella_reaching_the_backend_is_named(self):
        kernels = {"backend/kernels.hpp": '#include <xsimd/xsimd.hpp>\n'}
        # Through the definitions only: compiled mode leaves them out.
        self.assertEqual(check_layers.check(tree({
            **kernels,
            "ops/add.hpp": '#include "xgrad/core/tensor.hpp"\n#include "xgrad/ops/add-inl.hpp"\n',
            "ops/add-inl.hpp": '#include "xgrad/ops/add.hpp"\n#include "xgrad/backend/kernels.hpp"\n'})), [])
        problems = check_layers.check(tree({**kernels, "ops/add.hpp": '#include "xgrad/backend/kernels.hpp"\n'}))
        self.assertIn("xgrad/core.hpp: pulls in xgrad/backend/kernels.hpp in compiled mode; only definitions "
                      "(-inl.hpp) may", problems)
        self.assertIn("xgrad/core.hpp: pulls in <xsimd/xsimd.hpp> in compiled mode; only definitions (-inl.hpp) may",
                      problems)

    def test_unknown_folder_and_missing_header_are_named(self):
        problems = check_layers.check(tree({"extra/x.hpp": "", "ops/mul.hpp": '#include "xgrad/ops/none.hpp"\n'}))
        self.assertTrue(any("folder 'extra' is not in the layer order" in p for p in problems))
        self.assertIn("xgrad/ops/mul.hpp: includes xgrad/ops/none.hpp, which does not exist", problems)

    def test_umbrella_pulling_a_file_format_is_named(self):
        problems = check_layers.check(tree({"ops/add.hpp": '#include "xgrad/core/tensor.hpp"\n#include <zlib.h>\n'}))
        self.assertIn("xgrad/core.hpp: pulls in <zlib.h>, which it should not", problems)

    def test_umbrella_pulling_a_layer_above_it_is_named(self):
        problems = check_layers.check(tree({"data.hpp": '#include "xgrad/nn.hpp"\n'}))
        self.assertTrue(any(p.startswith("xgrad/data.hpp: pulls in xgrad/") for p in problems))

    def test_host_source_reaching_thrust_is_named_with_its_chain(self):
        root = tree({
            "backend/thrust/k.hpp": "#include <thrust/for_each.h>\n",
            "backend/run.hpp": '#include "xgrad/backend/thrust/k.hpp"\n',
            # Compiled mode: ops/op.hpp reaches its definitions, and so Thrust, only header-only.
            "ops/op.hpp": '#include "xgrad/ops/op-inl.hpp"\n',
            "ops/op-inl.hpp": '#include "xgrad/ops/op.hpp"\n#include "xgrad/backend/run.hpp"\n'})
        repo = tempfile.mkdtemp()
        sources = {"CMakeLists.txt": "xgrad_device_sources(xgrad_compiled src/device.cpp\n  src/other.cpp)\n",
                   "src/device.cpp": '#include "xgrad/ops/op-inl.hpp"\n',
                   "src/host.cpp": '#include "xgrad/ops/op-inl.hpp"\n',
                   "src/declarations.cpp": '#include "xgrad/ops/op.hpp"\n'}
        for name, text in sources.items():
            os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
            with open(os.path.join(repo, name), "w", encoding="utf-8") as f:
                f.write(text)
        problems = check_layers.check(root, repo)
        self.assertEqual(len(problems), 1, problems)
        self.assertTrue(problems[0].startswith("src/host.cpp: reaches Thrust through xgrad/ops/op-inl.hpp -> "
                                               "xgrad/backend/run.hpp -> xgrad/backend/thrust/k.hpp;"), problems)
        self.assertEqual(check_layers.check(root), [])  # without the sources: the headers alone are fine


if __name__ == "__main__":
    unittest.main()
