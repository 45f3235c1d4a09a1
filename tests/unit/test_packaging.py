"""setup.cfg's Python range is the one TensorFlow 2.21's CPU wheels allow (CPython 3.10-3.13,
Linux x86-64), its classifiers say the same, and the README names that range."""

import configparser
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
WHEEL_PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def _setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return parser


def test_python_requires_and_classifiers_are_the_wheels_range():
    cfg = _setup_cfg()
    assert cfg["options"]["python_requires"].replace(" ", "") == ">=3.10,<3.14"
    classifiers = cfg["metadata"]["classifiers"].split("\n")
    versions = tuple(c.rsplit(":: ", 1)[1] for c in classifiers
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c.strip()))
    assert versions == WHEEL_PYTHONS
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert cfg["options.extras_require"]["cpu"].split() == ["tensorflow-cpu==2.21.*"]


def test_the_readme_names_the_same_range():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    assert f"Python {WHEEL_PYTHONS[0]}-{WHEEL_PYTHONS[-1]} on Linux x86-64" in text
