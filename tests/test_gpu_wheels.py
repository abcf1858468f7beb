"""``benchmarks/gpu/wheels.sh install``: the fairseq wheels installed on a GPU machine whose python3 is a virtual
environment's (torch lives only there).  The ``python`` it makes must start that environment, not the base
interpreter behind it."""
import os
import subprocess
import sys
import zipfile

from tests.helpers import cli


def tiny_wheel(folder):
    """A one-module wheel (``wheels_probe``) with a console script, standing in for fairseq's."""
    path = folder / "wheels_probe-0.1-py3-none-any.whl"
    info = "wheels_probe-0.1.dist-info"
    files = {
        "wheels_probe.py": "def main():\n    print('probe ran')\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: wheels-probe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nwheels-probe = wheels_probe:main\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_installed_python_runs_the_virtual_environment_it_was_installed_from(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    tiny_wheel(wheels)
    prefix = tmp_path / "prefix"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert sys.prefix != sys.base_prefix, "the test suite runs in a virtual environment (make test's .venv)"
    for _ in range(2):  # a second install over the first (a device call repeated on a warm machine)
        proc = subprocess.run(["bash", os.path.join(cli.ROOT, "benchmarks/gpu/wheels.sh"), "install", str(wheels),
                               str(prefix)], env=env, capture_output=True, text=True, cwd=cli.ROOT)
        assert proc.returncode == 0, proc.stderr
    exports = dict(part.split("=", 1) for part in proc.stdout.split()[1:])
    assert exports["PYTHON"] == str(prefix / "bin" / "python")
    run_env = dict(env, PYTHONPATH=exports["PYTHONPATH"])
    probe = subprocess.run([exports["PYTHON"], "-c", "import sys, torch, wheels_probe; print(sys.prefix)"],
                           env=run_env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == sys.prefix  # the environment, with torch, not the base interpreter
    script = subprocess.run([str(prefix / "bin" / "wheels-probe")], env=run_env, capture_output=True, text=True)
    assert script.stdout.strip() == "probe ran", script.stderr
