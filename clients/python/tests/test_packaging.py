"""Packaging: the distribution installs as `arbor_env` with py.typed, and
the examples run from the installed package (no sys.path tricks)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


class PackagingTest(unittest.TestCase):
    def test_install_and_examples(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            raise unittest.SkipTest("no pip for %s (Debian: python3-pip)" % sys.executable)
        tmp = tempfile.mkdtemp(prefix="arbor-env-pkg-")
        try:
            src = os.path.join(tmp, "src")
            shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
            target = os.path.join(tmp, "site")
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                                "--no-index", "--target", target, src], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertTrue(os.path.isfile(os.path.join(target, "arbor_env", "py.typed")))
            self.assertFalse(os.path.exists(os.path.join(target, "arbor")), "installs a top-level `arbor`")
            env = dict(os.environ, PYTHONPATH=target, PYTHONDONTWRITEBYTECODE="1")
            # The OpenEnv sandbox backend is duck-typed: it imports no openenv.
            r = subprocess.run([sys.executable, "-c", "import arbor_env, arbor_env.sandbox, sys; assert not [m for m in sys.modules if m.startswith('openenv')]; "
                                "print(arbor_env.__file__, arbor_env.__version__)"],
                               capture_output=True, text=True, cwd=tmp, env=env, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(target), r.stdout)
            for ex in ("tree_grpo.py", "draft_verify.py"):
                r = subprocess.run([sys.executable, os.path.join(src, "examples", ex), "--help"],
                                   capture_output=True, text=True, cwd=tmp, env=env, timeout=60)
                self.assertEqual(r.returncode, 0, "%s: %s" % (ex, r.stderr))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
