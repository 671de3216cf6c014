"""The build backend of arbor-env (PEP 517, with PEP 660 editable installs).

arbor-env is pure Python: one package directory and its py.typed. A build
backend of the standard library alone builds it with any Python 3.9 and pip,
offline and without setuptools or wheel: setuptools before 70.1 needs the
separate `wheel` package for bdist_wheel, which a python.org, pyenv or
conda Python's fresh venv lacks (`invalid command 'bdist_wheel'` with
`pip install --no-build-isolation`). The metadata comes from
pyproject.toml's [project] table, read with the few rules that table uses
here (no TOML parser before Python 3.11).
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "arbor_env"


def _project():
    """name, version, description, requires-python and dependencies from
    pyproject.toml's [project] table."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if m is None:
        raise RuntimeError("pyproject.toml has no [project] table")
    table = m.group(1)

    def string(key):
        km = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), table, re.M)
        if km is None:
            raise RuntimeError("pyproject.toml: [project] has no %s" % key)
        return km.group(1)

    dm = re.search(r"^dependencies\s*=\s*\[(.*?)\]", table, re.M | re.S)
    deps = re.findall(r'"([^"]+)"', dm.group(1)) if dm else []
    return {"name": string("name"), "version": string("version"), "description": string("description"),
            "requires-python": string("requires-python"), "dependencies": deps}


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"],
             "Summary: %s" % p["description"], "Requires-Python: %s" % p["requires-python"]]
    lines += ["Requires-Dist: %s" % d for d in p["dependencies"]]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    lines += ["Description-Content-Type: text/markdown", "", readme]
    return "\n".join(lines) + "\n"


def _dist_info():
    p = _project()
    return "%s-%s.dist-info" % (p["name"].replace("-", "_"), p["version"])


WHEEL = "Wheel-Version: 1.0\nGenerator: arbor_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files():
    pkg = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            yield "%s/%s" % (PACKAGE, name), os.path.join(pkg, name)


def _write_wheel(directory, files):
    """Writes a wheel of files ([(archive name, bytes)]) plus its
    dist-info; returns its file name."""
    info = _dist_info()
    name = "%s-py3-none-any.whl" % info[:-len(".dist-info")]
    files = list(files) + [("%s/METADATA" % info, _metadata().encode()), ("%s/WHEEL" % info, WHEEL.encode())]
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
        record.append("%s/RECORD,," % info)
        z.writestr("%s/RECORD" % info, "\n".join(record) + "\n")
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = _dist_info()
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(metadata_directory, info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(WHEEL)
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(arc, _read(path)) for arc, path in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source directory on sys.path.
    return _write_wheel(wheel_directory, [("%s.pth" % PACKAGE, (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = "%s-%s" % (p["name"].replace("-", "_"), p["version"])
    name = base + ".tar.gz"
    members = ["pyproject.toml", "README.md", "_build/arbor_build.py"] + [arc for arc, _ in _package_files()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in members:
            t.add(os.path.join(ROOT, rel), arcname="%s/%s" % (base, rel), recursive=False)
        pkg_info = _metadata().encode()
        ti = tarfile.TarInfo("%s/PKG-INFO" % base)
        ti.size = len(pkg_info)
        ti.mode = 0o644
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
