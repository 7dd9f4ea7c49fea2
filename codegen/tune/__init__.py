"""``python -m codegen tune``: measure a family's candidates on the GPUs at hand and write the
winners back into its spec.

Stages, each a module named by its job (as the compiler's own stages in ``codegen/pipeline.py``):

    SpecTree --plan--> Plan --measure (one worker per GPU or shard)--> results files (JSON lines)
             results files --decide--> Verdicts --writeback--> spec TOML (tomlkit) --> build

* ``plan``: the family's ``[<config>.tune]`` declaration, the target's policy and the shapes
  give, per bucket, the incumbent and the candidates of the search space, each resolved and
  checked by the compiler itself; a candidate that fails a check is never launched.  Candidates
  are cut into chunks; a chunk's identity (and the plan's fingerprint) depends on nothing but
  the specs and the arguments, so shards on many hosts agree on it.
* ``measure``: runs a shard's chunks through the family's harness (ordinary Python named by
  the spec, e.g. ``policy_runtime.matmul_tune:HARNESS``): correctness first, then GPU time in
  interleaved rounds with the incumbent (twice, for the spread) and the library.  Each finished
  chunk is appended to the shard's results file, so a killed tune resumes.
* ``results``: the results file format, reading, resuming and merging.
* ``decide``: winners from results alone (so ``tune`` and ``tune merge`` of the same results
  decide the same): a winner must beat the incumbent by more than the measured spread.
* ``writeback``: the winners into the spec with tomlkit, every other byte kept, each change
  with a provenance table; the result must build.
* ``cli``: the ``tune`` and ``tune merge`` commands, workers per GPU, progress and summary.

Only ``measure`` (and the harness it imports) needs torch; it is imported when timing starts.
"""
