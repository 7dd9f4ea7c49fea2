"""codegen: compiles TOML specs of GPU targets and kernel policies into static Python dispatch
modules and specialized Triton kernels under generated/.

Run ``python -m codegen --help``.  Stages: see ``codegen.pipeline``.
"""

__version__ = "0.1.0"
