"""Command line: ``python -m codegen {build,check,show,explain,schema,tune}``.

``build`` renders everything in memory first and writes only files whose
bytes changed, all or nothing (see ``write.apply``); ``check`` writes nothing.
The exit codes are in ``EPILOG`` (what ``--help`` prints).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, TextIO

from .tune import args as tune_args
from .exitcodes import EXIT_INTERNAL, EXIT_INVALID, EXIT_IO, EXIT_OK, EXIT_STALE

if TYPE_CHECKING:
    from .pipeline import Output
    from .records import Resolution

# The compiler (pipeline, Pydantic's models, Jinja2) is imported in main, after a check whose
# result is remembered (check_cache) has returned without it.

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


DESCRIPTION = "Compile TOML specs of GPU targets and kernel policies into generated/ (Python and Triton)."
EPILOG = """exit codes:
  0  success; for check, generated/ (and schemas/) is current
  1  check only: stale (a diff per changed file, the missing and extra files, and the fix are printed)
  2  invalid specs or usage: one message per problem (file:line: key path: rule (got value)), no
     traceback, and nothing written; also a spec file or generated/ that cannot be read or written,
     or another build holding the tree's lock
  3  internal error (a bug in codegen or its packaged templates): traceback printed
  141  the reader of the output went away (codegen show | head): output ends quietly, as coreutils'
  130  interrupted (Ctrl-C): one line; build puts back what it had replaced

Without --root, the root is the current directory if it holds specs/, else this checkout's
(when codegen runs from one); the commands say which they used."""


def default_root() -> tuple[Path, str]:
    """The root to use without --root, and why (said on stderr)."""
    cwd = Path.cwd()
    if (cwd / "specs").is_dir():
        return cwd, "the current directory holds specs/"
    if (PACKAGE_ROOT / "specs").is_dir():
        return PACKAGE_ROOT, "codegen's own checkout (the current directory holds no specs/)"
    return cwd, "the current directory (it holds no specs/; pass --root)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="codegen", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--root", type=Path, default=None, help="project root holding specs/ (and templates/, generated/)")
    sub = p.add_subparsers(dest="command", required=True, metavar="{build,check,show,explain,schema,tune}")
    sub.add_parser("build", help="write generated/ and schemas/ from specs/ (only files whose bytes change)")
    sub.add_parser("check", help="exit 1 with a diff if generated/ or schemas/ is not what build would write")
    sub.add_parser("schema", help="write only schemas/: the JSON Schemas of the spec files, for editors")
    show = sub.add_parser("show", help="table of resolved policies per target and collapse groups")
    show.add_argument("kernel", nargs="?", help="a config or variant name (default: all)")
    show.add_argument("--hw", help="only this hardware spec name")
    show.add_argument(
        "--json", action="store_true", help="the resolved tree as JSON (every config, variant, model, target)"
    )
    show.add_argument("--sources", action="store_true", help="every hardware figure with the sources it cites")
    explain = sub.add_parser(
        "explain", help="why a field of a config has its value on a target: policy chain, rule, candidates, checks"
    )
    explain.add_argument("config", help="a config, variant or alias name")
    explain.add_argument("field", help="a field of its record")
    explain.add_argument("--hw", required=True, help="hardware spec name")
    explain.add_argument("--model", help="model spec name (default: the tree's default model)")
    tune_args.add_parser(sub)
    return p


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    result_cache: bool = False,
) -> int:
    """Run one command; ``result_cache``: ``check`` may answer from (and fills) ``check_cache``,
    as the ``codegen`` command does."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
        return int(exc.code or 0)
    if args.root is None:
        found, why = default_root()
        root = found.resolve()
        print(f"codegen: root {root} ({why})", file=err)
    else:
        root = args.root.resolve()
    digest = inputs = None
    if result_cache and args.command in ("check", "build"):
        from . import check_cache

        if args.command == "build":
            inputs = check_cache.fingerprint(root, outputs=False)
        else:
            remembered, digest = check_cache.lookup(root)
            if remembered is not None:
                out.write(remembered)
                return EXIT_OK
    from . import pipeline, write
    from .errors import SpecErrors, bounded

    try:
        if args.command == "tune":
            from .tune import cli as tune  # tomlkit, rich: only for this command

            return tune.run(args, root, list(argv if argv is not None else sys.argv[1:]), out, err)
        res = pipeline.run(root, until="tree_to_resolution")
        from . import explain  # show, explain and build's last lines

        if args.command == "show":
            try:  # every name an option gives exists, whichever form of show reads it
                explain.check_names(res, kernel=args.kernel, hw=args.hw)
                if args.sources and args.kernel is not None:
                    raise ValueError(
                        f"--sources lists hardware figures; it takes no kernel name (got {bounded(args.kernel)})"
                    )
            except ValueError as exc:
                print(f"codegen show: {exc}", file=err)
                return EXIT_INVALID
            if args.json:
                json.dump(explain.as_json(res, args.kernel, args.hw), out, indent=2, sort_keys=True)
                out.write("\n")
                return EXIT_OK
            if args.sources:
                out.write("\n".join(explain.sources(res.tree, args.hw)) + "\n")
                return EXIT_OK
            code = _show(res, args.kernel, args.hw, out, err)
            if code == EXIT_OK and args.kernel is None:
                _unmeasured(res, out)
            return code
        if args.command == "explain":
            try:
                lines = explain.explain(res, args.config, args.field, args.hw, args.model)
            except ValueError as exc:
                print(f"codegen explain: {exc}", file=err)
                return EXIT_INVALID
            out.write("\n".join(lines) + "\n")
            return EXIT_OK
        outs = pipeline.outputs(res, args.command)
        if args.command in ("build", "schema"):
            code = _build(outs, root, out)
            if args.command == "build":
                _unmeasured(res, out)
                if inputs is not None:
                    _remember_check(outs, root, inputs)
            return code
        if digest is None:
            return _check(outs, root, out)
        report = io.StringIO()
        code = _check(outs, root, report)
        out.write(report.getvalue())
        if code == EXIT_OK:
            check_cache.store(root, digest, report.getvalue())
        return code
    except SpecErrors as exc:
        n = len(exc.problems)
        print(f"codegen: {n} problem{'s' if n != 1 else ''} in the specs; generated/ was not changed:", file=err)
        for p in exc.problems:
            print(f"  {p.render()}", file=err)
        return EXIT_INVALID
    except write.OutputError as exc:
        print(f"codegen: {exc}", file=err)
        return EXIT_IO
    except BrokenPipeError:  # the reader went away: not a bug (run() ends quietly)
        raise
    except Exception:  # a bug, not bad input: say so, with the traceback
        print("codegen: internal error (please report):", file=err)
        traceback.print_exc(file=err)
        return EXIT_INTERNAL


# What a shell reports for a command that SIGPIPE ended (`yes | head`: 128 + 13), or SIGINT (128 + 2).
EXIT_CLOSED_PIPE, EXIT_INTERRUPTED = 141, 130


def run() -> int:
    """The ``codegen`` command (and ``python -m codegen``): ``main`` on this process's streams.
    A reader that closes the output early (``codegen show | head``) ends it quietly, as coreutils
    do: no traceback, exit 141; Ctrl-C says so in one line, exit 130 (build has put back what it
    had replaced by then)."""
    try:
        code = main(result_cache=True)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is the same closed pipe
        return code
    except KeyboardInterrupt:
        print("codegen: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at the null device so that finds nothing to say.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_CLOSED_PIPE


def _unmeasured(res: Resolution, out: TextIO) -> None:
    """One line per config naming the targets no measured policy serves (base, tuned = false)."""
    from . import explain

    for line in explain.unmeasured(res) + explain.unserved(res):
        print(line, file=out)


def _build(outs: list[Output], root: Path, out: TextIO) -> int:
    from . import pipeline

    pipeline.report(pipeline.build(root, outs), out)
    return EXIT_OK


def _remember_check(outs: list[Output], root: Path, inputs: str) -> None:
    """After a build, the check of what it wrote (stamps and hashes: no rendering), remembered
    when it passes and the inputs are still those the build read."""
    from . import check_cache

    digest = check_cache.fingerprint(root)
    report = io.StringIO()
    if _check(outs, root, report) == EXIT_OK and check_cache.fingerprint(root, outputs=False) == inputs:
        check_cache.store(root, digest, report.getvalue())


def _check(outs: list[Output], root: Path, out: TextIO) -> int:
    from . import write

    stale = 0
    for o in outs:
        plan = write.plan(o.rendered, root / o.folder, o.is_ours)
        if not plan.stale:
            print(f"{o.folder}/ is up to date ({len(plan.unchanged)} files)", file=out)
            continue
        for change in plan.changes:
            if change.kind == "create":
                print(f"missing: {o.folder}/{change.path}", file=out)
            elif change.kind == "delete":
                print(f"extra (orphan, carries the marker): {o.folder}/{change.path}", file=out)
            else:
                print(f"stale: {o.folder}/{change.path}", file=out)
            out.write(write.diff(change, o.folder))
        n = len(plan.changes)
        stale += n
        print(
            f"{o.folder}/ is stale ({n} file{'s' if n != 1 else ''}); run `python -m codegen build` to update", file=out
        )
    return EXIT_STALE if stale else EXIT_OK


# ---------------------------------------------------------------------------
# show


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _show(res: Resolution, kernel: str | None, hw: str | None, out: TextIO, err: TextIO) -> int:
    tree = res.tree
    names = {hw_.name for hw_ in tree.hardware}
    if hw is not None and hw not in names:
        print(f"codegen show: unknown hardware {hw!r}; known: {', '.join(sorted(names))}", file=err)
        return EXIT_INVALID
    variants = [
        v
        for v in res.variants
        if kernel is None or kernel in (v.config.name, v.variant) or v.config.aliases.get(kernel) == v.variant
    ]
    if not variants:
        known = sorted({v.config.name for v in res.variants} | {v.variant for v in res.variants})
        print(f"codegen show: unknown kernel {kernel!r}; known: {', '.join(known)}", file=err)
        return EXIT_INVALID
    archs = {h.name: (h.spec.vendor, h.spec.arch) for h in tree.hardware}
    blocks = []
    for vr in variants:
        cfg = vr.config
        src = cfg.source
        params = ", ".join(f"{k}={v!r}" for k, v in sorted(vr.params.items()))
        model = f"; model {vr.model}" if vr.model is not None else ""
        title = f"== {vr.variant} ({cfg.record}, {src.path}{'; ' + params if params else ''}{model}) =="
        targets = [t for t in vr.resolved if hw is None or t == hw]
        rows = [["target", "vendor", "arch", "policy (file:line)", "instantiation"]]
        for t in targets:
            pol = vr.resolved[t].policy
            rows.append(
                [
                    t,
                    archs[t][0],
                    str(archs[t][1]),
                    f"{pol.label} ({src.where(pol.keypath)})",
                    vr.target_instantiation[t],
                ]
            )
        insts = [i for i in vr.instantiations if any(t in i.targets for t in targets)]
        lines = [
            title,
            _table(rows),
            "",
            "instantiations (targets with equal records share one; the group's lowest arch in brackets):",
        ]
        lines += [f"  {i.suffix} [{i.vendor} {i.arch}]: {', '.join(i.targets)}" for i in insts]
        lacking = [f"{t} (no {', '.join(m)})" for t, m in vr.unserved.items() if hw is None or t == hw]
        if lacking:
            lines.append(f"not served (requires {', '.join(cfg.requires)}): {', '.join(lacking)}")
        lines.append("")
        if cfg.bucketed:
            for inst in insts:
                assert inst.value.buckets is not None
                lines.append(f"{inst.suffix} buckets (first match wins):")
                fields = list(cfg.fields)
                brows = [["bucket", "bounds"] + fields]
                for b in inst.value.buckets:
                    bounds = " ".join(f"{x.dim}{'<=' if x.kind == 'max' else '>='}{x.value}" for x in b.bounds) or "any"
                    brows.append([b.name, bounds] + [str(v) for _, v in b.record])
                lines += [_table(brows), ""]
        else:
            frows = [["field"] + [i.suffix for i in insts]]
            for j, fname in enumerate(cfg.fields):
                frows.append([fname] + [repr(i.value.record[j][1]) for i in insts])  # type: ignore[index]
            lines += [_table(frows), ""]
        blocks.append("\n".join(lines))
    if kernel is None:
        defaults = tree.project
        lines = ["== models =="]
        for name, m in tree.models.items():
            serves = sorted({v.config.name for v in res.variants if v.model == name})
            mark = " (default)" if name == defaults.default_model else ""
            lines.append(
                f"  {name}{mark}: {m.spec.display_name} ({m.source.path}); configs: {', '.join(serves) or 'none'}"
            )
        lines.append(f"default target: {defaults.default_target or 'none (detect the device)'}")
        blocks.append("\n".join(lines) + "\n")
    out.write("\n".join(blocks))
    return EXIT_OK
