"""Build script; metadata and dependencies live in setup.cfg."""

import setuptools

setuptools.setup()
