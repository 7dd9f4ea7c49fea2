"""Hand-written runtime code that the generated modules import (as protobuf's generated code
imports its small runtime library).

What does not vary with the specs lives here as ordinary Python, read by linters and type
checkers: launch plans and argument checks, first-launch setup, shared ``@triton.jit`` bodies,
device detection.  What does vary (records, tables, kernels with their constants baked in) is
generated into ``generated/`` by ``python -m codegen build``.  Like the generated modules, this
package imports only the standard library, torch and triton, never the compiler.
"""
