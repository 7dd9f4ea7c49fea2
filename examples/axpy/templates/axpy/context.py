"""The axpy family's context file: what its template prints beyond the generic context.

codegen calls ``context(ctx)`` with the generic context (the dict documented in docs/templates.md)
and merges the dict it returns into it.  It runs at build time only: plain Python over plain data.
"""


def context(ctx):
    variant = ctx["configs"]["axpy"]["variants"]["axpy"]  # the default variant: the config's name
    kernels = []
    for inst in variant["instantiations"]:
        kernels.append(
            {
                "name": "_axpy_" + inst["suffix"].lower(),  # e.g. _axpy_nvidia80_5d1e2a
                "block_size": inst["record"]["block_size"],
                "num_warps": inst["record"]["num_warps"],
                "targets": inst["targets"],
                "origin": inst["origin"],
            }
        )
    # Targets whose resolved records are equal share an instantiation, hence a kernel.
    by_symbol = {inst["symbol"]: kernels[i] for i, inst in enumerate(variant["instantiations"])}
    table = [(target, by_symbol[symbol]) for target, symbol in variant["table"]]
    return {"kernels": kernels, "table": table}
