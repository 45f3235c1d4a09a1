"""Build script; metadata and dependencies live in setup.cfg.

The build also puts `tf_mpt-startup.pth` into site-packages: Python runs its one line at
start-up, which does nothing unless a TF_MPT_ENABLE-type variable is set (no TensorFlow
import otherwise). That is what makes `TF_MPT_ENABLE=1 python script.py` work.
"""

import os

import setuptools
from setuptools.command import build_py

PTH = "tf_mpt-startup.pth"


class BuildPyWithStartupHook(build_py.build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH),
                       os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setuptools.setup(cmdclass={"build_py": BuildPyWithStartupHook})
