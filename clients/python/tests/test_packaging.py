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

    def test_readme_recipe_in_venv_without_wheel(self):
        # A fresh venv of python.org's, pyenv's or conda's Python has pip
        # (and before 3.12 setuptools) but no `wheel`: the README's
        # `--no-build-isolation` recipe failed there with "invalid command
        # 'bdist_wheel'". The in-tree backend needs neither.
        with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        venv_cmd, pip_cmd = "python3 -m venv .venv", ".venv/bin/pip install --no-build-isolation --no-deps ./clients/python"
        self.assertIn(venv_cmd, readme)
        self.assertIn(pip_cmd, readme)
        tmp = tempfile.mkdtemp(prefix="arbor-env-venv-")
        try:
            r = subprocess.run([sys.executable, "-m", "venv", os.path.join(tmp, ".venv")], capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise unittest.SkipTest("no venv with pip for %s (Debian: python3-venv): %s" % (sys.executable, r.stderr.strip()[-200:]))
            vpy = os.path.join(tmp, ".venv", "bin", "python")
            self.assertNotEqual(subprocess.run([vpy, "-c", "import wheel"], capture_output=True).returncode, 0,
                                "the fresh venv has wheel: it would not show the bdist_wheel failure")
            src = os.path.join(tmp, "clients", "python")
            shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
            # The README's command, offline (--no-index).
            r = subprocess.run(pip_cmd.split() + ["--no-index"], capture_output=True, text=True, cwd=tmp, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([vpy, "-c", "import importlib.metadata as m, importlib.util as u; "
                                "print(m.version('arbor-env'), u.find_spec('arbor_env').origin)"],
                               capture_output=True, text=True, cwd=tmp, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            version, origin = r.stdout.split()
            with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
                self.assertIn('version = "%s"' % version, f.read())
            self.assertTrue(origin.startswith(os.path.join(tmp, ".venv")), origin)
            self.assertTrue(os.path.isfile(os.path.join(os.path.dirname(origin), "py.typed")))

            # The backend's other builds: an sdist (installed from, offline)
            # and an editable install (the venv imports the source tree).
            where = "import importlib.util as u; print(u.find_spec('arbor_env').origin)"
            r = subprocess.run([vpy, "-c", "import sys; sys.path.insert(0, %r); import arbor_build as b; print(b.build_sdist(%r))"
                                % (os.path.join(src, "_build"), tmp)], capture_output=True, text=True, cwd=tmp, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            sdist = os.path.join(tmp, r.stdout.strip())
            r = subprocess.run([os.path.join(tmp, ".venv", "bin", "pip"), "install", "--no-build-isolation", "--no-deps", "--no-index",
                                "--force-reinstall", sdist], capture_output=True, text=True, cwd=tmp, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([vpy, "-c", where], capture_output=True, text=True, cwd=tmp, timeout=60)
            self.assertTrue(r.stdout.strip().startswith(os.path.join(tmp, ".venv")), r.stdout + r.stderr)
            r = subprocess.run([os.path.join(tmp, ".venv", "bin", "pip"), "install", "--no-build-isolation", "--no-deps", "--no-index",
                                "-e", src], capture_output=True, text=True, cwd=tmp, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([vpy, "-c", where], capture_output=True, text=True, cwd=tmp, timeout=60)
            self.assertEqual(r.stdout.strip(), os.path.join(src, "arbor_env", "__init__.py"), r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
