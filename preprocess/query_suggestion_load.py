"""Loads one of ``user_dir/modules/*.py`` on its own, so the preprocessing scripts start (and report input
errors) without importing fairseq through the ``user_dir`` package."""
import importlib.util
import os

MODULES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "user_dir", "modules")


def load_module(name):
    spec = importlib.util.spec_from_file_location(f"user_dir_modules_{name}", os.path.join(MODULES, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
