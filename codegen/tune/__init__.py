"""``python -m codegen tune``: measure a family's candidates on the GPUs at hand and write the
winners back into its spec.

    SpecTree --plan--> Plan --measure (one worker per GPU or shard)--> results files (JSON lines)
             results files --decide--> Verdicts --writeback--> spec TOML (tomlkit) --> build

``plan``: per bucket the incumbent and the candidates of the spec's space, each resolved and
checked by the compiler (a failing one is never launched), cut into chunks whose identity
depends only on the specs and arguments, so shards on many hosts agree.  ``measure``: the
family's harness runs correctness first, then GPU time in interleaved rounds; each chunk is
appended to the results file, so a killed tune resumes.  ``results``: that file's format and
merging.  ``decide``: winners from results alone (``tune`` and ``tune merge`` agree).
``writeback``: tomlkit edits with provenance; the result must build.  ``cli``: the commands.
Only ``measure`` (and the harness) needs torch; it is imported when timing starts.
"""
